"""`gpuflow telemetry serve`: bad flags refused before anything starts, naming the flag;
the command itself serving the twin until SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuflow.cli import app
from tests.helpers.telemetry import scrape

runner = CliRunner()
ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval-s", "4"], "--interval-s 4.0: interval_s must be >= 5 s"),
        (["--interval-s", "0"], "--interval-s 0.0: interval_s must be >= 5 s"),
        (["--interval-s", "inf"], "--interval-s inf: interval_s must be >= 5 s"),
        (["--port", "70000"], "--port 70000 is not in 0..65535"),
        (["--port", "-1"], "--port -1 is not in 0..65535"),
        (["--host", "no-such-host.invalid"], "--host 'no-such-host.invalid' is neither"),
        (["--node", "bad node"], "node names ['bad node'] must be"),
    ],
)
def test_bad_flags_are_refused_before_anything_starts(
    gpuflow_home: Path, args: list[str], message: str
) -> None:
    result = runner.invoke(app, ["telemetry", "serve", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr.replace("\n", "")
    assert not (gpuflow_home / "twin").exists()  # no backend was opened


def test_an_unknown_node_is_refused_naming_the_known_ones() -> None:
    result = runner.invoke(app, ["telemetry", "serve", "--node", "nowhere", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "--node nowhere: not a node of backend 'sim'" in result.stderr
    assert "a100-0" in result.stderr


def test_a_port_that_is_not_a_number_is_refused_by_name() -> None:
    result = runner.invoke(app, ["telemetry", "serve", "--port", "http"])
    assert result.exit_code == 2 and "--port" in result.output


@pytest.mark.timeout(300)
def test_serve_runs_until_sigterm(gpuflow_home: Path) -> None:
    exe = Path(sys.executable).with_name("gpuflow")
    argv = [str(exe), "telemetry", "serve", "--port", "0", "--health-model", "rules"]
    env = {**os.environ, "GPUFLOW_HOME": str(gpuflow_home), "GPUFLOW_BACKEND": "sim"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first snapshot is taken before this line
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/metrics) \(18 devices", line)
        assert found, line + (proc.stderr.read() if proc.poll() is not None else "")
        got = scrape(found.group(1))
        assert len(got.find("DCGM_FI_DEV_GPU_TEMP")) == 18
        assert len(got.find("gpuflow_health_risk", model="rules")) == 18
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
