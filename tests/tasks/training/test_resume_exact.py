"""Exact resume: N steps in one go == k steps, SIGKILL, resume to N (CPU), bit for bit.

fp32, and ``auto`` killed after its A/B switched it to bf16 and resumed from a checkpoint
written in the middle of that A/B: the probe continues where it was and decides as the
uninterrupted run did. The step times ``auto`` sees are the test's (a table per dtype,
fed through the policy's ``observe``), so its decisions cannot depend on this machine's
load; everything else (the model, bf16 autocast, the checkpoint) is real. And fp32 under
``compile``: torch.compile's backward is not deterministic unless the loop asks for
deterministic algorithms, which it does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.storage import LocalStorage

RUN = textwrap.dedent(
    """
    import json, os, signal, sys, torch
    torch.set_num_threads(1)
    from pathlib import Path
    from gpuflow.tasks.training import precision
    from gpuflow.tasks.training.autoprecision import AutoPrecision
    from gpuflow.tasks.training.loop import train_loop
    from gpuflow.tasks.training.spec import TrainSpec
    from gpuflow.tasks.training.storage import LocalStorage
    job, root, kill_at, policy, cpuinfo, compiled = sys.argv[1:7]
    kill_at = int(kill_at)
    precision.CPUINFO_PATH = Path(cpuinfo)  # bf16 available whatever this CPU's flags
    SECONDS = {torch.float32: 0.010, torch.bfloat16: 0.006}
    real_observe = AutoPrecision.observe
    def observe(self, step, util, loss, overflowed, skipped=None, step_time_s=None):
        return real_observe(self, step, util, loss, overflowed, skipped=skipped,
                            step_time_s=SECONDS[self.current_dtype])
    AutoPrecision.observe = observe
    spec = TrainSpec(job_id=job, model="llama-tiny", steps=30, checkpoint_interval=10,
                     precision=policy, seed=7, compile=compiled == "1")
    def die(info):
        if info.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    result = train_loop(spec, LocalStorage(root), hooks=[die] if kill_at else [])
    print("resumed_from", result.resumed_from_step)
    print("switches", json.dumps([s.to_dict() for s in result.switches]))
    """
)


def _run(
    job: str, root: Path, kill_at: int, policy: str, cpuinfo: Path, compiled: bool = False
) -> subprocess.CompletedProcess[str]:
    argv = [job, str(root), str(kill_at), policy, str(cpuinfo), "1" if compiled else "0"]
    # One inductor cache for the three runs: the first compiles, the others load it.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
    return subprocess.run(
        [sys.executable, "-c", RUN, *argv],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=Path(__file__).parents[3],
        env=env,
    )


def _final_weights(root: Path, job: str) -> dict[str, torch.Tensor]:
    loaded = CheckpointManager(LocalStorage(root), job).latest()
    assert loaded is not None and loaded.step == 30
    return loaded.state["model"]


def _switches(out: str) -> list[dict[str, object]]:
    line = next(x for x in out.splitlines() if x.startswith("switches "))
    return json.loads(line.removeprefix("switches "))


@pytest.mark.parametrize(("policy", "compiled"), [("fp32", False), ("auto", False), ("fp32", True)])
def test_sigkill_and_resume_is_bit_identical(tmp_path: Path, policy: str, compiled: bool) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : avx512f avx512_bf16\n")
    straight = _run("straight", tmp_path, 0, policy, cpuinfo, compiled)
    assert straight.returncode == 0, straight.stderr
    if policy == "auto":
        # The A/B (steps 4-23) times fp32, bf16, fp32, bf16 and keeps bf16; the step-20
        # checkpoint falls inside it, the kill after its last switch.
        assert [(s["step"], s["to"]) for s in _switches(straight.stdout)] == [
            (8, "bf16"),
            (13, "fp32"),
            (18, "bf16"),
        ]

    killed = _run("killed", tmp_path, 23, policy, cpuinfo, compiled)  # after the step-20 checkpoint
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ids = [c.checkpoint_id for c in CheckpointManager(LocalStorage(tmp_path), "killed").list()]
    assert ids[-1] == "step-000000020"

    resumed = _run("killed", tmp_path, 0, policy, cpuinfo, compiled)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed_from 20" in resumed.stdout
    assert _switches(resumed.stdout) == _switches(straight.stdout)

    a, b = _final_weights(tmp_path, "straight"), _final_weights(tmp_path, "killed")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs after resume"
