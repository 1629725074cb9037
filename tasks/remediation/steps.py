"""The remediation steps: isolate, fail over, reserve, checkpoint, migrate, and rollbacks.

Each step is safe to run again (a task retry, a second delivery of the same event): it
reads the world first and does only what is still missing. The order, and why:

1. isolate  - cordon first, so the device a job is leaving cannot be handed out again
               (not even to the job it is leaving) once its lease is released;
2. fail over - promote spare nodes while free capacity of the SKU is short of the jobs
               to move (plus a reserve);
3. reserve  - lease each job's target before stopping it, so a stopped job always has
               somewhere to go; a job with no target is not stopped: on a device that
               still works it checkpoints in place and keeps running;
4. checkpoint - checkpoint-and-stop through the control channel; on timeout (or a dead
               device) the job's last periodic checkpoint, and the old process is fenced
               (its lease taken away, so its next renewal fails);
5. migrate  - relaunch from that checkpoint on the reserved target; if that fails the job
               stays checkpointed and queued.

No Prefect here; the task wrappers are at the bottom.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import Backend, DeviceLostError, HardwareError, InvalidRequestError
from gpuflow.hardware.health import health_status
from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    ControlTimeoutError,
    DeviceRecord,
    Inventory,
    JobState,
)
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.devices import DeviceRef, JobOnDevice, parse_device_ref
from gpuflow.tasks.remediation.launch import (
    CrashHandler,
    LaunchError,
    relaunch,
    storage_from_record,
)
from gpuflow.tasks.remediation.notify import send_task, summary
from gpuflow.tasks.remediation.targets import (
    Reservation,
    held_placement,
    release_reservation,
    reserve_target,
    still_held,
)
from gpuflow.tasks.training.storage import open_store
from prefect import task
from prefect.blocks.notifications import NotificationBlock
from prefect.cache_policies import NONE
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

CORDON_TAG = "gpuflow-remediate"
CHECKPOINT_AND_STOP = "checkpoint-and-stop"
CHECKPOINT_NOW = "checkpoint-now"
_STEP = re.compile(r"step-(\d+)$")


class RemediationPolicy(BaseModel):
    """How remediation behaves; the defaults suit a training fleet."""

    isolate: Literal["device", "node"] = Field(
        default="device",
        description="Cordon the device, or its whole node (the other jobs there finish in place).",
    )
    checkpoint_timeout_s: float = Field(
        default=120.0, gt=0, description="How long a job gets to answer checkpoint-and-stop."
    )
    lost_device_grace_s: float = Field(
        default=5.0, ge=0, description="The same, when its device no longer answers."
    )
    release_grace_s: float = Field(
        default=30.0, ge=0, description="After its checkpoint, how long a job gets to let go."
    )
    spare_reserve: int = Field(
        default=0, ge=0, description="Free devices of the SKU to keep beyond the jobs moved."
    )
    use_spares: bool = Field(default=True, description="Promote spare nodes when short.")


# -- resolving --------------------------------------------------------------------------


def device_ref_from(device: str | None, resource_id: str | None) -> DeviceRef:
    """The device named by ``device`` (NODE:INDEX) and/or an event's ``resource_id``."""
    if device is None and resource_id is None:
        raise InvalidRequestError("say which device: device='NODE:INDEX' or an event resource id")
    refs = [parse_device_ref(v) for v in (device, resource_id) if v is not None]
    if len(refs) == 2 and refs[0] != refs[1]:
        raise InvalidRequestError(
            f"device {device!r} and resource id {resource_id!r} name different devices"
        )
    return refs[0]


def resolve_device(inventory: Inventory, backend: Backend, ref: DeviceRef) -> DeviceRecord:
    """The inventory's record of the device, after a refresh from the backend.

    The refresh matters for the reactive path: a device that fell off the bus is marked
    not present. A refresh that fails is logged, not fatal: the inventory is still right
    about which devices exist. An unknown device raises InvalidRequestError.
    """
    try:
        report = inventory.sync(backend)
        for err in report.errors:
            log.warning("inventory refresh: %s", err)
    except HardwareError as exc:
        log.warning("inventory refresh failed (%s); using what the inventory has", exc)
    return inventory.device(ref.node, ref.index)


