"""Flow `remediate`: move every job off a device at risk (or gone), isolate it, notify.

    open incident ─ isolate ─ fail over ─ reserve targets ─ checkpoint (per job, parallel)
                  ─ migrate (per job) ─ close incident ─ notify + timeline artifact

Started by the `gpuflow.device.health-risk` event through the deployment trigger below
(predicted path), by a job that crashed with its device (reactive path: ``on_job_crash``
for in-process jobs, ``remediate_on_train_failure`` as a `train` flow hook), or by an
operator (`gpuflow remediate --device NODE:INDEX`). The same event twice changes nothing
more; a failed step leaves every job checkpointed and queued, and lifts the cordon when
nothing was moved.

An incident is resumable: its run holds it by a claim renewed on a timer (CLAIM_TTL_S) and
moves its phase forward step by step (opened, isolated, checkpointing, migrating, closed).
A run that dies mid-way (killed, its host gone) leaves the incident open with a claim
that lapses; the `reconcile` flow (flows/reconcile.py, a scheduled deployment) or the same
event delivered again takes it over and re-runs the steps, which are idempotent, or rolls
it back once it was abandoned too often. A crash Prefect sees lets the claim go at once
(``on_crashed``).
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.health.decision import ACT, DRAIN
from gpuflow.tasks.health.events import DECISION_LABEL, EVENT_NAME
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation import plan
from gpuflow.tasks.remediation.devices import ACTIVE_STATES, JobOnDevice, jobs_on_device
from gpuflow.tasks.remediation.launch import CrashHandler, crash_is_hardware
from gpuflow.tasks.remediation.notify import report, resolve_notifier
from gpuflow.tasks.remediation.steps import (
    RemediationPolicy,
    checkpoint_job_task,
    device_condition,
    ensure_capacity_task,
    isolate,
    isolate_task,
    migrate_job_task,
    open_incident,
    reserve_target_task,
    resolve_or_refuse,
    undo_isolation,
)
from gpuflow.tasks.remediation.targets import Reservation, release_reservation, unused_reservation
from prefect import flow, get_run_logger
from prefect.blocks.notifications import NotificationBlock
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import MissingContextError

if TYPE_CHECKING:  # flows know order: hardware types only for annotations
    from gpuflow.hardware.inventory import DeviceRecord, Inventory

# The deployment trigger, as prefect.yaml writes it (`triggers:` entry of `remediate`).
# Single-expression templates keep their type (Prefect renders them through tojson):
# the payload arrives as a dict. The event id is the idempotency key. It starts on the
# events whose decision (tasks.health.decision, the resource label gpuflow.decision) is
# "act" (the expected loss exceeds checkpoint + migration) or "drain-now"; a "watch"
# event (someone reporting a risk the rule does not act on) starts nothing.
TRIGGER_SPEC: dict[str, Any] = {
    "type": "event",
    "name": "remediate on gpuflow.device.health-risk",
    "enabled": True,
    "match": {"prefect.resource.id": "gpuflow.device.*", DECISION_LABEL: [ACT, DRAIN]},
    "expect": [EVENT_NAME],
    "parameters": {
        "resource_id": "{{ event.resource.id }}",
        "payload": "{{ event.payload }}",
        "event_id": "{{ event.id | string }}",
        "trigger": "predicted",
    },
}

Logger = logging.Logger | logging.LoggerAdapter


def remediate_trigger(**overrides: Any) -> DeploymentEventTrigger:
    spec = {k: v for k, v in TRIGGER_SPEC.items() if k != "type"} | overrides
    return DeploymentEventTrigger(**spec)


def _logger() -> Logger:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def _run_id() -> str:
    try:
        from prefect.runtime import flow_run

        if flow_run.id:
            return f"flow-run-{flow_run.id}"
    except Exception:  # noqa: BLE001 - outside a run: any unique id will do
        pass
    return f"remediate-{uuid.uuid4().hex[:12]}"


def _let_go_of_incidents(flow: Any, flow_run: Any, state: Any) -> None:
    """on_crashed / on_failure: a run that ends abnormally lets go of the incidents it
    still holds, so the reconciler can finish them without waiting for the claim to lapse."""
    worker = f"flow-run-{flow_run.id}"
    try:
        cluster = load_cluster((flow_run.parameters or {}).get("cluster_block"))
        ledger = L.Ledger(cluster.get_inventory().url)
        for incident in ledger.claimed_by(worker):
            ledger.add(incident.incident_id, L.STEP_FAILED, f"run ended {state.type.value}")
            ledger.release_claim(incident.incident_id, worker)
    except Exception:  # noqa: BLE001 - the claim lapses by itself
        logging.getLogger(__name__).exception("could not let go of %s's incidents", worker)


@flow(
    name="remediate",
    log_prints=True,
    on_crashed=[_let_go_of_incidents],
    on_failure=[_let_go_of_incidents],
)
def remediate(
    device: str | None = None,
    reason: str = "",
    risk: float | None = None,
    resource_id: str | None = None,
    payload: dict[str, Any] | None = None,
    event_id: str | None = None,
    trigger: Literal["predicted", "reactive", "manual"] = "manual",
    policy: RemediationPolicy | None = None,
    notify_block: str | None = None,
    notifier: NotificationBlock | None = None,
    cluster_block: str | None = None,
    cluster: GpuCluster | None = None,
    take_over: str | None = None,
    roll_back: bool = False,
) -> dict[str, Any]:
    """Remediate one device: ``device`` "NODE:INDEX" or an event's ``resource_id``.

    ``take_over`` (the reconciler): the id of an open incident of that device whose run is
    gone; this run finishes it, or with ``roll_back`` undoes what can be undone."""
    logger = _logger()
    signal = plan.read_signal(trigger, reason, risk, payload)
    cluster = cluster or load_cluster(cluster_block)
    inventory, backend = cluster.get_inventory(), cluster.get_backend()
    channel = resolve_notifier(notifier or notify_block)  # a bad name fails before any change
    result = plan.new_result(device or resource_id, signal)
    record = resolve_or_refuse(inventory, backend, device, resource_id, channel, result, logger)
    condition = device_condition(backend, record)
    result.update(sku=record.sku, condition=condition)

    ledger = L.Ledger(inventory.url)
    worker = _run_id()
    if take_over:
        incident, duplicate = ledger.incident(take_over), "device"
        if not ledger.take_over(take_over, worker, f"{signal.trigger}: {signal.reason}"):
            logger.info("incident %s is held by a live run or closed: nothing to do", take_over)
            return result | {"incident_id": take_over, "status": incident.status, "busy": True}
    else:
        incident, duplicate = open_incident(
            ledger,
            inventory,
            record,
            trigger=signal.trigger,
            reason=signal.reason,
            risk=signal.risk,
            features=signal.features,
            event_id=event_id,
            condition=condition,
            claim_by=worker,
        )
    iid = incident.incident_id
    result.update(incident_id=iid, duplicate=duplicate)
    if duplicate == "event":
        detail = f"event {event_id} delivered again"
        if incident.status != "open" or not ledger.take_over(iid, worker, detail):
            logger.info(
                "event %s was handled by incident %s (%s): nothing to do",
                event_id,
                iid,
                incident.status,
            )
            return result | {"status": incident.status}
        logger.info("event %s: incident %s was left open by a run that is gone: finishing it")
        duplicate = "device"
    elif duplicate == "device" and not take_over:
        if not ledger.claim(iid, worker):
            logger.info(
                "%s: incident %s is being handled by another run: nothing to do",
                result["device"],
                iid,
            )
            return result | {"status": incident.status, "busy": True}
        logger.info(
            "%s already has incident %s (%s): re-checking it",
            result["device"],
            iid,
            incident.status,
        )
    run = _Run(
        cluster,
        inventory,
        ledger,
        record,
        policy or RemediationPolicy(),
        channel,
        logger,
        result,
        plan.Situation.of(ledger.incident(iid), duplicate, signal, condition),
    )
    # The claim lives while this run does: renewed every CLAIM_TTL_S / 3, whatever a step
    # waits for; a run whose claim another run took stops before its next move.
    keeper = L.claim_keeper(ledger, iid, worker)
    try:
        with keeper:
            run.keeper = keeper
            return _abandon(run) if roll_back else _move_jobs_off(run)
    finally:
        ledger.release_claim(iid, worker)


@dataclass
class _Run:
    """One remediation's handles and what its decisions are made from."""

    cluster: GpuCluster
    inventory: Inventory
    ledger: L.Ledger
    device: DeviceRecord
    policy: RemediationPolicy
    channel: NotificationBlock | None
    logger: Logger
    result: dict[str, Any]
    situation: plan.Situation
    keeper: L.ClaimKeeper | None = None

    def note(self, entries: list[plan.Entry]) -> bool:
        """Write entries to the incident's timeline; True if there were any."""
        for e in entries:
            self.ledger.add(self.situation.incident_id, e.what, e.detail, job_id=e.job_id)
        return bool(entries)


