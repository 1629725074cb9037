"""Flow `train`: preflight ─ lease ─ train (retries resume) ─ release ─ record.

The MLflow run carries the spec as params, loss/throughput/precision per step, every
precision switch, device and SKU tags, and the final model.
"""

from __future__ import annotations

import json

import mlflow
import torch
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.remediation.launch import remember_launch
from gpuflow.tasks.scheduling.train_placement import (
    placement_for_train_task,
    release_placement_task,
)
from gpuflow.tasks.tracking import flat_params, use_experiment
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.job import (
    EXPERIMENT,
    check_owned_node,
    preflight_task,
    result_metrics,
    train_loop_task,
)
from gpuflow.tasks.training.loop import trained_model
from gpuflow.tasks.training.spec import TrainSpec
from prefect import flow, get_run_logger


def _on_failure(flow, flow_run, state) -> None:
    # Imported here: flows/remediate.py imports this module's neighbours, not the reverse.
    from gpuflow.flows.remediate import remediate_on_train_failure

    remediate_on_train_failure(flow, flow_run, state)


@flow(name="train", log_prints=True, on_failure=[_on_failure])
def train(
    spec: TrainSpec,
    device: DeviceRequest | None = None,
    storage: CheckpointStorage | None = None,
    cluster_block: str | None = None,
    experiment: str = EXPERIMENT,
    parent_run_id: str | None = None,
    log_model: bool = True,
    priority: int = 0,
    preempt: bool = False,
    wait_s: float = 0.0,
) -> dict:
    """Train ``spec`` on a leased device; resumes from its latest checkpoint if it has one."""
    logger = get_run_logger()
    device = device or DeviceRequest()
    storage = storage or CheckpointStorage()
    cluster = load_cluster(cluster_block)
    pre = preflight_task(spec, storage, cluster, device)
    if pre["resume_from"]:
        logger.info("job %s will resume from %s", spec.job_id, pre["resume_from"])

    experiment_id = use_experiment(experiment)
    tags = {"gpuflow.job_id": spec.job_id, "gpuflow.precision_policy": spec.precision}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, run_name=f"{spec.job_id}", tags=tags)
    run_id = run.info.run_id
    client.log_batch(
        run_id,
        params=[mlflow.entities.Param(k, v) for k, v in flat_params("", spec.model_dump()).items()],
    )

    # The scheduler places it (homogeneous, by policy and priority) and leases for it; a job
    # the `schedule` flow already placed gets that placement.
    binding = placement_for_train_task(
        cluster, device, spec.job_id, priority=priority, preempt=preempt, wait_s=wait_s
    )
    # How to relaunch this job elsewhere if its device fails (remediation reads it).
    remember_launch(
        cluster.get_inventory(), spec, storage, device, launcher="deployment", run_id=run_id
    )
    res = binding.resource
    for key, value in {
        "gpuflow.node": res.node,
        "gpuflow.device_index": str(res.device_index),
        "gpuflow.sku": res.sku,
        "gpuflow.vendor": res.vendor,
        "gpuflow.resource_id": res.resource_id,
        "gpuflow.partition": res.profile or "whole-device",
        "gpuflow.backend": binding.backend_name,
        "gpuflow.torch_device": str(binding.torch_device),
    }.items():
        client.set_tag(run_id, key, value)
    status, stopped = "FAILED", False
    try:
        check_owned_node(cluster.get_inventory(), binding, spec.job_id)
        result = train_loop_task(spec, storage, cluster, binding, run_id)
        status, stopped = "FINISHED", result.stopped_by_request
    finally:
        release_placement_task(
            cluster, binding, spec.job_id, ok=status == "FINISHED", stopped_by_request=stopped
        )
        if status == "FAILED":
            client.set_terminated(run_id, "FAILED")

    for key, value in result_metrics(result).items():
        if value is not None:
            client.log_metric(run_id, key, float(value))
    client.log_text(
        run_id,
        json.dumps([s.to_dict() for s in result.switches], indent=2),
        "precision_switches.json",
    )
    for s in result.switches:
        d = s.to_dict()
        logger.info(
            "precision switch at step %d: %s -> %s (%s)", d["step"], d["from"], d["to"], d["reason"]
        )
    if log_model and not result.stopped_by_request:
        with mlflow.start_run(run_id=run_id):
            mlflow.pytorch.log_model(
                trained_model(spec, storage.store()),
                name="model",
                # pickle: the models are plain nn.Modules of this package; pt2 would need
                # a traced example input per model family.
                serialization_format="pickle",
                pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
            )
    client.set_terminated(run_id, "FINISHED")
    return {"run_id": run_id, **result.to_dict()}
