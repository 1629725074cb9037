"""What the `train` and `compare_precision` flows record in MLflow, on tasks.tracking.

A train run carries the spec as params, the job and policy as tags, the device it was
placed on, the result's metrics, every precision switch and (optionally) the final model.
A comparison's parent run carries the candidates, and per candidate speedup_<policy>,
convergence_delta_<policy> and a verdict tag; each child carries its own speedup and
convergence_delta (1 and 0 for the fp32 baseline), so MLflow's compare view lines them up.

Plain functions first (tests call them without Prefect), task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from typing import Any

import mlflow
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.tracking import (
    close_run,
    log_json,
    log_metrics,
    log_tags,
    open_run,
    tracking_uri,
)
from gpuflow.tasks.training.binding import Binding
from gpuflow.tasks.training.job import result_metrics
from gpuflow.tasks.training.loop import TrainResult, trained_model
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store

log = logging.getLogger(__name__)

Logger = logging.Logger | logging.LoggerAdapter


def open_train_run(spec: TrainSpec, experiment: str, parent_run_id: str | None = None) -> str:
    """The run of one training job, named after it, with the spec as params."""
    return open_run(
        experiment,
        run_name=f"{spec.job_id}",
        tags={"gpuflow.job_id": spec.job_id, "gpuflow.precision_policy": spec.precision},
        params=spec.model_dump(),
        parent_run_id=parent_run_id,
    )


def placement_tags(binding: Binding) -> dict[str, str]:
    """Where the job runs: node, device, SKU, vendor, partition, backend, torch device."""
    res = binding.resource
    return {
        "gpuflow.node": res.node,
        "gpuflow.device_index": str(res.device_index),
        "gpuflow.sku": res.sku,
        "gpuflow.vendor": res.vendor,
        "gpuflow.resource_id": res.resource_id,
        "gpuflow.partition": res.profile or "whole-device",
        "gpuflow.backend": binding.backend_name,
        "gpuflow.torch_device": str(binding.torch_device),
    }


def tag_placement(run_id: str, binding: Binding) -> None:
    log_tags(run_id, placement_tags(binding))


def record_train_results(run_id: str, result: TrainResult, logger: Logger = log) -> None:
    """The result's metrics, precision_switches.json and (``auto``) the A/B evidence in
    precision_decisions.json, with one log line per switch and per A/B."""
    log_metrics(run_id, result_metrics(result))
    switches = [s.to_dict() for s in result.switches]
    log_json(run_id, switches, "precision_switches.json")
    if result.decisions:
        log_json(run_id, result.decisions, "precision_decisions.json")
    for d in result.decisions:
        logger.info(
            "precision A/B over steps %d-%d (%s): %s",
            d["first_step"],
            d["last_step"],
            d["trigger"],
            d["reason"],
        )
    for d in switches:
        logger.info(
            "precision switch at step %d: %s -> %s (%s)", d["step"], d["from"], d["to"], d["reason"]
        )


def log_trained_model(run_id: str, spec: TrainSpec, storage: CheckpointStorage) -> None:
    """The weights of the job's latest checkpoint as the run's MLflow model "model"."""
    import torch

    mlflow.set_tracking_uri(tracking_uri())
    with mlflow.start_run(run_id=run_id):
        mlflow.pytorch.log_model(
            trained_model(spec, open_store(storage)),
            name="model",
            # pickle: the models are plain nn.Modules of this package; pt2 would need a
            # traced example input per model family.
            serialization_format="pickle",
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )


def open_comparison_run(
    spec: TrainSpec, candidates: list[str], threshold: float, experiment: str
) -> str:
    """The parent run of a precision comparison; each policy's train run nests under it."""
    return open_run(
        experiment,
        run_name=f"{spec.job_id}-compare",
        tags={"gpuflow.comparison": "precision", "gpuflow.baseline": "fp32"},
        params={
            "model": spec.model,
            "steps": spec.steps,
            "candidates": ",".join(candidates),
            "threshold": threshold,
        },
    )


def record_comparison(
    parent_run_id: str,
    results: dict[str, dict[str, Any]],
    rows: list[dict[str, Any]],
    logger: Logger = log,
) -> None:
    """The rows of compare_results on the parent (per policy) and on each child run, the
    baseline child's own speedup 1 and delta 0, and comparison.json on the parent."""
    for row in rows:
        policy = row["policy"]
        log_metrics(
            parent_run_id,
            {
                f"speedup_{policy}": row["speedup"],
                f"convergence_delta_{policy}": row["convergence_delta"],
            },
        )
        child = results[policy]["run_id"]
        log_metrics(
            child, {"speedup": row["speedup"], "convergence_delta": row["convergence_delta"]}
        )
        log_tags(child, {"gpuflow.verdict": row["verdict"]})
        log_tags(parent_run_id, {f"gpuflow.verdict_{policy}": row["verdict"]})
        logger.info(
            "%s: speedup %.2fx, convergence delta %.3f%% -> %s",
            policy,
            row["speedup"],
            100 * row["convergence_delta"],
            row["verdict"],
        )
    log_metrics(results["fp32"]["run_id"], {"speedup": 1.0, "convergence_delta": 0.0})
    log_json(parent_run_id, rows, "comparison.json")


# --- Prefect tasks ---------------------------------------------------------------------------
# Tags, metrics, JSON artifacts and an end status are safe to send twice (overwritten, or a
# second metric point of the same value), so those tasks retry. Opening a run and logging a
# model do not: a retry would make a second run or a second logged model.
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

_RETRY = {"retries": 2, "retry_delay_seconds": 2, "cache_policy": NONE}

open_train_run_task = task(open_train_run, name="mlflow-open-train-run", cache_policy=NONE)
tag_placement_task = task(tag_placement, name="mlflow-tag-placement", **_RETRY)
log_trained_model_task = task(log_trained_model, name="mlflow-log-model", cache_policy=NONE)
close_run_task = task(close_run, name="mlflow-close-run", **_RETRY)
open_comparison_run_task = task(
    open_comparison_run, name="mlflow-open-comparison-run", cache_policy=NONE
)


@task(name="mlflow-record-train-results", **_RETRY)
def record_train_results_task(run_id: str, result: TrainResult) -> None:
    record_train_results(run_id, result, get_run_logger())


@task(name="mlflow-record-comparison", **_RETRY)
def record_comparison_task(
    parent_run_id: str, results: dict[str, dict[str, Any]], rows: list[dict[str, Any]]
) -> None:
    record_comparison(parent_run_id, results, rows, get_run_logger())