def _move_jobs_off(run: _Run) -> dict[str, Any]:
    """isolate, fail over, reserve, checkpoint, migrate, close, notify (the incident is ours)."""
    s, result = run.situation, run.result
    run.note(s.opening_entries())
    isolation = isolate_task(
        run.inventory, run.device, run.policy, s.incident_id, s.isolation_reason()
    )
    result["isolation"] = isolation
    run.ledger.set_phase(s.incident_id, L.ISOLATED)
    changed = run.note(s.cordon_entries(isolation))
    jobs, others = jobs_on_device(run.inventory, run.device)
    result["unmanaged"] = sorted({lease.owner for lease in others})
    run.logger.info(
        "%s: %d job(s) to move: %s",
        result["device"],
        len(jobs),
        ", ".join(j.job_id for j in jobs) or "none",
    )
    capacity = ensure_capacity_task(run.inventory, jobs, run.policy)
    result["spares_activated"], result["short"] = capacity["promoted"], capacity["short"]
    changed = run.note(plan.spare_entries(capacity["promoted"])) or changed
    backend = run.cluster.get_backend()
    reservations = {
        j.job_id: reserve_target_task(run.cluster.get_inventory(), backend, j) for j in jobs
    }
    moved: list[str] = []
    run.ledger.set_phase(s.incident_id, L.CHECKPOINTING)
    try:
        pending = {}
        for job in jobs:  # every job is asked first: they checkpoint in parallel
            action = s.checkpoint_action(job, reservations[job.job_id])
            run.note(plan.request_entries(job, action))
            pending[job.job_id] = checkpoint_job_task.submit(
                run.cluster.get_inventory(),
                job,
                device_present=s.present,
                policy=run.policy,
                action=action,
                incident_id=s.incident_id,
            )
        for job in jobs:
            ck = pending[job.job_id].result()
            step = plan.after_checkpoint(job, ck)
            run.note(step.entries)
            if step.migrate:
                if run.keeper is not None:
                    run.keeper.check()  # still ours, or stop before moving anything more
                run.ledger.set_phase(s.incident_id, L.MIGRATING)
                moved.append(job.job_id)
                mig = migrate_job_task(run.cluster, job, ck, reservations[job.job_id], on_job_crash)
                reservations.pop(job.job_id)  # used or given back by migrate itself
                step = plan.after_migration(job, ck, mig)
                run.note(step.entries)
            run.ledger.set_job(s.incident_id, job.job_id, **step.outcome)
            result["jobs"][job.job_id] = step.outcome
            changed = True
    except L.ClaimLostError:
        raise  # another run took the incident over: its work is not ours to undo
    except Exception as exc:
        _roll_back(run, jobs, reservations, isolation, moved, exc)
        raise

    status = plan.final_status(result["jobs"])
    run.ledger.set_status(s.incident_id, status)
    result["status"] = status
    if s.should_notify(changed):
        report(run.channel, result, run.ledger, s.incident_id, run.logger)
    else:
        run.logger.info("incident %s: nothing changed; no new notification", s.incident_id)
        result["notified"] = False
    return result