def device_condition(backend: Backend, device: DeviceRecord) -> dict[str, Any]:
    """What the device says now: present?, the threshold rules' level and reasons."""
    try:
        sample = backend.telemetry(device.node, device.index)
    except DeviceLostError as exc:
        return {"present": False, "level": "lost", "reasons": [str(exc)]}
    except HardwareError as exc:
        return {"present": device.present, "level": "unknown", "reasons": [str(exc)]}
    status = health_status(sample)
    return {"present": sample.present, "level": status.level, "reasons": list(status.reasons)}


# -- isolate ----------------------------------------------------------------------------


def isolate(
    inventory: Inventory,
    device: DeviceRecord,
    policy: RemediationPolicy,
    incident_id: str,
    reason: str,
) -> dict[str, Any]:
    """Cordon the device (or its node). An existing cordon is kept as it is (an operator's
    reason is not overwritten) and is not ours to undo later."""
    index = None if policy.isolate == "node" else device.index
    target = device.node if index is None else f"{device.node}:{device.index}"
    mine = f"{CORDON_TAG} {incident_id}"
    for c in inventory.cordons():
        if c.node == device.node and c.index == index:
            return {
                "target": target,
                "scope": policy.isolate,
                "created": mine in c.reason,
                "reason": c.reason,
            }
    text = f"{mine}: {reason}" if reason else mine
    inventory.cordon(device.node, index, text)
    return {"target": target, "scope": policy.isolate, "created": True, "reason": text}


def undo_isolation(inventory: Inventory, device: DeviceRecord, isolation: dict[str, Any]) -> bool:
    """Lift the cordon this incident made; True if one was lifted."""
    if not isolation.get("created"):
        return False
    index = None if isolation.get("scope") == "node" else device.index
    return inventory.uncordon(device.node, index)


# -- fail over --------------------------------------------------------------------------


def _need_key(job: JobOnDevice) -> tuple[str, str, str | None]:
    return (job.sku, job.kind, job.profile)


def free_count(inventory: Inventory, sku: str, kind: str, profile: str | None) -> int:
    return len(inventory.free_resources(sku=sku, kind=kind, profile=profile))


def spare_offers(inventory: Inventory, node: str, sku: str, kind: str, profile: str | None) -> int:
    """How many resources of the kind a spare node would add (healthy, present devices)."""
    devices = [d for d in inventory.devices(node, present=True) if d.healthy and d.sku == sku]
    if kind == "device":
        parts = {p.device_uuid for p in inventory.partitions(node)}
        return sum(1 for d in devices if d.uuid not in parts)
    uuids = {d.uuid for d in devices}
    return sum(
        1
        for p in inventory.partitions(node)
        if p.device_uuid in uuids and p.kind == kind and (profile is None or p.profile == profile)
    )


def ensure_capacity(
    inventory: Inventory, jobs: list[JobOnDevice], policy: RemediationPolicy
) -> dict[str, Any]:
    """Promote spare nodes until every (SKU, kind, profile) the jobs need has enough free
    resources (plus ``spare_reserve``). Returns the nodes promoted and any shortfall."""
    needs: dict[tuple[str, str, str | None], int] = {}
    for job in jobs:  # a gang moves whole: it needs its N units
        needs[_need_key(job)] = needs.get(_need_key(job), 0) + job.gang_size
    promoted: list[str] = []
    short: dict[str, int] = {}
    for (sku, kind, profile), count in sorted(needs.items(), key=lambda kv: str(kv[0])):
        want = count + policy.spare_reserve
        have = free_count(inventory, sku, kind, profile)
        while have < want and policy.use_spares:
            offers = {
                n.name: spare_offers(inventory, n.name, sku, kind, profile)
                for n in inventory.spare_nodes()
            }
            offers = {name: n for name, n in offers.items() if n > 0}
            if not offers:
                break
            # The smallest spare that covers the gap, else the biggest: keep the rest spare.
            gap = want - have
            fits = [name for name, n in offers.items() if n >= gap]
            best = (
                min(fits, key=lambda name: (offers[name], name))
                if fits
                else max(offers, key=lambda name: (offers[name], name))
            )
            inventory.set_node_role(best, "active")
            promoted.append(best)
            have = free_count(inventory, sku, kind, profile)
        if have < count:
            label = sku if kind == "device" else f"{sku} {profile or kind}"
            short[label] = count - have
    return {"promoted": promoted, "short": short}


