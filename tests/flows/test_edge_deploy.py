"""The `edge-deploy` flow end to end on loopback: deploy, redeploy, roll back, and the CLI.

Every test stops the shard processes it started (the fixture below also fails a test that
leaves one running).
"""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import gpuflow.flows.edge_deploy as flow_mod
import mlflow
import numpy as np
import onnx
import pytest
from gpuflow.blocks.edge_fleet import EdgeFleet
from gpuflow.flows.edge_deploy import edge_deploy
from gpuflow.tasks.edge.deploy import (
    SERVER_MODULE,
    Deployment,
    EdgeDeployError,
    current_version,
    deployment_status,
    teardown,
)
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.manifest import file_sha256, load_manifest, save_manifest
from gpuflow.tasks.edge.nodes import NodeUnreachableError
from gpuflow.tasks.edge.package import package_plan
from gpuflow.tasks.edge.rollout import rollback
from gpuflow.tasks.edge.stable_endpoint import endpoint_alive, endpoint_record
from gpuflow.tasks.edge.verify import chain_infer, reference_outputs
from gpuflow.tasks.tracking import tracking_uri
from prefect import task
from prefect.cache_policies import NONE
from typer.testing import CliRunner

from gpuflow.cli_edge import app as edge_app

pytestmark = pytest.mark.integration

# Small profiling and measuring budgets: the flow's logic, not its figures, is under test.
FAST = {"profile_runs": 3, "profile_warmup": 1, "samples": 2, "measure_requests": 4}


def _servers(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                args = (proc / "cmdline").read_bytes().decode(errors="replace")
                state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if SERVER_MODULE in args and marker in args and state != "Z":
                found.append(int(proc.name))
    return found


@pytest.fixture(autouse=True)
def stop_leftovers(gpuflow_home: Path) -> Iterator[None]:
    yield
    left = _servers(str(gpuflow_home))
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"test left shard servers running: {left}"


def _alive(name: str, version: str) -> list[bool]:
    row = next(r for r in deployment_status(name) if r["version"] == version)
    return [s["alive"] for s in row["shards"]]


def _corrupting_package(*args, **kwargs):
    """A faulty build: shards with consistent checksums but wrong weights in the last one."""
    packaged = package_plan(*args, **kwargs)
    last = packaged[-1].directory
    model = onnx.load(str(last / "model.onnx"))
    weight = max(model.graph.initializer, key=lambda t: len(t.raw_data) or len(t.float_data))
    values = onnx.numpy_helper.to_array(weight) + np.float32(0.5)
    weight.CopyFrom(onnx.numpy_helper.from_array(values, weight.name))
    onnx.save(model, str(last / "model.onnx"))
    manifest = load_manifest(last)
    from dataclasses import replace

    save_manifest(replace(manifest, sha256=file_sha256(last / "model.onnx")), last)
    return packaged


def test_deploy_redeploy_and_roll_back(monkeypatch: pytest.MonkeyPatch) -> None:
    fleet = EdgeFleet.loopback(2)
    try:
        first = edge_deploy(model="resnet18-digits", fleet=fleet, name="digits", **FAST)
        assert first["version"] == "v1" and first["previous"] is None
        assert first["check"]["passed"] and first["check"]["max_abs_diff"] <= 1e-4
        assert len(first["addresses"]) == 2 and first["balance"] >= 1.0
        run = mlflow.MlflowClient(tracking_uri()).get_run(first["run_id"])
        assert run.info.status == "FINISHED"
        for key in (
            "balance",
            "balance_equal_ops",
            "latency_p50_ms",
            "latency_p99_ms",
            "throughput_rps",
            "max_abs_diff",
            "bottleneck_ms",
        ):
            assert key in run.data.metrics, key
        assert run.data.params["shards"] == "2"
        assert run.data.tags["gpuflow.edge.opset"] == "18"
        assert current_version("digits") == "v1" and _alive("digits", "v1") == [True, True]
        # Every shard serves its HTTP probes and metrics where the deployment says.
        for shard in Deployment.load("digits", "v1").shards:
            with urllib.request.urlopen(f"http://{shard.http_address}/v2/health/ready") as r:
                assert r.status == 200 and json.loads(r.read()) == {"ready": True}

        endpoint = first["endpoint"]
        v1 = Deployment.load("digits", "v1")
        exported = ExportedModel.load(v1.root / "model")
        x7 = exported.sample_inputs(seed=7)
        want = reference_outputs(exported, [x7])[0]
        assert np.max(np.abs(_via(endpoint, v1, x7) - want)) <= 1e-4

        # A second version replaces the first only once it is checked; v1 stays up as the
        # standby a rollback returns to.
        second = edge_deploy(
            model="resnet18-digits", fleet=fleet, name="digits", mode="driver", **FAST
        )
        assert second["version"] == "v2" and second["previous"] == "v1"
        # The same export: v1's profile is reused, so the cuts are v1's.
        assert second["profile_reused_from"] == "v1" and first["profile_reused_from"] is None
        assert second["cut_tensors"] == first["cut_tensors"]
        assert current_version("digits") == "v2"
        assert _alive("digits", "v1") == [True, True]
        assert Deployment.load("digits", "v1").status == "standby"

        # A faulty third build fails the check: its processes go, v2 keeps serving.
        monkeypatch.setattr(
            flow_mod,
            "package_task",
            task(_corrupting_package, name="edge-package", cache_policy=NONE),
        )
        with pytest.raises(EdgeDeployError, match="check failed.*rolled back to v2"):
            edge_deploy(model="resnet18-digits", fleet=fleet, name="digits", **FAST)
        third = Deployment.load("digits", "v3")
        assert third.status == "rolled-back" and not third.check["passed"]
        assert third.check["max_abs_diff"] > 1e-4
        assert _alive("digits", "v3") == [False, False]
        assert current_version("digits") == "v2" and _alive("digits", "v2") == [True, True]
        v2 = Deployment.load("digits", "v2")
        exported = ExportedModel.load(v2.root / "model")
        x = exported.sample_inputs(seed=99)
        assert np.max(np.abs(chain_infer(v2, x) - reference_outputs(exported, [x])[0])) <= 1e-4

        # Rolled back on request after its promotion: v1 serves again at the same endpoint.
        assert rollback("digits").version == "v1" and current_version("digits") == "v1"
        assert _alive("digits", "v2") == [False, False]
        assert Deployment.load("digits", "v2").status == "rolled-back"
        assert endpoint_record("digits")["address"] == endpoint
        assert np.max(np.abs(_via(endpoint, v1, x7) - want)) <= 1e-4
    finally:
        teardown("digits")
    assert _alive("digits", "v1") == [False, False] and not endpoint_alive("digits")


def _via(endpoint: str, deployment: Deployment, x: dict) -> np.ndarray:
    """The chain's output for ``x`` through the stable endpoint (the head's model name)."""
    from gpuflow.tasks.edge.serving.client import OipClient

    with OipClient(endpoint) as client:
        (out,) = client.infer(deployment.shards[0].model_name, x).values()
    return out


def test_failed_first_deploy_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        flow_mod, "package_task", task(_corrupting_package, name="edge-package", cache_policy=NONE)
    )
    with pytest.raises(EdgeDeployError, match="no previous version"):
        edge_deploy(model="resnet18-digits", fleet=EdgeFleet.loopback(2), name="bad", **FAST)
    assert Deployment.load("bad", "v1").status == "failed"
    assert current_version("bad") is None