def _roll_back(
    run: _Run,
    jobs: list[JobOnDevice],
    reservations: dict[str, Reservation | None],
    isolation: dict[str, Any],
    moved: list[str],
    exc: Exception,
) -> None:
    """A step failed: give back unused reservations, keep every job findable, lift the
    cordon if nothing was moved, close the incident as failed and tell the operators."""
    s, result = run.situation, run.result
    for job_id, reservation in reservations.items():  # the ones no step has used
        release_reservation(run.cluster.get_inventory(), job_id, reservation)
    for job in plan.unfinished(jobs, result["jobs"]):
        _mark(run.inventory, job.job_id, run.device.uuid, s.incident_id)
    run.note([plan.failure_entry(exc)])
    if s.undo_cordon_on_failure(moved) and undo_isolation(run.inventory, run.device, isolation):
        run.note([plan.CORDON_UNDONE_ENTRY])
        result["isolation"] = isolation | {"undone": True}
    run.ledger.set_status(s.incident_id, "failed")
    result.update(status="failed", error=plan.error_text(exc))
    report(run.channel, result, run.ledger, s.incident_id, run.logger)


def _abandon(run: _Run) -> dict[str, Any]:
    """Roll back an incident whose runs kept dying: give back reservations no attempt
    uses, keep every job findable, lift the cordon if nothing was moved, close it failed."""
    s, result = run.situation, run.result
    isolation = isolate(run.inventory, run.device, run.policy, s.incident_id, s.isolation_reason())
    jobs, _ = jobs_on_device(run.inventory, run.device)
    backend = run.cluster.get_backend()
    reservations = {j.job_id: unused_reservation(run.inventory, backend, j) for j in jobs}
    moved = [j.job_id for j in jobs if j.state not in ACTIVE_STATES]
    why = f"abandoned by {run.ledger.incident(s.incident_id).takeovers} run(s)"
    _roll_back(run, jobs, reservations, isolation, moved, RuntimeError(why))
    return result


