"""A per-op profile of one training step of a named model, fp32 against bf16 autocast.

What `gpuflow bench train` prints next to the speedups when they fall short: where a
bf16 step's time goes (torch.profiler, self CPU time per ATen op) and how many kernels a
step launches. Kernel counts are deterministic; the times move with the machine's load.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from gpuflow.tasks.training.loop import build_workload
from gpuflow.tasks.training.spec import TrainSpec


def profile_step(
    model: str = "byte-lm",
    precision: str = "bf16",
    *,
    warmup: int = 3,
    steps: int = 3,
    top: int = 12,
) -> dict[str, Any]:
    """Profile ``steps`` steps after ``warmup``; the top ops by self CPU time, per step."""
    spec = TrainSpec(job_id="bench-profile", model=model, steps=1, precision="fp32", seed=0)
    w = build_workload(spec, torch.device("cpu"))
    reduced = precision == "bf16"
    batches = [next(w.sampler) for _ in range(warmup + steps)]

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=reduced):
            loss = w.loss_fn(w.model(x), y)
        loss.backward()
        w.optimizer.step()
        w.optimizer.zero_grad(set_to_none=True)

    for x, y in batches[:warmup]:
        step(x, y)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for x, y in batches[warmup:]:
            step(x, y)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total_us = sum(e.self_cpu_time_total for e in events)
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {
        "model": model,
        "precision": precision,
        "aten_calls_per_step": sum(e.count for e in events) // steps,
        "aten_self_ms_per_step": total_us / 1000 / steps,
        "top": [
            {
                "op": e.key,
                "calls": e.count // steps,
                "self_ms": e.self_cpu_time_total / 1000 / steps,
                "share": e.self_cpu_time_total / total_us if total_us else 0.0,
            }
            for e in rows
        ],
    }
