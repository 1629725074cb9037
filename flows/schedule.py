"""Flow `schedule`: drain the queues.

(every interval_s, `passes` times, with one service:)
pass (reap ─ place ─ preempt: checkpoint-and-stop, wait for acks ─ grow) ─┬─ launch(job) ─┐
                                                                          └─ ...          ├─ (in-process: next pass) ─ queue artifact

Each run passes `passes` times, `interval_s` apart, with one scheduler service, whose
engine then reads only what changed between passes (tasks/scheduling/refresh.py): the
deployment (prefect.yaml) runs 239 passes 60 s apart per run, every 4 hours, so only
one pass in 239 reads the whole inventory. Placed jobs start through the `train` deployment when
it exists (fire and forget; the next pass reaps them), else in this process, one after
the other, with a new pass after each round so a preempted job resumes as soon as its
preemptor is done.
"""

from __future__ import annotations

import time

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.launching import DeploymentLauncher
from gpuflow.tasks.scheduling.launch import (
    launch_placed_task,
    pass_service,
    queue_rows_task,
    resolve_launch,
    schedule_pass_task,
)
from gpuflow.tasks.scheduling.model import SchedulerConfig
from gpuflow.tasks.scheduling.runner import InlineLauncher, run_placed_task
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

RESULT_KEYS = ("steps_done", "resumed_from_step", "stopped_by_request", "run_id", "resource_id")


@flow(name="schedule", log_prints=True)
def schedule(
    cluster_block: str | None = None,
    storage: CheckpointStorage | None = None,
    policy: str | None = None,
    preemption: bool | None = None,
    queue_depth: int | None = None,
    ack_timeout_s: float = 120.0,
    launch: str = "auto",
    train_deployment: str = "train/train",
    max_rounds: int = 8,
    passes: int = 1,
    interval_s: float = 60.0,
) -> dict:
    """``passes`` passes over the queues, ``interval_s`` apart (each with more rounds,
    in-process, until nothing new starts)."""
    if passes < 1 or not interval_s >= 0:
        raise ValueError(f"passes must be >= 1 and interval_s >= 0, got {passes!r}, {interval_s!r}")
    logger = get_run_logger()
    cluster = load_cluster(cluster_block)
    storage = storage or CheckpointStorage()
    config = SchedulerConfig.from_env(policy=policy, preemption=preemption, queue_depth=queue_depth)
    mode = resolve_launch(launch, train_deployment)
    deployments, inline = DeploymentLauncher(train_deployment), InlineLauncher(cluster, storage)
    service = pass_service(cluster, config)  # one for every pass: it keeps its engine
    reports: list[dict] = []
    results: dict[str, dict] = {}
    launched: dict[str, str] = {}
    for n in range(passes):
        if n:
            time.sleep(interval_s)
        for _ in range(max(1, max_rounds)):
            report = schedule_pass_task(cluster, config, ack_timeout_s, service)
            reports.append(report)
            for p in report["preemptions"]:
                victims = ", ".join(f"{v['job_id']} ({v['action']})" for v in p["victims"])
                logger.info("preempting %s for %s", victims, p["job_id"])
            for q in report["quarantined"]:
                logger.error("quarantined %s: %s", q["job_id"], q["error"])
            for error in report["errors"]:
                logger.warning("pass: %s", error)
            for job_id in report["external"]:
                logger.info("%s placed; it has no train spec, its own runner must start it", job_id)
            if not report["to_start"] or mode == "none":
                break
            for job_id in report["to_start"]:
                if mode == "deployment":
                    receipt = launch_placed_task(
                        cluster, job_id, deployments, cluster_block, storage
                    )
                    launched[job_id] = receipt.get("flow_run_id", "")
                    continue
                receipt = run_placed_task(cluster, job_id, inline, cluster_block)
                if receipt.get("result"):
                    results[job_id] = {k: receipt["result"][k] for k in RESULT_KEYS}
            if mode != "in-process":
                break  # deployments run elsewhere; the next pass reaps them
    rows = queue_rows_task(cluster)
    create_table_artifact(
        rows or [{"job": "-", "state": "queue empty"}],
        key="schedule-queue",
        description="Scheduled jobs after this run (queued in order, then running)",
    )
    return {
        "launch": mode,
        "passes": reports,
        "results": results,
        "launched": launched,
        "queue": rows,
    }
