"""Flow `dvfs`: the DVFS controller for ``duration_s``, then its record in MLflow.

    restore what a killed predecessor left (restore_stale)
      ─ tick every interval_s: per device probe ─ choose ─ watch (tasks/energy/controller.py)
      ─ put every device back (also on an exception or a cancel)
      ─ record: totals, decisions, Pareto and curve plots (experiment gpuflow-energy)

The deployment runs it on an interval schedule of about ``duration_s``, so one run follows
the last; each run starts by cleaning what the last one left if it was killed, and its
devices start their searches afresh (a job's first minutes at the highest setting are the
reference). Devices whose job pins its own setting or tunes itself are left alone.
"""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.energy.controller import (
    DEFAULT_DRIFT_INTERVALS,
    DEFAULT_HYSTERESIS,
    DEFAULT_WARMUP_S,
    MIN_INTERVAL_S,
    TickReport,
    check_interval_s,
    run_controller,
)
from gpuflow.tasks.energy.controller_record import record_controller_run
from gpuflow.tasks.energy.optimizer import DEFAULT_SLOWDOWN, Objective
from gpuflow.tasks.node_scope import node_backend
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE
from prefect.runtime import flow_run

LOGGED = ("chosen", "redecide", "restored", "pinned", "lost", "error")


# Tasks, so both show in the UI; no retries: a rerun would open a second MLflow run, and a
# second control run would redo the searches.
control_task = task(run_controller, name="dvfs-control", cache_policy=NONE)
record_task = task(record_controller_run, name="record-dvfs", cache_policy=NONE)


@flow(name="dvfs", log_prints=True)
def dvfs_controller(
    cluster_block: str | None = None,
    interval_s: float = MIN_INTERVAL_S,
    slowdown: float | None = DEFAULT_SLOWDOWN,
    eta: float | None = None,
    duration_s: float = 600.0,
    hysteresis: float = DEFAULT_HYSTERESIS,
    drift_intervals: int = DEFAULT_DRIFT_INTERVALS,
    node: str | None = None,
    warmup_s: float = DEFAULT_WARMUP_S,
) -> dict[str, Any]:
    """Control power limits for ``duration_s`` seconds, sampling every ``interval_s``
    (>= 5). ``eta`` (Zeus's cost) replaces the ``slowdown`` bound when given. ``node``:
    that node only (a host's own controller). ``warmup_s``: how long a new job runs at the
    highest setting before the search measures it."""
    logger = get_run_logger()
    interval = check_interval_s(interval_s)
    objective = Objective(slowdown=None, eta=eta) if eta is not None else Objective(slowdown)
    cluster = load_cluster(cluster_block)
    backend = node_backend(cluster.get_backend(), node)
    inventory = cluster.get_inventory()
    holder = f"dvfs:{flow_run.get_id() or 'local'}"

    def on_tick(report: TickReport) -> None:
        for e in report.events:
            if e.action in LOGGED:
                logger.info("%s %s (%s): %s", e.device, e.action, e.job_id, e.detail)

    try:
        result = control_task(
            backend,
            inventory,
            objective=objective,
            interval_s=interval,
            duration_s=duration_s,
            holder=holder,
            hysteresis=hysteresis,
            drift_intervals=drift_intervals,
            warmup_s=warmup_s,
            on_tick=on_tick,
        )
    finally:
        inventory.close()
    for c in result.cleaned:
        logger.warning("put back what %s left on %s:%s", c["holder"], c["node"], c["index"])
    params = {
        "interval_s": interval,
        "objective": objective.describe(),
        "duration_s": duration_s,
        "hysteresis": hysteresis,
        "drift_intervals": drift_intervals,
        "warmup_s": warmup_s,
        "node": node,
        "backend": backend.name,
    }
    run_id = record_task(result, params)
    return {**result.to_dict(), "mlflow_run_id": run_id}
