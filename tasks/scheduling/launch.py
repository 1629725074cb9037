"""The `schedule` flow's work: one scheduling pass, and starting what it placed.

A placed job starts through the `train` deployment when one exists (on whatever work pool
it is deployed to; a Kubernetes pool also gets the placement's job variables), else in
this process (runner.py). Plain functions first, thin task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.tasks.scheduling.model import SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService
from gpuflow.tasks.worker_queues import queue_for_node
from prefect import task
from prefect.cache_policies import NONE

log = logging.getLogger(__name__)

LAUNCH_MODES = ("auto", "deployment", "in-process", "none")


def schedule_pass(cluster: Any, config: SchedulerConfig, ack_timeout_s: float) -> dict[str, Any]:
    """Reap, place, preempt (waiting up to ``ack_timeout_s`` for victims), grow."""
    service = SchedulerService.for_cluster(cluster, config)
    report = service.schedule_once(ack_timeout_s=ack_timeout_s)
    out = report.to_dict()
    out["to_start"] = [
        job_id for job_id in report.to_start if service.train_spec(job_id) is not None
    ]
    out["external"] = [job_id for job_id in report.to_start if job_id not in out["to_start"]]
    return out


def deployment_target(name: str) -> tuple[bool, bool]:
    """(the deployment exists, its work pool is a Kubernetes one)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            return False, False
        pool_name = getattr(deployment, "work_pool_name", None)
        if not pool_name:
            return True, False
        try:
            pool = client.read_work_pool(pool_name)
        except ObjectNotFound:
            return True, False
        return True, str(getattr(pool, "type", "")).startswith("kubernetes")


def resolve_launch(mode: str, deployment: str) -> str:
    if mode not in LAUNCH_MODES:
        raise ValueError(f"launch {mode!r} is not one of {', '.join(LAUNCH_MODES)}")
    if mode != "auto":
        return mode
    exists, _ = deployment_target(deployment)
    return "deployment" if exists else "in-process"


def launch_deployment(cluster: Any, job_id: str, deployment: str, cluster_block: str | None) -> str:
    """Start the `train` deployment on the job's placement; returns the flow run id."""
    from prefect.deployments import run_deployment

    service = SchedulerService.for_cluster(cluster)
    record = service.inventory.job(job_id)
    train = service.train_spec(job_id) or {}
    sched = dict(record.info.get("sched") or {})
    _, kubernetes = deployment_target(deployment)
    job_variables = None
    if kubernetes:
        env = (sched.get("env") or {}).get("job_variables") or {}
        job_variables = {k: v for k, v in env.items() if k != "pods"}
    primary = record.resource_ids[0]
    node = service.inventory.resource(primary).node
    service.inventory.mark_launching(job_id, record.attempt)
    run = run_deployment(
        deployment,
        parameters={
            "spec": {**train, "job_id": job_id},
            "device": {"resource_id": primary},
            "cluster_block": cluster_block,
        },
        timeout=0,  # fire and forget: the next pass reaps it
        as_subflow=False,
        job_variables=job_variables,
        flow_run_name=f"train-{job_id}",
        # Where workers own nodes, the run goes to the worker of the node it was placed on.
        work_queue_name=queue_for_node(deployment, node),
    )
    return str(run.id)


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
launch_deployment_task = task(
    launch_deployment, name="launch-train", retries=2, retry_delay_seconds=5, cache_policy=NONE
)
queue_rows_task = task(queue_rows, name="read-queue", cache_policy=NONE)
