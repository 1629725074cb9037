"""What the `edge_deploy` flow records in MLflow (experiment "edge"), on tasks.tracking.

The run of one deployed version carries its settings as params, name, version, opset and
status as tags, the plan (plan.json), the shard manifests (manifests.json), a figure of
the stage times, the balance of the DP split and of the equal-operator-count split, the
check's max abs diff, latency and throughput.

Plain functions first (tests call them without Prefect), task wrappers at the bottom.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.deploy import Deployment
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.package import PackagedShard
from gpuflow.tasks.edge.planning import PlanResult
from gpuflow.tasks.edge.report import stage_figure
from gpuflow.tasks.edge.verify import CheckResult
from gpuflow.tasks.tracking import (
    close_run,
    fail_on_error,
    log_figure,
    log_json,
    log_metrics,
    log_tags,
    open_run,
)

log = logging.getLogger(__name__)

STATUS_TAG = "gpuflow.edge.status"
# The deployment statuses a failed flow leaves behind that the run's status tag repeats.
FAILED_STATUSES = ("failed", "rolled-back")
# An unanswered check's max abs diff is inf; MLflow stores finite numbers only.
_MAX_DIFF = 1e30


def open_edge_run(
    experiment: str,
    deployment: Deployment,
    nodes: list[EdgeNode],
    *,
    seed: int,
    overrides: dict | None,
    atol: float,
    profile_runs: int,
    profile_warmup: int,
) -> str:
    """The run of one version: ``<name>-<version>``, with the deployment's settings."""
    return open_run(
        experiment,
        run_name=f"{deployment.name}-{deployment.version}",
        tags={"gpuflow.edge.name": deployment.name, "gpuflow.edge.version": deployment.version},
        params={
            "model": deployment.source_model,
            "shards": len(nodes),
            "mode": deployment.mode,
            "seed": seed,
            "nodes": ",".join(n.name for n in nodes),
            "version": deployment.version,
            "overrides": json.dumps(overrides or {}),
            "atol": atol,
            "profile_runs": profile_runs,
            "profile_warmup": profile_warmup,
        },
    )


def record_export(run_id: str, exported: ExportedModel) -> None:
    log_tags(run_id, {"gpuflow.edge.opset": str(exported.opset)})


def record_plan(run_id: str, result: PlanResult, packaged: list[PackagedShard]) -> None:
    """plan.json, manifests.json, stage_ms.png and the balance of both splits."""
    log_json(run_id, result.summary(), "plan.json")
    log_json(
        run_id, {p.manifest.model_name: p.manifest.to_dict() for p in packaged}, "manifests.json"
    )
    import matplotlib.pyplot as plt

    figure = stage_figure(result)
    try:
        log_figure(run_id, figure, "stage_ms.png")
    finally:
        plt.close(figure)  # pyplot keeps every open figure alive
    log_metrics(
        run_id,
        {
            "balance": result.dp.balance,
            "balance_equal_ops": result.equal_ops.balance,
            "bottleneck_ms": result.dp.bottleneck_ms,
            "bottleneck_equal_ops_ms": result.equal_ops.bottleneck_ms,
            "ideal_ms": result.dp.ideal_ms,
            "profiled_total_ms": sum(result.segment_ms),
            "cut_points": len(result.cuts.cuts),
        },
    )


def record_check(run_id: str, check: CheckResult) -> None:
    log_metrics(run_id, {"max_abs_diff": min(check.max_abs_diff, _MAX_DIFF)})


def finish_edge_run(run_id: str, metrics: dict[str, float]) -> None:
    """An active deployment's latency and throughput; the run tagged active and FINISHED."""
    log_metrics(run_id, metrics)
    log_tags(run_id, {STATUS_TAG: "active"})
    close_run(run_id, "FINISHED")


@contextmanager
def failed_run_on_error(run_id: str, deployment: Deployment) -> Iterator[str]:
    """If the body raises: the run tagged with the deployment's status when that is a
    failure (failed, rolled-back), and marked FAILED."""
    with fail_on_error(run_id):
        try:
            yield run_id
        except BaseException:
            if deployment.status in FAILED_STATUSES:
                try:
                    log_tags(run_id, {STATUS_TAG: deployment.status})
                except Exception:  # noqa: BLE001 - never mask the body's error
                    log.warning("could not tag MLflow run %s", run_id, exc_info=True)
            raise


# --- Prefect tasks ---------------------------------------------------------------------------
# Tags, metrics, artifacts and an end status are safe to send twice (overwritten, or a
# second metric point of the same value), so those tasks retry; opening a run does not (a
# retry would open a second run).
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

_RETRY = {"retries": 2, "retry_delay_seconds": 2, "cache_policy": NONE}

open_edge_run_task = task(open_edge_run, name="mlflow-open-edge-run", cache_policy=NONE)
record_export_task = task(record_export, name="mlflow-record-export", **_RETRY)
record_plan_task = task(record_plan, name="mlflow-record-plan", **_RETRY)
record_check_task = task(record_check, name="mlflow-record-check", **_RETRY)
finish_edge_run_task = task(finish_edge_run, name="mlflow-finish-edge-run", **_RETRY)