# -- checkpoint -------------------------------------------------------------------------


@dataclass
class CheckpointOutcome:
    job_id: str
    action: str
    how: str  # on-request | fallback | none
    checkpoint_id: str | None
    step: int | None
    waited_s: float
    detail: str = ""
    fenced: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def checkpoint_step(checkpoint_id: str | None) -> int | None:
    if not checkpoint_id:
        return None
    m = _STEP.search(checkpoint_id)
    return int(m.group(1)) if m else None


def last_periodic_checkpoint(inventory: Inventory, job: JobOnDevice) -> str | None:
    """The job's newest committed checkpoint: from its store when we know the store (the
    truth), else what the jobs registry last heard."""
    if job.launch and job.launch.get("storage"):
        from gpuflow.tasks.training.checkpoint import CheckpointManager

        try:
            store = open_store(storage_from_record(job.launch["storage"]))
            found = CheckpointManager(store, job.job_id).list()
            if found:
                return found[-1].checkpoint_id
        except Exception as exc:  # noqa: BLE001 - fall back to the registry
            log.warning("job %s: checkpoint store unreadable (%s)", job.job_id, exc)
    return inventory.job(job.job_id).last_checkpoint_id


def wait_for_release(
    inventory: Inventory, job_id: str, resource_ids: tuple[str, ...], timeout_s: float
) -> bool:
    """Wait until ``job_id`` holds none of ``resource_ids``; True if it let go."""
    deadline = time.monotonic() + timeout_s
    while True:
        leases = [inventory.lease(r) for r in resource_ids]
        if all(lease is None or lease.owner != job_id for lease in leases):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def checkpoint_job(
    inventory: Inventory,
    job: JobOnDevice,
    *,
    device_present: bool,
    policy: RemediationPolicy,
    action: str = CHECKPOINT_AND_STOP,
    incident_id: str | None = None,
) -> CheckpointOutcome:
    """Ask the job for a checkpoint (and stop); fall back to its last periodic one.

    Only a job that still holds its lease can answer; a dead device gets a short grace.
    After checkpoint-and-stop the job is "queued" with that checkpoint, marked for this
    device, so a failure further on never loses it.
    """
    started = time.monotonic()
    outcome = CheckpointOutcome(job.job_id, action, "none", None, None, 0.0)
    request_id: int | None = None
    marker = {
        "device_uuid": _device_uuid_of(inventory, job),
        "incident": incident_id,
        "cause": "remediation",
    }
    if job.holds_lease and action != CHECKPOINT_NOW:
        # Marked first: should this run die while the job stops, whoever takes the incident
        # over still finds the stopped job as this device's to move (devices.jobs_on_device).
        current = inventory.job(job.job_id)
        inventory.transition_job(job.job_id, expect_attempt=current.attempt, remediation=marker)
    if job.holds_lease:
        timeout = policy.checkpoint_timeout_s if device_present else policy.lost_device_grace_s
        request_id = inventory.request_control(job.job_id, action)
        try:
            ack = inventory.wait_for_ack(request_id, timeout)
            outcome.how, outcome.checkpoint_id = "on-request", ack.checkpoint_id
        except ControlTimeoutError:
            outcome.detail = f"no answer within {timeout:g} s"
    else:
        outcome.detail = "job not running (crashed or stopped): nothing to ask"

    if action == CHECKPOINT_NOW:
        if outcome.how != "on-request" and request_id is not None:
            # The job keeps running: leave the request, it answers when it can.
            outcome.detail += "; request left pending"
        outcome.waited_s = time.monotonic() - started
        outcome.step = checkpoint_step(outcome.checkpoint_id)
        return outcome

    if outcome.how == "on-request":
        if not wait_for_release(inventory, job.job_id, job.units, policy.release_grace_s):
            _fence(inventory, job)
            outcome.fenced = True
            outcome.detail = "checkpointed but did not let go: lease taken away"
    else:
        outcome.checkpoint_id = last_periodic_checkpoint(inventory, job)
        outcome.how = "fallback" if outcome.checkpoint_id else "none"
        if request_id is not None:
            # Answer the stale request ourselves, or the relaunched job (same id) would
            # find it pending and stop at its first step. First answer wins: if the job
            # answered meanwhile, that answer (a newer checkpoint) is what we get back.
            late = inventory.ack_control(request_id, outcome.checkpoint_id or "no-checkpoint")
            if late.checkpoint_id and late.checkpoint_id != (
                outcome.checkpoint_id or "no-checkpoint"
            ):
                outcome.how, outcome.checkpoint_id = "on-request", late.checkpoint_id
        if job.holds_lease:
            # Fence a process that may still run: its next lease renewal fails.
            outcome.fenced = _fence(inventory, job)
    outcome.step = checkpoint_step(outcome.checkpoint_id)
    inventory.requeue_job(
        job.job_id,
        "stopped" if outcome.how == "on-request" else "lost",  # it answered, or it is gone
        last_checkpoint_id=outcome.checkpoint_id,
        remediation={**marker, "checkpoint": outcome.checkpoint_id},
    )
    outcome.waited_s = time.monotonic() - started
    return outcome


