"""A training job on the fleet: lease, train with tracking and progress, release.

Plain functions first (tests call them without Prefect), task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import DeviceLostError, InvalidRequestError
from gpuflow.tasks.training.binding import Binding, DeviceRequest, lease_device
from gpuflow.tasks.training.checkpoint import checkpoint_manager
from gpuflow.tasks.training.loop import StepInfo, TrainResult, build_workload, train_loop
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store
from gpuflow.tasks.training.utilization import DeviceUtilization
from gpuflow.tasks.worker_queues import owned_node
from prefect import task
from prefect.cache_policies import NONE

log = logging.getLogger(__name__)

LEASE_TTL_S = 300.0
EXPERIMENT = "gpuflow-train"

# Observers in this process that see every step of every job it trains (the CLI's Rich
# progress bar). Flows run in the caller's process when called directly, so a CLI can
# watch a flow it starts without the flow knowing about terminals.
step_observers: list[Callable[[str, int, StepInfo], None]] = []


def preflight(
    spec: TrainSpec, storage: CheckpointStorage, cluster: GpuCluster, device: DeviceRequest
) -> dict:
    """Everything that can be refused is refused here, before a lease or a step.

    Unknown model/policy (TrainSpec), a precision the requested SKU lacks, a bucket that
    does not exist or refuses the credentials, a checkpoint of another model.
    """
    from gpuflow.hardware.skus import sku as sku_of
    from gpuflow.tasks.training.binding import torch_device_for

    backend = cluster.get_backend()
    sku = sku_of(device.sku) if device.sku else None
    workload = build_workload(spec, torch_device_for(backend), sku)  # validates the policy
    manager = checkpoint_manager(storage, spec.job_id, expected_model=workload.fingerprint)
    latest = manager.latest(expected_model=workload.fingerprint)  # another model's: error
    return {"resume_from": latest.checkpoint_id if latest else None, "backend": backend.name}


def acquire(cluster: GpuCluster, device: DeviceRequest, job_id: str) -> Binding:
    inventory = cluster.get_inventory()
    binding = lease_device(
        inventory, cluster.get_backend(), device, owner=job_id, ttl_s=LEASE_TTL_S
    )
    check_owned_node(inventory, binding, job_id)
    inventory.record_job(job_id, {"device": device.model_dump()}, state="running")
    inventory.set_job_state(job_id, "running", resource_ids=[binding.resource.resource_id])
    return binding


def check_owned_node(inventory: Any, binding: Binding, job_id: str) -> None:
    """A worker that owns a node (GPUFLOW_NODE) runs only jobs placed on that node."""
    owned = owned_node()
    if owned and binding.resource.node != owned:
        inventory.release_lease(binding.resource.resource_id, job_id)
        raise InvalidRequestError(
            f"this worker owns node {owned!r} but job {job_id!r} was placed on "
            f"{binding.resource.node!r}: send it to that node's work queue"
        )


def release(cluster: GpuCluster, binding: Binding, job_id: str) -> None:
    inventory = cluster.get_inventory()
    inventory.release_lease(binding.resource.resource_id, job_id)
    cluster.get_backend().end_workload(job_id)


def run_training(
    spec: TrainSpec,
    storage: CheckpointStorage,
    cluster: GpuCluster,
    binding: Binding,
    run_id: str | None = None,
    extra_hooks: tuple[Callable[[StepInfo], None], ...] = (),
) -> TrainResult:
    """The loop on the leased device, with MLflow metrics, lease renewal and control."""
    from gpuflow.tasks.tracking import StepMetricsLogger

    backend = cluster.get_backend()
    inventory = cluster.get_inventory()
    res = binding.resource
    probe = DeviceUtilization(
        backend,
        res.node,
        res.device_index,
        owner=spec.job_id,
        partition_uuid=res.resource_id if res.profile else None,
    )
    hooks: list[Callable[[StepInfo], None]] = list(extra_hooks)
    hooks += [lambda info, obs=obs: obs(spec.job_id, spec.steps, info) for obs in step_observers]
    metrics = StepMetricsLogger(run_id) if run_id else None
    if metrics:

        def log_metrics(info: StepInfo) -> None:
            metrics.log(
                info.step,
                {
                    "loss": info.loss,
                    "samples_per_s": info.samples_per_s,
                    "tokens_per_s": info.tokens_per_s,
                    "precision_bits": 32.0 if info.precision == "fp32" else 16.0,
                    "utilization_ratio": info.utilization_ratio,
                },
            )

        hooks.append(log_metrics)

    def renew(info: StepInfo) -> None:
        if info.step % 50 == 0:  # far inside the TTL, cheap enough to do often
            inventory.renew_lease(res.resource_id, spec.job_id, LEASE_TTL_S)

    hooks.append(renew)

    def checkpointed(cid: str, step: int) -> None:
        inventory.set_job_state(spec.job_id, "running", last_checkpoint_id=cid)

    try:
        result = train_loop(
            spec,
            open_store(storage),
            device=binding.torch_device,
            sku=binding.sku,
            utilization=probe,
            control=inventory,
            hooks=hooks,
            on_checkpoint=checkpointed,
        )
    finally:
        if metrics:
            metrics.flush()
        probe.close()
    inventory.set_job_state(
        spec.job_id,
        "checkpointed" if result.stopped_by_request else "finished",
        last_checkpoint_id=result.last_checkpoint,
    )
    return result


def progress_hook(total_steps: int, every: int = 10) -> Callable[[StepInfo], None]:
    """A Prefect progress artifact that follows the steps (updated every ``every``)."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    artifact_id = create_progress_artifact(
        0.0, description=f"training progress ({total_steps} steps)"
    )

    def hook(info: StepInfo) -> None:
        if info.step % every == 0 or info.step == total_steps:
            update_progress_artifact(artifact_id, 100.0 * info.step / total_steps)

    return hook


def result_metrics(result: TrainResult) -> dict[str, Any]:
    return {
        "final_loss": result.final_loss,
        "eval_loss": result.eval_loss,
        "wall_time_s": result.wall_time_s,
        "train_time_s": result.train_time_s,
        "steps_done": result.steps_done,
        "resumed_from_step": result.resumed_from_step,
        "precision_switches": len(result.switches),
    }


preflight_task = task(preflight, name="preflight", cache_policy=NONE)


def _retry_unless_device_lost(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a crashed loop (it resumes from its checkpoint), but not on a device that is
    gone: that is remediation's job, on another device."""
    try:
        state.result()
    except DeviceLostError:
        return False
    except Exception as exc:  # noqa: BLE001 - any other failure is worth a retry
        return "DeviceLostError" not in repr(exc)
    return True


@task(
    name="train-loop",
    retries=2,
    retry_delay_seconds=3,
    cache_policy=NONE,
    retry_condition_fn=_retry_unless_device_lost,
)
def train_loop_task(
    spec: TrainSpec,
    storage: CheckpointStorage,
    cluster: GpuCluster,
    binding: Binding,
    run_id: str | None,
) -> TrainResult:
    # A retry re-enters train_loop, which resumes from the latest checkpoint, never from zero.
    return run_training(spec, storage, cluster, binding, run_id, (progress_hook(spec.steps),))
