"""`gpuflow up` then `gpuflow down`: everything up answers, and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]


def _gpuflow(*args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("gpuflow")
    return subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy(), cwd=ROOT)


def _group_members(pgids: set[int]) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in pgids and fields[0] != "Z":
            out.append(f"{proc.name}: {stat[:80]}")
    return out


@pytest.mark.timeout(900)
def test_up_serves_deploys_runs_and_down_leaves_nothing(gpuflow_home: Path) -> None:
    up = _gpuflow("up", "--prefect-port", "0", "--mlflow-port", "0")
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((gpuflow_home / "controlplane.json").read_text())
    try:
        for url in (state["prefect_api_url"] + "/health", state["mlflow_url"] + "/health"):
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert resp.status == 200
        assert "train/train" in state["deployments"]
        env = {**os.environ, "PREFECT_API_URL": state["prefect_api_url"]}
        prefect = str(Path(sys.executable).with_name("prefect"))
        listed = subprocess.run([prefect, "deployment", "ls"], capture_output=True, text=True, env=env, timeout=60)
        for name in ("partition", "inventory", "train", "compare_precision"):
            assert name in listed.stdout
        ran = subprocess.run([prefect, "deployment", "run", "partition/partition", "--watch"],
                             capture_output=True, text=True, env=env, timeout=300)
        assert ran.returncode == 0 and "Completed" in ran.stdout, ran.stdout[-2000:] + ran.stderr[-2000:]
        again = _gpuflow("up", "--prefect-port", "0", "--mlflow-port", "0")
        assert again.returncode == 2 and "already up" in again.stderr
    finally:
        down = _gpuflow("down")
    assert down.returncode == 0, down.stderr
    pgids = {s["pid"] for s in state["services"]}
    assert len(pgids) == 3  # server, MLflow, one worker
    assert _group_members(pgids) == []
    assert not (gpuflow_home / "controlplane.json").exists()
    assert "nothing to stop" in _gpuflow("down").stdout
