"""Flow `remediate`: move every job off a device at risk (or gone), isolate it, notify.

    open incident ─ isolate ─ fail over ─ reserve targets ─ checkpoint (per job, parallel)
                  ─ migrate (per job) ─ close incident ─ notify + timeline artifact

Started by the `gpuflow.device.health-risk` event through the deployment trigger below
(predicted path), by a job that crashed with its device (reactive path: ``on_job_crash``
for in-process jobs, ``remediate_on_train_failure`` as a `train` flow hook), or by an
operator (`gpuflow remediate --device NODE:INDEX`). The same event twice changes nothing
more; a failed step leaves every job checkpointed and queued, and lifts the cordon when
nothing was moved.
"""

from __future__ import annotations

import logging
import re
import uuid
from typing import Any, Literal

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.health.events import DEVICE_LOST_REASON, EVENT_NAME
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.devices import jobs_on_device
from gpuflow.tasks.remediation.launch import CrashHandler, crash_is_hardware
from gpuflow.tasks.remediation.notify import resolve_notifier, send_task, summary, timeline_markdown
from gpuflow.tasks.remediation.steps import (
    CHECKPOINT_AND_STOP,
    CHECKPOINT_NOW,
    RemediationPolicy,
    checkpoint_job_task,
    device_condition,
    device_ref_from,
    ensure_capacity_task,
    isolate_task,
    migrate_job_task,
    open_incident,
    release_reservation,
    reserve_target_task,
    resolve_device,
    undo_isolation,
)
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.blocks.notifications import NotificationBlock
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import MissingContextError

# The deployment trigger, as prefect.yaml writes it (`triggers:` entry of `remediate`).
# Single-expression templates keep their type (Prefect renders them through tojson):
# the payload arrives as a dict. The event id is the idempotency key.
TRIGGER_SPEC: dict[str, Any] = {
    "type": "event",
    "name": "remediate on gpuflow.device.health-risk",
    "enabled": True,
    "match": {"prefect.resource.id": "gpuflow.device.*"},
    "expect": [EVENT_NAME],
    "parameters": {
        "resource_id": "{{ event.resource.id }}",
        "payload": "{{ event.payload }}",
        "event_id": "{{ event.id | string }}",
        "trigger": "predicted",
    },
}


def remediate_trigger(**overrides: Any) -> DeploymentEventTrigger:
    spec = {k: v for k, v in TRIGGER_SPEC.items() if k != "type"} | overrides
    return DeploymentEventTrigger(**spec)


def _logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:60] or "device"


def _features(payload: dict[str, Any]) -> dict[str, Any]:
    found = payload.get("top_features", payload.get("features"))
    if isinstance(found, dict):
        return found
    if isinstance(found, list):  # [[name, value], ...] or [{"name":..., "value":...}]
        out: dict[str, Any] = {}
        for item in found:
            if isinstance(item, dict) and "name" in item:
                out[str(item["name"])] = item.get("value")
            elif isinstance(item, list | tuple) and len(item) == 2:
                out[str(item[0])] = item[1]
        return out
    return {}


@flow(name="remediate", log_prints=True)
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
) -> dict[str, Any]:
    """Remediate one device: ``device`` "NODE:INDEX" or an event's ``resource_id``."""
    logger = _logger()
    policy = policy or RemediationPolicy()
    payload = payload or {}
    if risk is None and isinstance(payload.get("risk"), int | float):
        risk = float(payload["risk"])
    features = _features(payload)
    if trigger == "predicted" and payload.get("reason") == DEVICE_LOST_REASON:
        trigger = "reactive"  # the monitor saw the device gone: nothing was predicted
    if not reason and payload:
        why = str(payload.get("reason") or "model")
        reason = "health model risk" if why == "model" else why
    cluster = cluster or load_cluster(cluster_block)
    inventory, backend = cluster.get_inventory(), cluster.get_backend()
    channel = resolve_notifier(notifier or notify_block)  # a bad name fails before any change
    result: dict[str, Any] = {
        "device": device or resource_id,
        "trigger": trigger,
        "risk": risk,
        "reason": reason,
        "features": features,
        "jobs": {},
        "spares_activated": [],
        "unmanaged": [],
        "duplicate": None,
    }

    # -- which device -------------------------------------------------------------------
    try:
        ref = device_ref_from(device, resource_id)
        result["device"] = str(ref)
        record = resolve_device(inventory, backend, ref)
    except InvalidRequestError as exc:
        logger.error("remediation refused: %s", exc)
        result.update(status="rejected", error=str(exc))
        subject, body = summary(result)
        result["notified"] = send_task(channel, subject, body)
        raise
    result["sku"] = record.sku
    condition = device_condition(backend, record)
    result["condition"] = condition
    ledger = L.Ledger(inventory.url)
    worker = _run_id()
    incident, duplicate = open_incident(
        ledger,
        inventory,
        record,
        trigger=trigger,
        reason=reason,
        risk=risk,
        features=features,
        event_id=event_id,
        condition=condition,
        claim_by=worker,
    )
    iid = incident.incident_id
    result.update(incident_id=iid, duplicate=duplicate)
    if duplicate == "event":
        logger.info(
            "event %s was handled by incident %s (%s): nothing to do",
            event_id,
            iid,
            incident.status,
        )
        return result | {"status": incident.status}
    if duplicate == "device":
        if not ledger.claim(iid, worker):
            logger.info("%s: incident %s is being handled by another run: nothing to do", ref, iid)
            return result | {"status": incident.status, "busy": True}
        logger.info("%s already has incident %s (%s): re-checking it", ref, iid, incident.status)
    try:
        return _steps(
            cluster,
            inventory,
            backend,
            ledger,
            incident,
            duplicate,
            record,
            condition,
            policy,
            channel,
            result,
            reason,
            trigger,
            risk,
            logger,
        )
    finally:
        ledger.release_claim(iid, worker)