def _fence(inventory: Inventory, job: JobOnDevice) -> bool:
    """Take every unit of the job away (a gang's too: its ranks stop together); True if
    it still held any."""
    released = [inventory.release_lease(rid, job.job_id) for rid in job.units]
    return any(released)


def _device_uuid_of(inventory: Inventory, job: JobOnDevice) -> str:
    return inventory.resource(job.resource_id).device_uuid


# -- migrate ----------------------------------------------------------------------------


@dataclass
class MigrateOutcome:
    job_id: str
    status: str  # resumed | queued | in-place | ended
    target: str | None = None  # node:index (rank 0's unit for a gang)
    resource_id: str | None = None
    checkpoint_id: str | None = None
    step: int | None = None
    launcher: dict[str, Any] = field(default_factory=dict)
    detail: str = ""
    resource_ids: list[str] = field(default_factory=list)  # every unit, rank 0's first

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    def landed(self, inventory: Inventory, resource_ids: Any) -> None:
        ids = list(resource_ids)
        res = inventory.resource(ids[0])
        self.target, self.resource_id = f"{res.node}:{res.device_index}", res.resource_id
        self.resource_ids = ids


def migrate_job(
    cluster: GpuCluster,
    job: JobOnDevice,
    checkpoint: CheckpointOutcome,
    reservation: Reservation | None,
    on_crash: CrashHandler | None = None,
) -> MigrateOutcome:
    """Relaunch the job from its checkpoint on the reserved target (or find one now); a
    gang relaunches whole, on its N reserved units.

    On any failure the job stays "queued" with its checkpoint and the leases are returned.
    """
    inventory = cluster.get_inventory()
    backend = cluster.get_backend()
    out = MigrateOutcome(
        job.job_id, "queued", checkpoint_id=checkpoint.checkpoint_id, step=checkpoint.step
    )
    current = inventory.job(job.job_id)
    if current.state in (JobState.FINISHED, JobState.FAILED):
        # It ended while we moved it (cancelled, or finished before it stopped): starting
        # it again would bring back a job its owner ended.
        release_reservation(inventory, job.job_id, reservation)
        out.status, out.detail = "ended", f"the job is {current.state} (ended meanwhile)"
        return out
    if current.state in ACTIVE_STATES and job.resource_id not in current.resource_ids:
        if reservation is not None and not set(reservation.resource_ids) <= set(
            current.resource_ids
        ):
            release_reservation(inventory, job.job_id, reservation)  # not needed
        if current.state != JobState.PLACED or not current.resource_ids:
            # An earlier attempt of remediation already relaunched it: nothing more to do.
            out.status = "resumed"
            if current.resource_ids:
                out.landed(inventory, current.resource_ids)
            out.detail = "already resumed"
            return out
        # Placed elsewhere meanwhile (a scheduling pass took the queued job) but not
        # started: start that placement. Whoever else starts it (the `schedule` flow) does
        # so under the same (job, attempt): one run.
        reservation = held_placement(inventory, backend, current.job_id, current.resource_ids)
    if not still_held(inventory, job.job_id, reservation):
        reservation = None  # a retry after the reservation was returned: reserve afresh
    if reservation is None:
        reservation = reserve_target(inventory, backend, job)
    if reservation is None:
        what = f"partition {job.profile}" if job.profile else "device"
        out.detail = (
            f"no healthy {job.sku} {what} free"
            if job.gang_size == 1
            else f"no node with {job.gang_size} healthy {job.sku} {what}s free for the gang"
        ) + _smaller_placement(current.spec)
        return out
    try:
        out.launcher = relaunch(job.job_id, job.launch, reservation, cluster, on_crash)
    except LaunchError as exc:
        release_reservation(inventory, job.job_id, reservation)
        out.detail = str(exc)
        return out
    except Exception:
        release_reservation(inventory, job.job_id, reservation)
        raise
    out.status = "resumed"
    out.landed(inventory, reservation.resource_ids)
    return out


