"""Flow `train`: preflight ─ open run ─ place (lease) ─ tag placement ─ train (retries
resume) ─ release ─ record results ─ log model ─ close run.

A spec with ``gpus`` N > 1 is a gang: N units placed together, trained as N ranks on
torch.distributed (tasks/training/distributed/), world size and units tagged on the run.
One unit trains as a gang of one rank too when its spec asks for FSDP2 or it resumes a
gang's sharded checkpoint (an elastic gang the scheduler shrank to one unit).

The MLflow run carries the spec as params, loss/throughput/precision per step, every
precision switch, device and SKU tags, and the final model. A run whose flow fails after it
was opened is marked FAILED.
"""

from __future__ import annotations

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.tasks.cluster import load_cluster
from gpuflow.tasks.launching import DeploymentLauncher
from gpuflow.tasks.remediation.launch import remember_launch
from gpuflow.tasks.scheduling.train_placement import (
    gang_placement_task,
    placement_for_train_task,
    release_placement_task,
)
from gpuflow.tasks.tracking import fail_on_error
from gpuflow.tasks.training.binding import DeviceRequest
from gpuflow.tasks.training.distributed.tasks import tag_gang_task, train_gang_task
from gpuflow.tasks.training.job import (
    EXPERIMENT,
    check_owned_node,
    preflight_task,
    train_loop_task,
    trains_as_gang,
)
from gpuflow.tasks.training.recording import (
    close_run_task,
    log_trained_model_task,
    open_train_run_task,
    record_train_results_task,
    tag_placement_task,
)
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

    run_id = open_train_run_task(spec, experiment, parent_run_id)
    with fail_on_error(run_id):
        if trains_as_gang(spec, pre):
            result, units = _train_gang(
                spec, device, storage, cluster, run_id, priority, preempt, wait_s
            )
        else:
            result, units = _train_one(
                spec, device, storage, cluster, run_id, priority, preempt, wait_s
            )
        record_train_results_task(run_id, result)
        if log_model and not result.stopped_by_request:
            log_trained_model_task(run_id, spec, storage)
    close_run_task(run_id, "FINISHED")
    # Where it ran (rank 0's unit first): compare_precision pins its other arms there.
    placement = {"units": [b.resource.resource_id for b in units], "sku": units[0].resource.sku}
    return {"run_id": run_id, **result.to_dict(), "placement": placement}


def _train_one(spec, device, storage, cluster, run_id, priority, preempt, wait_s):
    # The scheduler places it (homogeneous, by policy and priority) and leases for it; a
    # job the `schedule` flow already placed gets that placement.
    binding = placement_for_train_task(
        cluster, device, spec.job_id, priority=priority, preempt=preempt, wait_s=wait_s
    )
    _remember(cluster, spec, storage, device, run_id)
    tag_placement_task(run_id, binding)
    ok, stopped = False, False
    try:
        check_owned_node(cluster.get_inventory(), binding, spec.job_id)
        result = train_loop_task(spec, storage, cluster, binding, run_id)
        ok, stopped = True, result.stopped_by_request
    finally:
        release_placement_task(cluster, binding, spec.job_id, ok=ok, stopped_by_request=stopped)
    return result, [binding]


def _train_gang(spec, device, storage, cluster, run_id, priority, preempt, wait_s):
    # N units of one SKU, all or none (on one node, or spec.nodes nodes); one rank each,
    # one torchelastic agent per node.
    bindings = gang_placement_task(
        cluster,
        device,
        spec.job_id,
        spec.gpus,
        priority=priority,
        preempt=preempt,
        wait_s=wait_s,
        nodes=spec.nodes,
    )
    _remember(cluster, spec, storage, device, run_id)
    tag_placement_task(run_id, bindings[0])
    ok, stopped = False, False
    try:
        # This run hosts rank 0's node; the other nodes' agents start on their own.
        check_owned_node(cluster.get_inventory(), bindings[0], spec.job_id)
        result, gang = train_gang_task(spec, storage, cluster, bindings, run_id)
        tag_gang_task(run_id, gang)
        ok, stopped = True, result.stopped_by_request
    finally:
        release_placement_task(cluster, bindings[0], spec.job_id, ok=ok, stopped_by_request=stopped)
    return result, bindings


def _remember(cluster, spec, storage, device, run_id) -> None:
    # How to relaunch this job elsewhere if its device fails (remediation reads it).
    remember_launch(
        cluster.get_inventory(),
        spec,
        storage,
        device,
        launcher=DeploymentLauncher.name,
        run_id=run_id,
    )