def _run_id() -> str:
    try:
        from prefect.runtime import flow_run

        if flow_run.id:
            return f"flow-run-{flow_run.id}"
    except Exception:  # noqa: BLE001 - outside a run: any unique id will do
        pass
    return f"remediate-{uuid.uuid4().hex[:12]}"


def _steps(
    cluster: GpuCluster,
    inventory: Any,
    backend: Any,
    ledger: L.Ledger,
    incident: L.Incident,
    duplicate: str | None,
    record: Any,
    condition: dict[str, Any],
    policy: RemediationPolicy,
    channel: NotificationBlock | None,
    result: dict[str, Any],
    reason: str,
    trigger: str,
    risk: float | None,
    logger: logging.Logger | logging.LoggerAdapter,
) -> dict[str, Any]:
    """isolate, fail over, reserve, checkpoint, migrate, close, notify (the incident is ours)."""
    iid = incident.incident_id
    ref = result["device"]
    if not condition["present"] and duplicate is None and trigger == "predicted":
        ledger.add(iid, L.DEVICE_LOST, "; ".join(condition["reasons"]))

    # -- isolate, fail over, reserve -----------------------------------------------------
    why = reason or trigger
    if risk is not None:
        why = f"{why} (risk {risk:.2f})"
    isolation = isolate_task(inventory, record, policy, iid, why)
    result["isolation"] = isolation
    changed = False
    if isolation["created"] and not any(e["what"] == L.CORDONED for e in incident.timeline):
        ledger.add(iid, L.CORDONED, f"{isolation['target']}: {isolation['reason']}")
        changed = True
    jobs, others = jobs_on_device(inventory, record)
    result["unmanaged"] = sorted({lease.owner for lease in others})
    logger.info(
        "%s: %d job(s) to move: %s", ref, len(jobs), ", ".join(j.job_id for j in jobs) or "none"
    )
    capacity = ensure_capacity_task(inventory, jobs, policy)
    result["spares_activated"], result["short"] = capacity["promoted"], capacity["short"]
    for node in capacity["promoted"]:
        ledger.add(iid, L.SPARE_ACTIVATED, f"node {node} joined the active pool")
        changed = True
    reservations = {
        j.job_id: reserve_target_task(cluster.get_inventory(), backend, j) for j in jobs
    }

    # -- checkpoint and migrate ----------------------------------------------------------
    moved: list[str] = []
    try:
        pending = {}
        for job in jobs:
            in_place = reservations[job.job_id] is None and condition["present"] and job.holds_lease
            action = CHECKPOINT_NOW if in_place else CHECKPOINT_AND_STOP
            if job.holds_lease:
                ledger.add(iid, L.CHECKPOINT_REQUESTED, action, job_id=job.job_id)
            pending[job.job_id] = checkpoint_job_task.submit(
                cluster.get_inventory(),
                job,
                device_present=condition["present"],
                policy=policy,
                action=action,
                incident_id=iid,
            )
        for job in jobs:
            ck = pending[job.job_id].result()
            out: dict[str, Any] = {
                "checkpoint_id": ck.checkpoint_id,
                "checkpoint_how": ck.how,
                "step": ck.step,
                "waited_s": round(ck.waited_s, 3),
            }
            if ck.action == CHECKPOINT_NOW:
                what = L.CHECKPOINT_IN_PLACE if ck.checkpoint_id else L.JOB_QUEUED
                ledger.add(
                    iid,
                    what,
                    f"{ck.checkpoint_id or '-'}; no free {job.sku}: keeps running where it is",
                    job_id=job.job_id,
                )
                out.update(
                    status="in-place",
                    detail=f"no free {job.sku}: kept running, {ck.detail}".strip(", "),
                )
            else:
                moved.append(job.job_id)
                what = L.CHECKPOINT_WRITTEN if ck.how == "on-request" else L.CHECKPOINT_FALLBACK
                ledger.add(
                    iid,
                    what,
                    f"{ck.checkpoint_id or 'none: restarts from step 0'}"
                    + (f" ({ck.detail})" if ck.detail else ""),
                    job_id=job.job_id,
                )
                mig = migrate_job_task(cluster, job, ck, reservations[job.job_id], on_job_crash)
                reservations.pop(job.job_id)  # used or given back by migrate itself
                out.update(
                    status=mig.status, target=mig.target, launcher=mig.launcher, detail=mig.detail
                )
                if mig.status == "resumed":
                    ledger.add(
                        iid,
                        L.JOB_RESUMED,
                        f"on {mig.target} from {ck.checkpoint_id or 'scratch'}"
                        f" (step {ck.step or 0})",
                        job_id=job.job_id,
                    )
                else:
                    ledger.add(
                        iid,
                        L.JOB_QUEUED,
                        f"checkpointed and queued: {mig.detail}",
                        job_id=job.job_id,
                    )
            ledger.set_job(iid, job.job_id, **out)
            result["jobs"][job.job_id] = out
            changed = True
    except Exception as exc:
        for job_id, binding in reservations.items():  # the ones no step has used
            release_reservation(cluster.get_inventory(), job_id, binding)
        for job in jobs:
            if job.job_id not in result["jobs"]:
                # Whatever it does next (it may still answer a pending stop), it stays
                # findable: the next run for this device takes a stopped job over.
                _mark(inventory, job.job_id, record.uuid, iid)
        ledger.add(iid, L.STEP_FAILED, f"{type(exc).__name__}: {exc}")
        if not moved and condition["present"] and undo_isolation(inventory, record, isolation):
            ledger.add(iid, L.CORDON_UNDONE, "nothing was moved")
            result["isolation"] = isolation | {"undone": True}
        ledger.set_status(iid, "failed")
        result.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        _report(channel, result, ledger, iid, logger)
        raise

    waiting = [j for j, o in result["jobs"].items() if o["status"] != "resumed"]
    status = "waiting" if waiting else "done"
    ledger.set_status(iid, status)
    result["status"] = status
    if duplicate is None or changed:
        _report(channel, result, ledger, iid, logger)
    else:
        logger.info("incident %s: nothing changed; no new notification", iid)
        result["notified"] = False
    return result


