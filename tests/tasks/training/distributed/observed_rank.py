"""The real rank process (worker.rank_main) with what test_fsdp.py must see from inside it.

A test patches ``launch.rank_main`` with ``observed_rank_main``; the agent starts it in
each rank process (spawn: it is imported from here by name). Before the rank runs it may
give this CPU native bf16 (``CPU_FLAGS_ENV`` names a cpuinfo file, as test_precision.py's
fixtures do in one process: the twin's ranks train on this machine's CPU, whatever it
has). Its result then carries ``observed``: each parameter's local and full element
count once FSDP2 has sharded the model, the dtypes its shards are kept in, the dtypes
the linear layers computed with, and the dtypes of the floating-point all-gathers and
reduce-scatters FSDP2 ran.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CPU_FLAGS_ENV = "GPUFLOW_TEST_CPU_FLAGS"


def observed_rank_main(*args: Any) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from gpuflow.tasks.training import precision
    from gpuflow.tasks.training.distributed import fsdp
    from gpuflow.tasks.training.distributed.worker import rank_main
    from torch.distributed.tensor import DTensor

    if os.environ.get(CPU_FLAGS_ENV):
        precision.CPUINFO_PATH = Path(os.environ[CPU_FLAGS_ENV])
    seen: dict[str, Any] = {"shards": {}, "sharded": set(), "computed": set()}
    seen.update(gathered=set(), reduced=set())

    def recording(name: str, collective: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            tensor = kw.get("input", a[1] if len(a) > 1 else None)
            if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                seen[name].add(str(tensor.dtype))
            return collective(*a, **kw)

        return call

    # FSDP2's default collectives (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py)
    dist.all_gather_single = recording("gathered", dist.all_gather_single)
    dist.reduce_scatter_single = recording("reduced", dist.reduce_scatter_single)

    wrap = fsdp.ShardedParallel.wrap

    def observing_wrap(self: Any, model: torch.nn.Module) -> torch.nn.Module:
        for name, p in model.named_parameters():
            local = p.to_local() if isinstance(p, DTensor) else p
            seen["shards"][name] = [local.numel(), p.numel()]
            seen["sharded"].add(str(p.dtype))
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(
                    lambda m, _: seen["computed"].add(str(m.weight.dtype))
                )
        return wrap(self, model)

    fsdp.ShardedParallel.wrap = observing_wrap
    out = rank_main(*args)
    out["observed"] = {k: v if isinstance(v, dict) else sorted(v) for k, v in seen.items()}
    return out