def _mark(inventory: Inventory, job_id: str, device_uuid: str, incident_id: str) -> None:
    """Mark a job a failed step left unfinished for this device (best effort)."""
    try:
        current = inventory.job(job_id)
        marker = plan.failed_step_marker(current.info, device_uuid, incident_id)
        if marker is not None:
            inventory.transition_job(job_id, expect_attempt=current.attempt, remediation=marker)
    except Exception:  # noqa: BLE001 - best effort on the failure path
        logging.getLogger(__name__).exception("could not mark job %s", job_id)


# -- reactive path ------------------------------------------------------------------------


def on_job_crash(job_id: str, device: str, error: BaseException, **options: Any) -> dict[str, Any]:
    """A CrashHandler for InProcessRunner: the job died with its device; resume it."""
    return remediate(
        device=device,
        trigger="reactive",
        reason=f"job {job_id} crashed: {type(error).__name__}: {error}"[:300],
        **options,
    )


def crash_handler(**options: Any) -> CrashHandler:
    """on_job_crash with remediate options bound (notifier, policy, cluster...)."""

    def handler(job_id: str, device: str, error: BaseException) -> dict[str, Any]:
        return on_job_crash(job_id, device, error, **options)

    return handler


def remediate_on_train_failure(flow: Any, flow_run: Any, state: Any) -> None:
    """An ``on_failure`` hook for the `train` flow: if the job's device is at fault, mark
    the job for remediation and run `remediate` for that device (reactive path)."""
    logger = logging.getLogger(__name__)
    params = dict(getattr(flow_run, "parameters", {}) or {})
    spec = params.get("spec") or {}
    job_id = spec.get("job_id") if isinstance(spec, dict) else getattr(spec, "job_id", None)
    if not job_id:
        logger.warning("train failure hook: no job id in the flow run's parameters")
        return
    cluster = load_cluster(params.get("cluster_block"))
    inventory, backend = cluster.get_inventory(), cluster.get_backend()
    job = inventory.job(job_id)
    if not job.resource_ids:
        return
    error = RuntimeError(str(getattr(state, "message", "") or "train flow failed"))
    # A gang failed if any of its units' devices did: remediate that one (the gang moves).
    at_fault = [
        res
        for res in map(inventory.resource, job.resource_ids)
        if crash_is_hardware(error, backend, res.node, res.device_index)
    ]
    if not at_fault:
        logger.info("job %s failed on healthy devices: not remediating", job_id)
        return
    res = at_fault[0]
    inventory.requeue_job(
        job_id,
        "lost",
        expect_attempt=job.attempt,
        remediation={
            "device_uuid": res.device_uuid,
            "cause": "crash",
            "error": str(error)[:500],
        },
    )
    remediate(
        device=f"{res.node}:{res.device_index}",
        trigger="reactive",
        reason=f"train flow of job {job_id} failed with its device",
        cluster=cluster,
    )


def remediate_deployment(name: str = "remediate", **kwargs: Any) -> Any:
    """The `remediate` deployment with its event trigger (for `serve`)."""
    return remediate.to_deployment(name=name, triggers=[remediate_trigger()], **kwargs)