def _mark(inventory: Any, job_id: str, device_uuid: str, incident_id: str) -> None:
    try:
        current = inventory.job(job_id)
        if (current.info.get("remediation") or {}).get("device_uuid") != device_uuid:
            inventory.set_job_state(
                job_id,
                current.state,
                remediation={
                    "device_uuid": device_uuid,
                    "incident": incident_id,
                    "cause": "failed step",
                },
            )
    except Exception:  # noqa: BLE001 - best effort on the failure path
        logging.getLogger(__name__).exception("could not mark job %s", job_id)


def _report(
    channel: NotificationBlock | None,
    result: dict[str, Any],
    ledger: L.Ledger,
    incident_id: str,
    logger: logging.Logger | logging.LoggerAdapter,
) -> None:
    """Notify the operators, note it in the timeline, and publish the timeline artifact."""
    subject, body = summary(result)
    notified = False
    try:
        notified = send_task(channel, subject, body)
    except Exception as exc:  # noqa: BLE001 - the remediation itself stands
        logger.error("notification failed: %s", exc)
        ledger.add(incident_id, L.STEP_FAILED, f"notification failed: {exc}")
    if notified:
        ledger.add(incident_id, L.NOTIFIED, subject)
    result["notified"] = notified
    timeline = list(ledger.incident(incident_id).timeline)
    result["timeline"] = timeline
    try:
        create_markdown_artifact(
            key=f"remediation-{_slug(result.get('device') or 'device')}",
            markdown=timeline_markdown(result, timeline),
            description=subject[:500],
        )
    except MissingContextError:
        pass


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
    res = inventory.resource(job.resource_ids[0])
    error = RuntimeError(str(getattr(state, "message", "") or "train flow failed"))
    if not crash_is_hardware(error, backend, res.node, res.device_index):
        logger.info("job %s failed on a healthy device: not remediating", job_id)
        return
    inventory.set_job_state(
        job_id,
        "queued",
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
