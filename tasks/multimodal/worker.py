"""One rank of a multi-modal job: the process torchelastic's agent starts.

It binds itself to its unit before CUDA starts (the same binding as every gang's rank,
tasks/training/distributed/gang.py), joins the process group, and runs this rank's part
of the loop (loop.py). Rank 0 (it holds the head) logs the per-step loss and throughput
to MLflow and relays its steps to the launcher (a progress bar); every rank reports its
load to its own unit (the twin turns it into utilization, power and heat).
"""

from __future__ import annotations

import os
from typing import Any

from gpuflow.tasks.training.distributed.gang import bind_this_rank, decode_plan
from gpuflow.tasks.training.distributed.relay import relay_hook


def _every(steps: int, metrics: Any) -> Any:
    """A step hook logging loss and samples/s to MLflow every ``steps`` steps."""

    def log(info: Any) -> None:
        if info.step % steps == 0:
            metrics.log(info.step, {"loss": info.loss, "samples_per_s": info.samples_per_s})

    return log


def multimodal_rank_main(
    spec: Any,  # MultimodalSpec
    store: Any,  # CheckpointStore, opened by the launcher
    plan_json: str,
    backend: str,
    fencing_token: int | None,
    run_id: str | None = None,
    device_backend: tuple[str, str | None] | None = None,
    record_gradients: bool = False,
    relay: Any = None,  # relay.RelayAddress of the launcher's StepRelay
) -> dict[str, Any]:
    units = decode_plan(plan_json)
    rank = int(os.environ["RANK"])
    unit = bind_this_rank(units, int(os.environ["LOCAL_RANK"]), os.environ)

    import torch  # CUDA (if any) initialises after the binding above
    import torch.distributed as dist
    from gpuflow.tasks.multimodal.loop import train_rank
    from gpuflow.tasks.training.distributed.worker import round_store, unit_probe

    torch.set_num_threads(spec.threads_per_rank)
    device = torch.device("cpu") if unit.vendor == "sim" else torch.device("cuda", 0)
    dist.init_process_group(
        backend, store=round_store(), rank=rank, world_size=int(os.environ["WORLD_SIZE"])
    )
    probe = unit_probe(device_backend, unit, spec.job_id, rank)
    metrics = None
    try:
        hooks = []
        if rank == 0:
            hooks += [h for h in (relay_hook(relay),) if h is not None]
            if run_id:
                from gpuflow.tasks.tracking import StepMetricsLogger

                metrics = StepMetricsLogger(run_id)
                hooks.append(_every(spec.log_every, metrics))
        result = train_rank(
            spec,
            store,
            spec.resolved_layout,
            rank,
            device,
            fencing_token=fencing_token,
            hooks=hooks,
            probe=probe,
            record_gradients=record_gradients,
        )
        if metrics is not None:
            metrics.flush()
        result.update(resource_id=unit.resource_id, backend=backend)
        return result
    finally:
        if probe is not None:
            probe.close()
        dist.destroy_process_group()
