"""Flow `compare_precision`: one job under the fp32 baseline and each candidate policy.

parent MLflow run ─┬─ train(fp32)      child run
                   ├─ train(auto)      child run  ─┐
                   └─ train(bf16)      child run  ─┴─ speedup, convergence_delta, verdict

speedup = baseline wall time / candidate wall time; convergence_delta = |candidate's final
eval loss - baseline's| / baseline's. A candidate passes when its delta is under the
threshold (default 0.5 %). Both go on the parent (per candidate) and on each child, so
MLflow's compare view shows them side by side.
"""

from __future__ import annotations

import json
from typing import Any

import mlflow
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows.train import train
from gpuflow.tasks.tracking import use_experiment
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.comparison import compare_results
from gpuflow.tasks.training.spec import TrainSpec
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

EXPERIMENT = "gpuflow-compare-precision"


@flow(name="compare_precision", log_prints=True)
def compare_precision(
    spec: TrainSpec,
    candidates: list[str] | None = None,
    device: DeviceRequest | None = None,
    storage: CheckpointStorage | None = None,
    threshold: float = 0.005,
    cluster_block: str | None = None,
) -> dict[str, Any]:
    logger = get_run_logger()
    candidates = candidates or ["auto"]
    bad = [c for c in candidates if c not in ("fp32", "bf16", "fp16", "auto")]
    if bad:
        raise ValueError(f"unknown candidate policies {bad}; valid: fp32, bf16, fp16, auto")
    experiment_id = use_experiment(EXPERIMENT)
    client = mlflow.MlflowClient()
    parent = client.create_run(
        experiment_id,
        run_name=f"{spec.job_id}-compare",
        tags={"gpuflow.comparison": "precision", "gpuflow.baseline": "fp32"},
    )
    parent_id = parent.info.run_id
    client.log_param(parent_id, "model", spec.model)
    client.log_param(parent_id, "steps", spec.steps)
    client.log_param(parent_id, "candidates", ",".join(candidates))
    client.log_param(parent_id, "threshold", threshold)

    results: dict[str, dict] = {}
    for policy in ["fp32", *candidates]:
        job = spec.model_copy(update={"precision": policy, "job_id": f"{spec.job_id}-{policy}"})
        results[policy] = train(
            job,
            device=device,
            storage=storage,
            cluster_block=cluster_block,
            experiment=EXPERIMENT,
            parent_run_id=parent_id,
            log_model=False,
        )

    rows = compare_results(results, threshold)
    for row in rows:
        c = row["policy"]
        client.log_metric(parent_id, f"speedup_{c}", row["speedup"])
        client.log_metric(parent_id, f"convergence_delta_{c}", row["convergence_delta"])
        child = results[c]["run_id"]
        client.log_metric(child, "speedup", row["speedup"])
        client.log_metric(child, "convergence_delta", row["convergence_delta"])
        client.set_tag(child, "gpuflow.verdict", row["verdict"])
        client.set_tag(parent_id, f"gpuflow.verdict_{c}", row["verdict"])
        logger.info(
            "%s: speedup %.2fx, convergence delta %.3f%% -> %s",
            c,
            row["speedup"],
            100 * row["convergence_delta"],
            row["verdict"],
        )
    client.log_metric(results["fp32"]["run_id"], "speedup", 1.0)
    client.log_metric(results["fp32"]["run_id"], "convergence_delta", 0.0)
    client.log_text(parent_id, json.dumps(rows, indent=2), "comparison.json")
    client.set_terminated(parent_id, "FINISHED")
    create_table_artifact(
        rows, key="precision-comparison", description=f"{spec.model}: fp32 vs {candidates}"
    )
    return {"parent_run_id": parent_id, "rows": rows}
