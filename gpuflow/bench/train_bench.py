"""`gpuflow bench train`: three ratios, each measured side by side in one run.

(a) flow overhead: the same loop bare vs inside the `train` flow (goal <= 1.03);
(b) precision: fp32 vs fixed bf16 vs `auto` on the byte-level LM, and fp32 vs bf16 on the
    plain reference block of DESIGN.md section 5, interleaved over 3 seeds
    (gpuflow/bench/precision_compare.py; goal step speedup >= 1.8 at a convergence delta
    < 0.5 % and within 3 std of fp32's seed-to-seed spread);
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

from gpuflow.bench.precision_compare import precision_comparison
from gpuflow.bench.step_profile import profile_step
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


def checkpoint_throughput(size_mb: int, root: Path) -> dict[str, Any]:
    from gpuflow.bench.checkpoint_bench import measure_checkpoint_throughput

    return measure_checkpoint_throughput(root, size_mb=size_mb, repeats=3)


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    """All three; ``quick`` shrinks them to a smoke run (figures then mean little).

    The full run takes about 12 minutes on the 2-core development VM: (b) is 3 seeds x
    (byte-lm fp32, bf16, auto at 300 steps + the reference block fp32, bf16 at 100 steps).
    """
    out: dict[str, Any] = {"machine": machine(), "quick": quick}
    with tempfile.TemporaryDirectory(prefix="gpuflow-bench-") as tmp:
        root = Path(tmp)
        report("(a) loop bare vs inside the train flow")
        out["flow_overhead"] = flow_overhead(20 if quick else 100, root / "a")
        lm, ref, raw = precision_comparison(
            8 if quick else 300,
            root / "b",
            seeds=(0, 1) if quick else (0, 1, 2),
            reference_steps=8 if quick else 100,
            report=report,
        )
        out["precision"], out["precision_reference"], out["precision_runs"] = lm, ref, raw
        if not quick:
            report("(b) per-op profile of one byte-lm step")
            out["precision_profile"] = [profile_step(precision=p) for p in ("fp32", "bf16")]
        report("(c) checkpoint save vs raw write+fsync")
        out["checkpoint"] = checkpoint_throughput(16 if quick else 256, root / "c")
    return out
