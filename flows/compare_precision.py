"""Flow `compare_precision`: one job under the fp32 baseline and each candidate policy.

open parent run ─┬─ train(fp32)   child run
                 ├─ train(auto)   child run ─┐
                 └─ train(bf16)   child run ─┴─ compare ─ record ─ close parent run

Every arm runs on the units the baseline was placed on (one device, one SKU; a gang's
units), so a ratio never compares two devices: the first arm's placement pins the others.

speedup = baseline wall time / candidate wall time; convergence_delta = |candidate's final
eval loss - baseline's| / baseline's. A candidate passes when its delta is under the
threshold (default 0.5 %). Both go on the parent (per candidate) and on each child, so
MLflow's compare view shows them side by side. A parent run whose flow fails is marked
FAILED.
"""

from __future__ import annotations

from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows.train import train
from gpuflow.tasks.tracking import fail_on_error
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.comparison import compare_results
from gpuflow.tasks.training.recording import (
    close_run_task,
    open_comparison_run_task,
    record_comparison_task,
)
from gpuflow.tasks.training.spec import TrainSpec
from prefect import flow
from prefect.artifacts import create_table_artifact

EXPERIMENT = "gpuflow-compare-precision"
POLICIES = ("fp32", "bf16", "fp16", "auto")


def pinned_to(placement: dict[str, Any], asked: DeviceRequest | None) -> DeviceRequest:
    """The request for the units ``placement`` names (the baseline's), same SKU and
    partition profile as asked."""
    units = list(placement["units"])
    base = asked or DeviceRequest()
    return base.model_copy(
        update={
            "sku": placement["sku"],
            "resource_id": units[0] if len(units) == 1 else None,
            "resource_ids": units if len(units) > 1 else None,
        }
    )


@flow(name="compare_precision", log_prints=True)
def compare_precision(
    spec: TrainSpec,
    candidates: list[str] | None = None,
    device: DeviceRequest | None = None,
    storage: CheckpointStorage | None = None,
    threshold: float = 0.005,
    cluster_block: str | None = None,
) -> dict[str, Any]:
    candidates = candidates or ["auto"]
    bad = [c for c in candidates if c not in POLICIES]
    if bad:
        raise ValueError(f"unknown candidate policies {bad}; valid: {', '.join(POLICIES)}")
    parent_id = open_comparison_run_task(spec, candidates, threshold, EXPERIMENT)
    with fail_on_error(parent_id):
        results: dict[str, dict] = {}
        pinned = device
        for policy in ["fp32", *candidates]:
            job = spec.model_copy(update={"precision": policy, "job_id": f"{spec.job_id}-{policy}"})
            results[policy] = train(
                job,
                device=pinned,
                storage=storage,
                cluster_block=cluster_block,
                experiment=EXPERIMENT,
                parent_run_id=parent_id,
                log_model=False,
            )
            if pinned is device:
                pinned = pinned_to(results[policy]["placement"], device)
        rows = compare_results(results, threshold)
        record_comparison_task(parent_id, results, rows)
    close_run_task(parent_id, "FINISHED")
    create_table_artifact(
        rows, key="precision-comparison", description=f"{spec.model}: fp32 vs {candidates}"
    )
    return {"parent_run_id": parent_id, "rows": rows}
