"""What DDP's gradient all-reduce costs a rank's step, measured inside real gloo ranks.

Each rank (one thread, CPU) builds the spec's workload, wraps it in DDP and takes its share
of one global batch, then alternates, ``steps`` times each, with a barrier before every
timed piece so both ranks start it together:

* a full step (zero_grad, forward, backward, optimizer step), gradients all-reduced;
* the same step under ``no_sync()``: no all-reduce;
* a bare ``dist.all_reduce`` of a float32 buffer as large as all the gradients.

The first two differ by what the all-reduce adds that backward does not hide (DDP starts
a bucket's reduction while backward still runs): the "exposed" cost. The third is the
collective alone. Medians, slowest rank's. The ranks are plain ``torch.multiprocessing``
processes on a file rendezvous: no gang machinery, so its start-up is not in the figures.
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpuflow.tasks.training.spec import TrainSpec

_WARMUP = 3


def _rank(rank: int, spec: TrainSpec, world_size: int, folder: str, steps: int) -> None:
    from torch.nn.parallel import DistributedDataParallel

    from gpuflow.tasks.training.loop import build_workload

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=world_size
    )
    try:
        w = build_workload(spec, torch.device("cpu"))
        net = DistributedDataParallel(w.model)
        x, y = next(w.sampler)
        per = len(x) // world_size
        x, y = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]

        def step(context: Any) -> float:
            dist.barrier()
            t = time.perf_counter()
            with context:
                w.optimizer.zero_grad(set_to_none=True)
                w.loss_fn(net(x), y).backward()
            w.optimizer.step()
            return time.perf_counter() - t

        grads = torch.zeros(sum(p.numel() for p in w.model.parameters()))

        def all_reduce() -> float:
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(grads)
            return time.perf_counter() - t

        for _ in range(_WARMUP):
            step(nullcontext())
            step(net.no_sync())
        synced, unsynced, bare = [], [], []
        for _ in range(steps):
            synced.append(step(nullcontext()))
            unsynced.append(step(net.no_sync()))
            bare.append(all_reduce())
        row = {
            "synced": statistics.median(synced),
            "no_sync": statistics.median(unsynced),
            "bare": statistics.median(bare),
            "grad_mb": grads.numel() * 4 / (1 << 20),
        }
        Path(folder, f"rank-{rank}.json").write_text(json.dumps(row))
    finally:
        dist.destroy_process_group()


def probe_allreduce(spec: TrainSpec, world_size: int, steps: int, folder: Path) -> dict[str, Any]:
    """DDP step time with and without its all-reduce, and the bare collective (see above)."""
    if world_size < 2 or steps < 1:
        raise ValueError(f"need >= 2 ranks and >= 1 step, got {world_size} and {steps}")
    if spec.resolved_batch_size % world_size:
        raise ValueError(
            f"global batch {spec.resolved_batch_size} does not split into {world_size} ranks"
        )
    folder.mkdir(parents=True, exist_ok=True)
    mp.start_processes(
        _rank,
        args=(spec, world_size, str(folder), steps),
        nprocs=world_size,
        start_method="spawn",
    )
    rows = [json.loads((folder / f"rank-{r}.json").read_text()) for r in range(world_size)]
    return probe_summary(rows, steps)


def probe_summary(rows: list[dict[str, float]], steps: int) -> dict[str, Any]:
    """The ranks' medians as figures: per measure the slowest rank's (the gang waits)."""
    synced = max(r["synced"] for r in rows)
    unsynced = max(r["no_sync"] for r in rows)
    bare = max(r["bare"] for r in rows)
    exposed = max(synced - unsynced, 0.0)  # noise can make a no_sync step the slower one
    return {
        "probe_steps": steps,
        "ddp_step_synced_s": synced,
        "ddp_step_no_sync_s": unsynced,
        "ddp_allreduce_exposed_s": exposed,
        "allreduce_share_of_ddp_step": exposed / synced,
        "bare_allreduce_s": bare,
        "bare_allreduce_share_of_ddp_step": bare / synced,
        "gradient_mb": rows[0]["grad_mb"],
    }
