"""Flow `reconcile`: finish (or roll back) remediation incidents whose run is gone.

    find abandoned incidents ─ remediate(take over, per incident) ─ table artifact

Deployed on a schedule (prefect.yaml): a remediation run killed mid-way leaves its incident
open with a claim that lapses; the next reconcile run takes it over, and the job it was
moving is moved (tasks/remediation/reconcile.py says when it is rolled back instead).
"""

from __future__ import annotations

from typing import Any

from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.flows.remediate import remediate
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.remediation.ledger import Ledger
from gpuflow.tasks.remediation.reconcile import (
    MAX_TAKEOVERS,
    ROLL_BACK,
    abandoned_incidents_task,
)
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact


@flow(name="reconcile", log_prints=True)
def reconcile(
    cluster_block: str | None = None,
    notify_block: str | None = None,
    max_takeovers: int = MAX_TAKEOVERS,
    cluster: GpuCluster | None = None,
) -> dict[str, Any]:
    """Take over every abandoned incident: finish it, or roll it back."""
    logger = get_run_logger()
    cluster = cluster or load_cluster(cluster_block)
    ledger = Ledger(cluster.get_inventory().url)
    found = abandoned_incidents_task(ledger, max_takeovers)
    results: dict[str, Any] = {}
    for item in found:
        logger.info(
            "incident %s (%s) was left %s by a run that is gone: %s",
            item.incident_id,
            item.device,
            item.phase,
            item.action,
        )
        out = remediate(
            device=item.device,
            trigger="manual",
            reason=f"reconcile: {item.action} incident {item.incident_id} left {item.phase}",
            take_over=item.incident_id,
            roll_back=item.action == ROLL_BACK,
            notify_block=notify_block,
            cluster=cluster,
            return_state=True,
        )
        results[item.incident_id] = {
            **item.to_dict(),
            "outcome": out.result(raise_on_failure=False).get("status")
            if out.is_completed()
            else str(out.type.value).lower(),
        }
    create_table_artifact(
        [{"incident": k, **v} for k, v in results.items()]
        or [{"incident": "-", "action": "nothing abandoned"}],
        key="reconcile-incidents",
        description="Remediation incidents taken over by this run",
    )
    return {"reconciled": results}
