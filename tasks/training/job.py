"""A training job on the fleet: lease, train with tracking and progress, release.

An attempt is fenced end to end: its leases belong to (job, attempt) and are renewed by a
LeaseKeeper thread every TTL/3, whatever a step costs; every job-state write is a
compare-and-swap on that attempt (hardware.inventory lifecycle); every checkpoint carries
the lease's fencing token. Once the keeper finds a lease gone the loop raises
LeaseLostError at its next step and the attempt writes nothing more.

Plain functions first (tests call them without Prefect), task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.blocks.gpu_cluster import GpuCluster
from gpuflow.hardware.backend import DeviceLostError, InvalidRequestError
from gpuflow.hardware.inventory import JobState, LeaseLostError
from gpuflow.hardware.inventory.keeper import LeaseKeeper
from gpuflow.tasks.energy.job_energy import JobEnergy
from gpuflow.tasks.energy.progress import progress_publisher
from gpuflow.tasks.training import control  # its step_observers, looked up at each run
from gpuflow.tasks.training.binding import (
    Binding,
    DeviceRequest,
    attempt_resources,
    lease_device,
)
from gpuflow.tasks.training.checkpoint import LAYOUT_DCP, LAYOUT_TORCH, checkpoint_manager
from gpuflow.tasks.training.control import FencedControl
from gpuflow.tasks.training.loop import (
    StepInfo,
    TrainResult,
    build_workload,
    train_loop,
)
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import open_store
from gpuflow.tasks.training.utilization import DeviceUtilization
from gpuflow.tasks.worker_queues import owned_node
from prefect import task
from prefect.cache_policies import NONE

log = logging.getLogger(__name__)

LEASE_TTL_S = 300.0
EXPERIMENT = "gpuflow-train"


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
    # The newest manifest says which model it holds (another model's: refused) and how it
    # was written; nothing is loaded here.
    manager.refuse_other_model(workload.fingerprint)
    newest = next(iter(manager.committed()), None)
    return {
        "resume_from": newest[0] if newest else None,
        "layout": newest[1].get("layout", LAYOUT_TORCH) if newest else None,
        "backend": backend.name,
    }


def trains_as_gang(spec: TrainSpec, pre: dict) -> bool:
    """A gang under torch.distributed (N ranks, FSDP2, or one rank resuming a gang's
    sharded checkpoint: an elastic gang shrunk to one unit), else one plain process."""
    return spec.distributed or pre.get("layout") == LAYOUT_DCP


def acquire(cluster: GpuCluster, device: DeviceRequest, job_id: str) -> Binding:
    """Lease a device for the job's next attempt and place the job there."""
    inventory = cluster.get_inventory()
    job = inventory.record_job(job_id, {"device": device.model_dump()})
    attempt = job.attempt + 1
    binding = lease_device(
        inventory, cluster.get_backend(), device, owner=job_id, ttl_s=LEASE_TTL_S, attempt=attempt
    )
    check_owned_node(inventory, binding, job_id)
    rid = binding.resource.resource_id
    try:
        # The lease we hold proves an older, still active attempt is gone: supersede it.
        inventory.place_job(job_id, [rid], attempt=attempt, supersede=True)
    except Exception:
        inventory.release_lease(rid, job_id, attempt=attempt)
        raise
    return binding


def check_owned_node(inventory: Any, binding: Binding, job_id: str) -> None:
    """A worker that owns a node (GPUFLOW_NODE) runs only jobs placed on that node."""
    owned = owned_node()
    if owned and binding.resource.node != owned:
        inventory.release_lease(binding.resource.resource_id, job_id, attempt=binding.lease.attempt)
        raise InvalidRequestError(
            f"this worker owns node {owned!r} but job {job_id!r} was placed on "
            f"{binding.resource.node!r}: send it to that node's work queue"
        )


def release(cluster: GpuCluster, binding: Binding, job_id: str) -> None:
    inventory = cluster.get_inventory()
    # Only this attempt's lease: a stale attempt must not end its successor's.
    inventory.release_lease(binding.resource.resource_id, job_id, attempt=binding.lease.attempt)
    cluster.get_backend().end_workload(job_id)


def run_training(
    spec: TrainSpec,
    storage: CheckpointStorage,
    cluster: GpuCluster,
    binding: Binding,
    run_id: str | None = None,
    extra_hooks: tuple[Callable[[StepInfo], None], ...] = (),
    lease_keeper: Callable[..., LeaseKeeper] = LeaseKeeper,
) -> TrainResult:
    """The loop on the leased device, with MLflow metrics, lease renewal and control.

    ``lease_keeper`` builds the keeper (tests pass one on a fake clock). Raises
    LeaseLostError when the attempt's lease is lost: nothing is written after that.
    """
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
    hooks += [
        lambda info, obs=obs: obs(spec.job_id, spec.steps, info) for obs in control.step_observers
    ]
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

    attempt = binding.lease.attempt
    units = attempt_resources(inventory, spec.job_id, attempt, res.resource_id)
    keeper = lease_keeper(inventory, spec.job_id, attempt, units, LEASE_TTL_S)
    energy = JobEnergy(spec, backend, inventory, res.node, res.device_index, probe.refresh_pace)
    hooks += energy.hooks
    # What an out-of-process DVFS controller measures time per step from (flows/dvfs.py).
    hooks.append(progress_publisher(inventory, spec.job_id, attempt=attempt))

    def checkpointed(cid: str, step: int) -> None:
        keeper.check()
        inventory.transition_job(spec.job_id, expect_attempt=attempt, last_checkpoint_id=cid)

    try:
        keeper.start()
        inventory.transition_job(spec.job_id, JobState.RUNNING, expect_attempt=attempt)
        energy.start()
        result = train_loop(
            spec,
            open_store(storage),
            device=binding.torch_device,
            sku=binding.sku,
            utilization=probe,
            control=FencedControl(inventory, spec.job_id, attempt, keeper),
            hooks=hooks,
            on_checkpoint=checkpointed,
            guard=keeper.check,
            fencing_token=binding.lease.token,
        )
        keeper.check()
        energy.finish(result, run_id)
    finally:
        energy.close()  # the job's power limit goes back, whatever happened
        keeper.stop()
        if metrics:
            metrics.flush()
        probe.close()
    inventory.transition_job(
        spec.job_id,
        JobState.STOPPED if result.stopped_by_request else JobState.FINISHED,
        expect_attempt=attempt,
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
        **_ab_metrics(result),
        **{k: v for k, v in result.energy.items() if isinstance(v, int | float)},
    }


def _ab_metrics(result: TrainResult) -> dict[str, float]:
    """What ``auto``'s last completed A/B measured: the reduced dtype's step speedup over
    fp32 on this device (the compare view lines it up with the run's own speedup)."""
    done = [d for d in result.decisions if d["timed_steps"] > 0]
    if not done:
        return {}
    last = done[-1]
    return {"precision_ab_speedup": last["speedup"], "precision_ab_probes": float(len(done))}


preflight_task = task(preflight, name="preflight", cache_policy=NONE)


def _retry_unless_device_lost(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a crashed loop (it resumes from its checkpoint), but not on a device that is
    gone (remediation's job, on another device) nor after a lost lease (the attempt is
    fenced)."""
    try:
        state.result()
    except (DeviceLostError, LeaseLostError):
        return False  # a lost lease: a newer attempt owns the job now
    except Exception as exc:  # noqa: BLE001 - any other failure is worth a retry
        return not any(name in repr(exc) for name in ("DeviceLostError", "LeaseLostError"))
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
