"""Flow `schedule`: drain the queues.

pass (reap ─ place ─ preempt: checkpoint-and-stop, wait for acks ─ grow) ─┬─ launch(job) ─┐
                                                                          └─ ...          ├─ (in-process: next pass) ─ queue artifact

Deployed on an interval (prefect.yaml), each run is one pass plus the launches: placed
jobs start through the `train` deployment when it exists (fire and forget; the next run
reaps them), else in this process, one after the other, with a new pass after each round
so a preempted job resumes as soon as its preemptor is done.
"""

from __future__ import annotations

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.launching import DeploymentLauncher
from gpuflow.tasks.scheduling.launch import (
    launch_placed_task,
    queue_rows_task,
    resolve_launch,
    schedule_pass_task,
)
from gpuflow.tasks.scheduling.model import SchedulerConfig
from gpuflow.tasks.scheduling.runner import InlineLauncher, run_placed_task
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact


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
) -> dict:
    """One pass over the queues (more, in-process, until nothing new starts)."""
    logger = get_run_logger()
    cluster = load_cluster(cluster_block)
    storage = storage or CheckpointStorage()
    config = SchedulerConfig.from_env(policy=policy, preemption=preemption, queue_depth=queue_depth)
    mode = resolve_launch(launch, train_deployment)
    deployments, inline = DeploymentLauncher(train_deployment), InlineLauncher(cluster, storage)
    passes: list[dict] = []
    results: dict[str, dict] = {}
    launched: dict[str, str] = {}
    for _ in range(max(1, max_rounds)):
        report = schedule_pass_task(cluster, config, ack_timeout_s)
        passes.append(report)
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
                receipt = launch_placed_task(cluster, job_id, deployments, cluster_block, storage)
                launched[job_id] = receipt.get("flow_run_id", "")
                continue
            receipt = run_placed_task(cluster, job_id, inline, cluster_block)
            if receipt.get("result"):
                results[job_id] = {
                    k: receipt["result"][k]
                    for k in (
                        "steps_done",
                        "resumed_from_step",
                        "stopped_by_request",
                        "run_id",
                        "resource_id",
                    )
                }
        if mode != "in-process":
            break  # deployments run elsewhere; the next scheduled run reaps them
    rows = queue_rows_task(cluster)
    create_table_artifact(
        rows or [{"job": "-", "state": "queue empty"}],
        key="schedule-queue",
        description="Scheduled jobs after this run (queued in order, then running)",
    )
    return {
        "launch": mode,
        "passes": passes,
        "results": results,
        "launched": launched,
        "queue": rows,
    }
