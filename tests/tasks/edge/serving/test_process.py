"""The server as its own process: READY line, graceful SIGTERM, refusal to start."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from gpuflow.tasks.edge.serving.client import OipClient
from gpuflow.tasks.edge.serving.process import ShardStartError, server_argv, start_shard_process
from gpuflow.tasks.edge.serving.server import (
    EXIT_INTEGRITY_ERROR,
    EXIT_STARTUP_ERROR,
    GRPC_EXPERIMENTS,
)

pytestmark = pytest.mark.integration


def test_process_serves_then_stops_gracefully_on_sigterm(mlp, tmp_path: Path) -> None:
    log = tmp_path / "shard.log"
    shard = start_shard_process(mlp.shard_dirs[0], log_path=log, extra_args=["--grace-s", "1"])
    try:
        assert shard.model_name == "mlp-shard0"
        assert shard.ready_line.startswith("READY model=mlp-shard0 address=127.0.0.1:")
        with OipClient(shard.address) as c:
            assert c.server_ready()
            h1 = c.infer("mlp-shard0", {"x": np.ones((1, 4), np.float32)})["h1"]
        assert h1.shape == (1, 8)
    finally:
        code = shard.stop(timeout_s=15)
    assert code == 0
    assert "signal received" in log.read_text() and "stopped" in log.read_text()


def test_a_log_of_its_own_is_removed_after_a_clean_stop_and_kept_otherwise(mlp) -> None:
    clean = start_shard_process(mlp.shard_dirs[0], extra_args=["--grace-s", "1"])
    killed = start_shard_process(mlp.shard_dirs[0], extra_args=["--grace-s", "1"])
    try:
        assert clean.temporary_log and clean.log_path.is_file()
        assert killed.log_path.is_file() and killed.log_path != clean.log_path
        assert clean.stop(timeout_s=15) == 0
        assert not clean.log_path.exists()
        killed.process.kill()  # a server that did not stop cleanly keeps its log
        assert killed.stop(timeout_s=15) != 0
        assert killed.log_path.is_file()
    finally:
        clean.stop()
        killed.stop()
        killed.log_path.unlink(missing_ok=True)


def test_a_given_log_stays_after_a_clean_stop(mlp, tmp_path: Path) -> None:
    log = tmp_path / "kept.log"
    shard = start_shard_process(mlp.shard_dirs[0], log_path=log, extra_args=["--grace-s", "1"])
    assert shard.stop(timeout_s=15) == 0
    assert log.is_file() and not shard.temporary_log


def test_tampered_shard_process_exits_nonzero_with_the_reason(mlp, tmp_path: Path) -> None:
    shard = tmp_path / "tampered"
    shutil.copytree(mlp.shard_dirs[0], shard)
    data = bytearray((shard / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (shard / "model.onnx").write_bytes(bytes(data))

    argv = server_argv(shard, port=0)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_INTEGRITY_ERROR
    assert "refusing to start" in done.stderr and "sha256 mismatch" in done.stderr
    assert "READY" not in done.stdout

    with pytest.raises(ShardStartError, match="exited with code 3 before it was ready") as err:
        start_shard_process(shard, log_path=tmp_path / "tampered.log")
    assert err.value.returncode == EXIT_INTEGRITY_ERROR
    assert "sha256 mismatch" in str(err.value) and "Warning" not in str(err.value)
    assert f"(log {tmp_path / 'tampered.log'})" in str(err.value)


def test_missing_manifest_is_a_startup_error(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "gpuflow.tasks.edge.serving.server", "--shard-dir", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_STARTUP_ERROR
    assert "no manifest.json" in done.stderr


@pytest.mark.parametrize("preset", [None, "-some_experiment"])
def test_server_process_sets_grpc_experiments_unless_the_operator_did(
    monkeypatch: pytest.MonkeyPatch, preset: str | None
) -> None:
    # Set (then deleted) first, so monkeypatch restores the variable as it was.
    monkeypatch.setenv("GRPC_EXPERIMENTS", "restored-after-the-test")
    if preset is None:
        monkeypatch.delenv("GRPC_EXPERIMENTS")
    else:
        monkeypatch.setenv("GRPC_EXPERIMENTS", preset)
    monkeypatch.setattr(sys, "argv", ["server", "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit):
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already
        runpy.run_module("gpuflow.tasks.edge.serving.server", run_name="__main__")
    assert os.environ["GRPC_EXPERIMENTS"] == (preset or GRPC_EXPERIMENTS)
