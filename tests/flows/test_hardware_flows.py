"""The `partition` and `inventory` flows and the Blocks, against a real local Prefect server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gpuflow.tasks.partition as partition_tasks
import pytest
from gpuflow.blocks import CheckpointStorage, GpuCluster
from gpuflow.flows.inventory import inventory
from gpuflow.flows.partition import partition
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.partition import export_layout
from gpuflow.hardware.sim import SimBackend
from prefect.artifacts import Artifact
from prefect.settings import PREFECT_API_URL

from gpuflow.tour import tour_plan_path

pytestmark = pytest.mark.integration
PLAN = str(tour_plan_path())


def test_partition_flow_applies_per_node_and_leaves_a_layout_table() -> None:
    result = partition(PLAN, "tour")
    assert set(result) == {"a100-0", "dcu-0"}
    assert result["a100-0"]["changed"] == [0, 1, 2]
    twin = SimBackend()
    assert sorted(p.profile for p in twin.partitions("a100-0", 0)) == [
        "1g.5gb",
        "1g.5gb",
        "2g.10gb",
        "3g.20gb",
    ]
    assert len(twin.partitions("dcu-0", 0)) == 4
    artifact = Artifact.get("partition-layout")
    assert artifact is not None and "3g.20gb" in str(artifact.data)
    assert partition(PLAN, "tour")["a100-0"]["changed"] == []  # idempotent


def test_partition_flow_rolls_back_every_node_when_one_fails(monkeypatch) -> None:
    before = export_layout(SimBackend(), with_nodes=True)
    real_apply = partition_tasks.apply_plan

    def failing_apply(backend, plan, config, nodes=None):
        if nodes == ["dcu-0"]:
            raise RuntimeError("hy-smi timed out")
        return real_apply(backend, plan, config, nodes=nodes)

    monkeypatch.setattr(partition_tasks, "apply_plan", failing_apply)
    monkeypatch.setattr(partition_tasks.apply_node_task, "retries", 0)
    with pytest.raises(RuntimeError, match="rolled back"):
        partition(PLAN, "tour")
    assert export_layout(SimBackend(), with_nodes=True) == before


def test_partition_flow_refuses_an_impossible_plan_before_touching_anything() -> None:
    before = export_layout(SimBackend(), with_nodes=True)
    with pytest.raises(Exception, match="v100-0"):
        partition(PLAN, "impossible")
    assert export_layout(SimBackend(), with_nodes=True) == before


def test_inventory_flow_records_devices_and_telemetry() -> None:
    SimBackend().inject_fault("a100-1", 3, "remap-pending")
    out = inventory()
    assert out["devices"] == 18 and out["samples"] == 18
    inv = Inventory()
    assert len(inv.devices()) == 18
    sample = inv.last_telemetry("a100-1", 3)
    assert sample is not None and sample.remapped_rows_pending
    assert Artifact.get("fleet-inventory") is not None


def test_blocks_register_and_round_trip(tmp_path: Path) -> None:
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    prefect = Path(sys.executable).with_name("prefect")
    done = subprocess.run(
        [str(prefect), "block", "register", "-m", "gpuflow.blocks"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gpuflow GPU Cluster" in done.stdout and "gpuflow Checkpoint Storage" in done.stdout
    GpuCluster(backend="sim").save("twin", overwrite=True)
    assert GpuCluster.load("twin").get_backend().name == "sim"
    CheckpointStorage(path=str(tmp_path)).save("local-ckpt", overwrite=True)
    assert CheckpointStorage.load("local-ckpt").local_root() == tmp_path
    assert len(partition(PLAN, "tour", nodes=["dcu-0"], cluster_block="twin")) == 1
