"""What the `edge_deploy` flow shows people: its progress, the plan as a table and a
figure, and the summary it returns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from gpuflow.tasks.edge.deploy import Deployment
from gpuflow.tasks.edge.planning import PlanResult
from gpuflow.tasks.edge.verify import CheckResult

STEPS = ("export", "profile", "plan", "package", "deploy", "check", "measure")
PLAN_FILE = "plan.json"


def progress_steps(
    name: str, shards: int, logger: logging.Logger | logging.LoggerAdapter
) -> Callable[[str], None]:
    """A Prefect progress artifact over STEPS; the callable marks one step done (and logs it)."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    progress = create_progress_artifact(0.0, description=f"edge-deploy {name}: {shards} shards")

    def done(step: str) -> None:
        update_progress_artifact(progress, 100.0 * (STEPS.index(step) + 1) / len(STEPS))
        logger.info("edge-deploy %s: %s done", name, step)

    return done


def plan_rows(result: PlanResult) -> list[dict]:
    """One row per shard of the DP split and of the equal-operator-count split."""
    rows = []
    for label, plan in (("dp", result.dp), ("equal-ops", result.equal_ops)):
        tensors = result.cut_tensors(plan) + ["(output)"]
        for shard in plan.shards:
            rows.append(
                {
                    "split": label,
                    "shard": shard.index,
                    "node": shard.node,
                    "segments": f"{shard.first_segment}-{shard.stop_segment - 1}",
                    "ends_at": tensors[shard.index],
                    "compute_ms": round(shard.compute_ms, 3),
                    "transfer_ms": round(shard.transfer_ms, 3),
                    "weights_mb": round(shard.weight_bytes / 1e6, 2),
                }
            )
    return rows


def stage_figure(result: PlanResult) -> Any:
    """A bar chart of each shard's stage time under both splits, against the ideal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    k = len(result.dp.shards)
    width = 0.4
    for offset, (label, plan) in enumerate((("DP", result.dp), ("equal ops", result.equal_ops))):
        xs = [i + (offset - 0.5) * width for i in range(k)]
        ax.bar(
            xs,
            [s.stage_ms for s in plan.shards],
            width,
            label=f"{label} (balance {plan.balance:.2f})",
        )
    ax.axhline(result.dp.ideal_ms, color="k", linestyle="--", linewidth=1, label="ideal")
    ax.set_xlabel("shard")
    ax.set_ylabel("stage time (ms)")
    ax.set_xticks(range(k))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def artifact_key(name: str) -> str:
    # Prefect artifact keys allow lowercase letters, digits and dashes only.
    return "".join(c if c.isalnum() else "-" for c in name.lower())


def publish_plan(deployment: Deployment, result: PlanResult) -> None:
    """The plan beside the deployment (plan.json) and as a Prefect table artifact."""
    from prefect.artifacts import create_table_artifact

    (deployment.root / PLAN_FILE).write_text(json.dumps(result.summary(), indent=2) + "\n")
    create_table_artifact(
        plan_rows(result),
        key=f"edge-plan-{artifact_key(deployment.name)}",
        description=(
            f"{deployment.source_model}: DP split vs equal-operator-count split over "
            f"{len(result.dp.shards)} nodes"
        ),
    )


def deploy_summary(
    deployment: Deployment,
    previous: str | None,
    run_id: str,
    result: PlanResult,
    check: CheckResult,
    metrics: dict[str, float],
) -> dict:
    """What `edge_deploy` returns for an active deployment."""
    return {
        "name": deployment.name,
        "version": deployment.version,
        "previous": previous,
        "run_id": run_id,
        "addresses": deployment.addresses,
        "model_names": deployment.model_names,
        "cut_tensors": result.cut_tensors(),
        "nodes": [s.node for s in result.dp.shards],
        "stage_ms_predicted": [s.stage_ms for s in result.dp.shards],
        "balance": result.dp.balance,
        "balance_equal_ops": result.equal_ops.balance,
        "check": check.to_dict(),
        **metrics,
    }
