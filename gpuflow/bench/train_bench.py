"""`gpuflow bench train`: three ratios, each measured side by side in one run.

(a) flow overhead: the same loop bare vs inside the `train` flow (goal <= 1.03);
(b) precision: fp32 vs `auto` (and fixed bf16 for reference) on the byte-level LM of
    DESIGN.md section 5 (goal speedup >= 1.8 at convergence delta < 0.5 %);
(c) checkpoints: save throughput vs a raw sequential write+fsync of the same bytes
    (goal >= 0.7), and resume time.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpuflow.tasks.training.comparison import compare_results
from gpuflow.tasks.training.loop import TrainResult, train_loop
from gpuflow.tasks.training.spec import TrainSpec
from gpuflow.tasks.training.storage import LocalStorage
from gpuflow.tasks.training.utilization import BusyShare

Report = Callable[[str], None]


def machine() -> dict[str, Any]:
    flags = ""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    model = next(
        (ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")),
        platform.processor(),
    )
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "avx512_bf16": "avx512_bf16" in flags,
        "amx_bf16": "amx_bf16" in flags,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
    }


def _bare(spec: TrainSpec, root: Path) -> TrainResult:
    return train_loop(spec, LocalStorage(root), utilization=BusyShare())


def flow_overhead(steps: int, root: Path) -> dict[str, Any]:
    """The loop's time inside the flow (with MLflow, lease, control channel, utilization
    through the twin) against the same loop bare. The flow's fixed start-up (Prefect
    server, MLflow store) is reported apart: it does not grow with the job."""
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.flows.train import train

    spec = TrainSpec(
        job_id="bench-bare",
        model="byte-lm",
        steps=steps,
        checkpoint_interval=steps,
        precision="fp32",
    )
    _bare(spec.model_copy(update={"job_id": "bench-warmup", "steps": 5}), root)  # warm caches
    bare = _bare(spec, root)
    t0 = time.perf_counter()
    out = train(
        spec.model_copy(update={"job_id": "bench-flow"}),
        storage=CheckpointStorage(path=str(root)),
        log_model=False,
    )
    flow_total_s = time.perf_counter() - t0
    return {
        "steps": steps,
        "bare_loop_s": bare.wall_time_s,
        "flow_loop_s": out["wall_time_s"],
        "ratio": out["wall_time_s"] / bare.wall_time_s,
        "goal": "<= 1.03",
        "flow_end_to_end_s": flow_total_s,
        "flow_fixed_overhead_s": flow_total_s - out["wall_time_s"],
    }


def precision_speedup(steps: int, root: Path) -> dict[str, Any]:
    """fp32 vs auto vs fixed bf16 on byte-lm, same seed and data, one after another."""
    results = {}
    for policy in ("fp32", "auto", "bf16"):
        spec = TrainSpec(
            job_id=f"bench-{policy}",
            model="byte-lm",
            steps=steps,
            checkpoint_interval=steps,
            precision=policy,
            seed=0,
        )
        results[policy] = _bare(spec, root).to_dict()
    rows = {r["policy"]: r for r in compare_results(results, threshold=0.005)}
    return {
        "steps": steps,
        "fp32_s": results["fp32"]["wall_time_s"],
        "auto_s": results["auto"]["wall_time_s"],
        "bf16_s": results["bf16"]["wall_time_s"],
        "speedup_auto": rows["auto"]["speedup"],
        "speedup_bf16": rows["bf16"]["speedup"],
        "convergence_delta_auto": rows["auto"]["convergence_delta"],
        "convergence_delta_bf16": rows["bf16"]["convergence_delta"],
        "auto_switches": results["auto"]["switches"],
        "goal": "speedup_auto >= 1.8, delta < 0.005, auto not slower than bf16",
    }


def checkpoint_throughput(size_mb: int, root: Path) -> dict[str, Any]:
    from gpuflow.bench.checkpoint_bench import measure_checkpoint_throughput

    return measure_checkpoint_throughput(root, size_mb=size_mb, repeats=3)


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    """All three; ``quick`` shrinks them to a smoke run (figures then mean little)."""
    out: dict[str, Any] = {"machine": machine(), "quick": quick}
    with tempfile.TemporaryDirectory(prefix="gpuflow-bench-") as tmp:
        root = Path(tmp)
        report("(a) loop bare vs inside the train flow")
        out["flow_overhead"] = flow_overhead(20 if quick else 300, root / "a")
        report("(b) fp32 vs auto vs bf16 on byte-lm")
        out["precision"] = precision_speedup(10 if quick else 300, root / "b")
        report("(c) checkpoint save vs raw write+fsync")
        out["checkpoint"] = checkpoint_throughput(16 if quick else 256, root / "c")
    return out
