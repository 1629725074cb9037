"""A deployed chain keeps serving: a killed shard is restarted where it was, by one of two
supervisors started at once, and the chain answers again at the same address."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from gpuflow.blocks.edge_fleet import default_nodes
from gpuflow.tasks.edge import deploy as deploy_mod
from gpuflow.tasks.edge.deploy import Deployment, launch, shard_alive, stop_deployment
from gpuflow.tasks.edge.serving.client import OipClient
from gpuflow.tasks.edge.supervise import supervise_once

from .conftest import running_servers
from .test_slice_serve import _package

pytestmark = pytest.mark.integration


def _supervise(home: str, name: str, out: Path) -> None:
    os.environ["GPUFLOW_HOME"] = home
    out.write_text(json.dumps(supervise_once(name, ready_timeout_s=60)))


def _wait_dead(record, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while shard_alive(record):
        assert time.monotonic() < deadline, "the killed shard did not die"
        time.sleep(0.05)


def test_two_supervisors_restart_a_killed_shard_once(
    exported_digits, digits_profile, gpuflow_home: Path, tmp_path: Path
) -> None:
    nodes = default_nodes(2)
    version, _, packaged = _package(exported_digits, digits_profile, nodes, "kept")
    deployment = Deployment("kept", version, exported_digits.model_name, "forward", "new")
    launch(deployment, [p.directory for p in packaged], nodes)
    deployment.status = "active"
    deployment.save()
    deploy_mod.set_current("kept", version)
    x = exported_digits.sample_inputs(batch=1, seed=1)
    try:
        head = deployment.shards[0]
        with OipClient(head.address) as client:
            before = client.infer(head.model_name, x)
        tail = deployment.shards[1]
        os.kill(tail.pid, signal.SIGKILL)
        _wait_dead(tail)
        # Two supervisors at once: the lock lets one restart, the other finds it alive.
        ctx = multiprocessing.get_context("spawn")
        outs = [tmp_path / f"out-{i}" for i in range(2)]
        procs = [
            ctx.Process(target=_supervise, args=(str(gpuflow_home), "kept", out)) for out in outs
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
            assert proc.exitcode == 0
        results = sorted(json.loads(out.read_text())["restarted"] for out in outs)
        assert results == [[], [1]]
        now = Deployment.load("kept", version)
        assert now.status == "active" and now.shards[1].address == tail.address
        assert shard_alive(now.shards[1]) and now.shards[1].pid != tail.pid
        assert len(running_servers(str(deployment.root))) == 2
        with OipClient(head.address) as client:
            after = client.infer(head.model_name, x)
        for key in before:
            np.testing.assert_array_equal(before[key], after[key])
        assert Path(now.shards[1].log_path + ".1").exists()  # the crashed process's log
    finally:
        stop_deployment(Deployment.load("kept", version))
    assert not running_servers(str(deployment.root))
