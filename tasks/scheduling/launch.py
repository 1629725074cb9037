"""The `schedule` flow's work: one scheduling pass, and starting what it placed.

A placed job starts through a launcher (tasks/launching.py): the `train` deployment when
one exists (on whatever work pool it is deployed to; a Kubernetes pool also gets the
placement's job variables), else in this process (runner.py's InlineLauncher). Plain
functions first, thin task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.tasks.launching import (
    DeploymentLauncher,
    Launcher,
    LaunchError,
    LaunchOrder,
    LaunchReceipt,
    deployment_target,
    pin_units,
    storage_fields,
)
from gpuflow.tasks.scheduling.model import SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService
from prefect import task
from prefect.cache_policies import NONE

log = logging.getLogger(__name__)

LAUNCH_MODES = ("auto", "deployment", "in-process", "none")


def pass_service(cluster: Any, config: SchedulerConfig) -> SchedulerService:
    """The service a run of the `schedule` flow passes with, all its passes: kept, its
    engine reads only what changed between them (refresh.py); a new one per pass would
    read the whole inventory every time (about 1 s at 10,000 GPUs)."""
    return SchedulerService.for_cluster(cluster, config)


def schedule_pass(
    cluster: Any,
    config: SchedulerConfig,
    ack_timeout_s: float,
    service: SchedulerService | None = None,
) -> dict[str, Any]:
    """Reap, place, preempt (waiting up to ``ack_timeout_s`` for victims), grow; with the
    run's ``service`` (pass_service), else a new one."""
    service = service or SchedulerService.for_cluster(cluster, config)
    report = service.schedule_once(ack_timeout_s=ack_timeout_s)
    out = report.to_dict()
    out["to_start"] = [
        job_id for job_id in report.to_start if service.train_spec(job_id) is not None
    ]
    out["external"] = [job_id for job_id in report.to_start if job_id not in out["to_start"]]
    out["rebuilds"] = service.rebuilds
    return out


def resolve_launch(mode: str, deployment: str) -> str:
    if mode not in LAUNCH_MODES:
        raise ValueError(f"launch {mode!r} is not one of {', '.join(LAUNCH_MODES)}")
    if mode != "auto":
        return mode
    exists, _ = deployment_target(deployment)
    return "deployment" if exists else "in-process"


def gang_spec(train: dict[str, Any], job_id: str, units: int) -> dict[str, Any]:
    """The train spec of a placement of ``units`` units: one rank per unit. The world size
    is the placement's, so an elastic job the scheduler grew or shrank (a stop, then a new
    placement) trains at its new size, resharding its last checkpoint."""
    return {**train, "job_id": job_id, "gpus": units}


def launch_order(
    cluster: Any, job_id: str, cluster_block: str | None, storage: Any = None
) -> LaunchOrder:
    """The order to start a placed job's current attempt where the pass placed it, with
    the schedule flow's checkpoint storage (its non-secret fields: a worker on another
    host writes where the job's checkpoints are, not to its own disk)."""
    service = SchedulerService.for_cluster(cluster)
    record = service.inventory.job(job_id)
    if not record.resource_ids:
        raise LaunchError(f"job {job_id!r} is {record.state} with no placement: nothing to start")
    train = service.train_spec(job_id) or {}
    sched = dict(record.info.get("sched") or {})
    env = (sched.get("env") or {}).get("job_variables") or {}
    primary = record.resource_ids[0]
    return LaunchOrder(
        job_id,
        record.attempt,
        primary,
        service.inventory.resource(primary).node,
        parameters={
            "spec": gang_spec(train, job_id, len(record.resource_ids)),
            "device": pin_units(record.resource_ids),
            "cluster_block": cluster_block,
            "storage": storage_fields(storage) if storage is not None else None,
        },
        job_variables={k: v for k, v in env.items() if k != "pods"},
    )


def launch_placed(
    cluster: Any,
    job_id: str,
    launcher: Launcher,
    cluster_block: str | None = None,
    storage: Any = None,
) -> dict[str, Any]:
    """Start a job the pass placed with ``launcher``; returns the receipt as a dict.

    The attempt moves to launching first (a compare-and-swap on its attempt: an attempt
    superseded meanwhile raises JobConflictError and starts nothing). A deployment is
    asked even when the attempt was already launching, a retry after a lost answer: its
    idempotency key makes that the same flow run.
    """
    order = launch_order(cluster, job_id, cluster_block, storage)
    first = SchedulerService.for_cluster(cluster).inventory.mark_launching(job_id, order.attempt)
    if not first and not isinstance(launcher, DeploymentLauncher):
        return LaunchReceipt(launcher.name, job_id, order.attempt, started=False).to_dict()
    return launcher.launch(order).to_dict()


def queue_rows(cluster: Any) -> list[dict[str, Any]]:
    """The scheduler's live jobs, one row each, in queue order (running ones last)."""
    service = SchedulerService.for_cluster(cluster)
    return [
        {
            "job": v.job_id,
            "state": v.state,
            "priority": v.priority,
            "request": v.request,
            "position": "-" if v.position is None else v.position,
            "resources": ", ".join(v.resource_ids) or "-",
            "checkpoint": v.last_checkpoint_id or "-",
            "preemptions": v.preemptions,
        }
        for v in service.jobs()
    ]


schedule_pass_task = task(schedule_pass, name="schedule-pass", cache_policy=NONE)
# Retries are safe: a deployment run is keyed by (job, attempt), an inline one is
# started by whoever moved the attempt to launching.
launch_placed_task = task(
    launch_placed, name="launch-job", retries=2, retry_delay_seconds=5, cache_policy=NONE
)
queue_rows_task = task(queue_rows, name="read-queue", cache_policy=NONE)
