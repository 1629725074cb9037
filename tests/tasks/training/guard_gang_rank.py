"""One rank of the numeric guard's 2-rank gloo gang (test_numeric_guard.py): spawned as
its own process, so it lives in an importable module of its own."""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

POISONED_STEP = 3


def guard_rank(rank: int, world_size: int, init_file: str, root: str, spec: Any) -> None:
    """Train ``spec`` as rank ``rank`` of a DDP gang; rank 0 alone sees a non-finite loss
    at POISONED_STEP (its gradients stay finite, so only the agreed verdict makes rank 1
    skip too). Writes the rank's skips and weights to ``root/rank<N>.pkl``."""
    import torch
    import torch.distributed as dist
    from gpuflow.tasks.training import loop
    from gpuflow.tasks.training.distributed.ddp import DataParallel
    from gpuflow.tasks.training.storage import LocalStorage

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    try:
        real = loop.build_workload
        built: list[Any] = []

        def build(spec: Any, device: Any, sku: Any = None, world_size: int = 1) -> Any:
            w = real(spec, device, sku, world_size)
            loss_fn, calls = w.loss_fn, [0]

            def poisoned(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
                loss = loss_fn(out, y)
                if out.requires_grad:  # training forwards only, not eval
                    calls[0] += 1
                    if rank == 0 and calls[0] == POISONED_STEP:
                        return loss + math.inf  # a constant: the gradients stay finite
                return loss

            w.loss_fn = poisoned
            built.append(w)
            return w

        loop.build_workload = build
        parallel = DataParallel(torch.device("cpu"), Path(root) / "staging")
        result = loop.train_loop(spec, LocalStorage(Path(root) / "ck"), parallel=parallel)
        w = built[0]
        out = {
            "skips": result.skips,
            "weights": {k: v.clone() for k, v in w.model.state_dict().items()},
            "finite": all(bool(torch.isfinite(p).all()) for p in w.model.parameters()),
        }
        (Path(root) / f"rank{rank}.pkl").write_bytes(pickle.dumps(out))
    finally:
        dist.destroy_process_group()
