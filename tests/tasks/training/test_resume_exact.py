"""Exact resume: N steps in one go == k steps, SIGKILL, resume to N (CPU, fp32), bit for bit."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.storage import LocalStorage

RUN = textwrap.dedent(
    """
    import os, signal, sys, torch
    torch.set_num_threads(1)
    from gpuflow.tasks.training.loop import train_loop
    from gpuflow.tasks.training.spec import TrainSpec
    from gpuflow.tasks.training.storage import LocalStorage
    job, root, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    spec = TrainSpec(job_id=job, model="llama-tiny", steps=30, checkpoint_interval=10,
                     precision="fp32", seed=7)
    def die(info):
        if info.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    result = train_loop(spec, LocalStorage(root), hooks=[die] if kill_at else [])
    print("resumed_from", result.resumed_from_step)
    """
)


def _run(job: str, root: Path, kill_at: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN, job, str(root), str(kill_at)],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).parents[3],
    )


def _final_weights(root: Path, job: str) -> dict[str, torch.Tensor]:
    loaded = CheckpointManager(LocalStorage(root), job).latest()
    assert loaded is not None and loaded.step == 30
    return loaded.state["model"]


def test_sigkill_and_resume_is_bit_identical(tmp_path: Path) -> None:
    straight = _run("straight", tmp_path, kill_at=0)
    assert straight.returncode == 0, straight.stderr

    killed = _run("killed", tmp_path, kill_at=23)  # after the step-20 checkpoint
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ids = [c.checkpoint_id for c in CheckpointManager(LocalStorage(tmp_path), "killed").list()]
    assert ids[-1] == "step-000000020"

    resumed = _run("killed", tmp_path, kill_at=0)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed_from 20" in resumed.stdout

    a, b = _final_weights(tmp_path, "straight"), _final_weights(tmp_path, "killed")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