def _smaller_placement(spec: dict[str, Any]) -> str:
    """What happens to a queued job with no target of its size: an elastic scheduled job
    (count below max_count) is placed again by the scheduler at any size it allows, so a
    gang may shrink, its sharded checkpoint resharding to the new world size."""
    request = spec.get("request") if isinstance(spec, dict) else None
    if not isinstance(request, dict):
        return ""
    low, high = request.get("count") or 1, request.get("max_count")
    if not high or high <= low:
        return ""
    return (
        f"; the scheduler places it again at {low} to {high} units (elastic), resharding "
        "its checkpoint"
    )


# -- the ledger's part --------------------------------------------------------------------


def open_incident(
    ledger: L.Ledger,
    inventory: Inventory,
    device: DeviceRecord,
    *,
    trigger: str,
    reason: str,
    risk: float | None,
    features: dict[str, Any] | None,
    event_id: str | None,
    condition: dict[str, Any],
    claim_by: str | None = None,
) -> tuple[L.Incident, str | None]:
    """Open (or join) the device's incident; see Ledger.open_incident.

    A device whose last incident is closed ("done") but which is still under that
    incident's cordon is the same trouble seen again (the monitor keeps scoring a device
    it already flagged): the signal joins that incident.
    """
    note = f"{trigger}: {reason}".strip(": ")
    if event_id:
        seen = ledger.incident_for_event(event_id)
        if seen is not None:
            return seen, "event"
    latest = ledger.incidents(device.uuid, limit=1)
    if latest and latest[0].status == "done":
        tag = f"{CORDON_TAG} {latest[0].incident_id}"
        if any(tag in c.reason for c in inventory.cordons()):
            duplicate = ledger.join(latest[0].incident_id, event_id, note)
            return ledger.incident(latest[0].incident_id), duplicate
    if trigger == "predicted":
        detail = f"risk {risk:.3f}" if risk is not None else "risk event"
        first = (L.RISK_SEEN, f"{detail}: {reason}" if reason else detail)
    elif trigger == "reactive":
        first = (L.DEVICE_LOST if not condition["present"] else L.JOB_CRASHED, reason)
    else:
        first = ("operator request", reason)
    return ledger.open_incident(
        device,
        trigger,
        reason,
        risk=risk,
        features=features,
        event_id=event_id,
        first_entry=first,
        claim_by=claim_by,
    )


# -- Prefect task wrappers ----------------------------------------------------------------

isolate_task = task(isolate, name="isolate", retries=3, retry_delay_seconds=2, cache_policy=NONE)
ensure_capacity_task = task(
    ensure_capacity, name="fail-over", retries=3, retry_delay_seconds=2, cache_policy=NONE
)
reserve_target_task = task(
    reserve_target, name="reserve-target", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
checkpoint_job_task = task(
    checkpoint_job, name="checkpoint", retries=1, retry_delay_seconds=2, cache_policy=NONE
)
migrate_job_task = task(
    migrate_job, name="migrate", retries=2, retry_delay_seconds=5, cache_policy=NONE
)


def resolve_or_refuse(
    inventory: Inventory,
    backend: Backend,
    device: str | None,
    resource_id: str | None,
    channel: NotificationBlock | None,
    result: dict[str, Any],
    logger: logging.Logger | logging.LoggerAdapter,
) -> DeviceRecord:
    """The device's record; a device that cannot be named or found is refused (and the
    operators told) before anything changes."""
    try:
        ref = device_ref_from(device, resource_id)
        result["device"] = str(ref)
        return resolve_device(inventory, backend, ref)
    except InvalidRequestError as exc:
        logger.error("remediation refused: %s", exc)
        result.update(status="rejected", error=str(exc))
        subject, body = summary(result)
        result["notified"] = send_task(channel, subject, body)
        raise
