"""How fast CheckpointManager saves and resumes, next to a raw write of the same bytes.

The goal (training issue, item 8): a checkpoint save runs at >= 70 % of the speed of a
plain sequential write+fsync of the same bytes to the same disk (ratio = raw_s / save_s).
Both are timed in the same run, alternating, so that they see the same disk and cache.
MB here is 2**20 bytes, as in ``size_mb``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.storage import LocalStorage

GOAL_RATIO = 0.7


def _state_of_size(size_mb: int) -> dict[str, Any]:
    """A model + AdamW-like state: weights, exp_avg, exp_avg_sq, a third of the bytes each."""
    per_part = max(1, (size_mb << 20) // 3 // 4)  # float32 elements per third
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(per_part, generator=generator)
    return {
        "model": {"weight": weights},
        "optimizer": {
            "state": {
                0: {
                    "step": torch.tensor(10.0),
                    "exp_avg": torch.randn(per_part, generator=generator),
                    "exp_avg_sq": torch.rand(per_part, generator=generator),
                }
            },
            "param_groups": [{"lr": 3e-4, "params": [0]}],
        },
    }


def _tensors(state: dict[str, Any]) -> list[torch.Tensor]:
    return [
        state["model"]["weight"],
        state["optimizer"]["state"][0]["exp_avg"],
        state["optimizer"]["state"][0]["exp_avg_sq"],
    ]


def _raw_write(path: Path, tensors: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for tensor in tensors:
            view = memoryview(tensor.numpy()).cast("B")
            while view:
                view = view[os.write(fd, view[: 64 << 20]) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def measure_checkpoint_throughput(root: Path, size_mb: int = 256, repeats: int = 3) -> dict:
    """Time CheckpointManager.save vs a raw write+fsync of the same bytes, and a resume.

    Writes under a fresh folder inside ``root`` and removes it afterwards. Returns medians:
    raw_write_mb_s, save_mb_s, ratio (raw_s / save_s; goal >= 0.7), resume_s (latest():
    read, sha256-verify and torch.load the newest checkpoint), resume_mb_s, bytes_written
    (the checkpoint's size on disk) and resume_exact (the loaded tensors equal the saved).
    """
    if size_mb < 1 or repeats < 1:
        raise ValueError(f"size_mb and repeats must be >= 1, got {size_mb} and {repeats}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="checkpoint-bench-", dir=root))
    try:
        state = _state_of_size(size_mb)
        tensors = _tensors(state)
        payload_mb = sum(t.numel() * t.element_size() for t in tensors) / (1 << 20)
        # keep_last=repeats: no prune deletes inside the timed saves (a raw write has none).
        manager = CheckpointManager(LocalStorage(work / "store"), "bench", keep_last=repeats)
        raw_path = work / "raw.bin"
        raw_times: list[float] = []
        save_times: list[float] = []
        for step in range(repeats):
            # Flush other dirty pages first, so neither side pays for the other's writeback.
            os.sync()
            raw_times.append(_raw_write(raw_path, tensors))
            raw_path.unlink()
            os.sync()
            start = time.perf_counter()
            manager.save(state, step=step, meta={"model_name": "bench"})
            save_times.append(time.perf_counter() - start)
        bytes_written = sum(info.size_bytes for info in manager.list())

        resume_times: list[float] = []
        exact = True
        for _ in range(repeats):
            os.sync()
            start = time.perf_counter()
            loaded = manager.latest()
            resume_times.append(time.perf_counter() - start)
            if loaded is None:
                raise RuntimeError("the checkpoint just written did not load")
            exact = exact and all(
                torch.equal(a, b) for a, b in zip(_tensors(loaded.state), tensors, strict=True)
            )
            del loaded
        raw_s = statistics.median(raw_times)
        save_s = statistics.median(save_times)
        resume_s = statistics.median(resume_times)
        ratio = raw_s / save_s
        return {
            "size_mb": round(payload_mb, 3),
            "repeats": repeats,
            "raw_write_s": raw_s,
            "save_s": save_s,
            "raw_write_mb_s": payload_mb / raw_s,
            "save_mb_s": payload_mb / save_s,
            "ratio": ratio,
            "goal_ratio": GOAL_RATIO,
            "meets_goal": ratio >= GOAL_RATIO,
            "resume_s": resume_s,
            "resume_mb_s": payload_mb / resume_s,
            "bytes_written": bytes_written,
            "resume_exact": exact,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