def test_a_split_slower_than_one_node_is_refused_with_the_reason() -> None:
    """Four nodes on slow links (0.05 MB/s: each hop of an activation costs more than the
    whole model on one node): asked for 4 shards, the flow refuses the plan before starting
    a shard and says the single node is faster."""
    from gpuflow.tasks.edge.partition import PlanRefusedError

    slow = EdgeFleet.loopback(4, link_mb_s=0.05)
    with pytest.raises(PlanRefusedError, match="slower than that single node") as err:
        edge_deploy(model="resnet18-digits", fleet=slow, shards=4, name="slow", **FAST)
    assert "on 'edge-0' alone (shards=1)" in str(err.value)
    assert current_version("slow") is None and _servers("slow") == []


def test_left_to_choose_on_slow_links_the_flow_serves_from_one_node() -> None:
    slow = EdgeFleet.loopback(3, link_mb_s=0.05)
    out = edge_deploy(model="resnet18-digits", fleet=slow, name="alone", **FAST)
    try:
        assert out["check"]["passed"]
        assert len(_servers("alone")) == 1
        assert out["nodes"] == ["edge-0"]
    finally:
        teardown("alone")


def test_bad_input_is_refused_before_anything_is_written(gpuflow_home: Path) -> None:
    with pytest.raises(ValueError, match="3 shards need 3 edge nodes"):
        edge_deploy(model="resnet18-digits", fleet=EdgeFleet.loopback(2), shards=3)
    with pytest.raises(ValueError, match="unknown model"):
        edge_deploy(model="resnet9000", fleet=EdgeFleet.loopback(2))
    far = EdgeFleet(nodes=[{"name": "near"}, {"name": "far", "host": "203.0.113.9"}])
    with pytest.raises(NodeUnreachableError, match="'far'"):
        edge_deploy(model="resnet18-digits", fleet=far)
    assert not (gpuflow_home / "edge").exists()


def test_cli_deploy_status_teardown() -> None:
    runner = CliRunner()
    result = runner.invoke(edge_app, ["deploy", "resnet18-digits", "--nodes", "2", "--name", "cli"])
    try:
        assert result.exit_code == 0, result.output
        assert "cli v1 active" in result.output and "latency p50" in result.output
        status = runner.invoke(edge_app, ["status", "cli"])
        assert status.exit_code == 0 and "2/2 alive" in status.output
    finally:
        down = runner.invoke(edge_app, ["teardown", "cli"])
    assert down.exit_code == 0 and "stopped 2 shard process(es)" in down.output
    assert "0/2 alive" in runner.invoke(edge_app, ["status", "cli"]).output
    bad = runner.invoke(edge_app, ["deploy", "resnet18-digits", "--nodes", "2", "--shards", "5"])
    assert bad.exit_code == 2 and "5 shards need 5 edge nodes" in bad.output
