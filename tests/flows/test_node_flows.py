"""A host's own monitor and inventory (`node`): they see that node of the twin only."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.flows.inventory import inventory
from gpuflow.flows.monitor import monitor
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend


def test_a_node_monitor_watches_its_node_with_its_own_incidents(gpuflow_home: Path) -> None:
    SimBackend().inject_fault("a100-1", 2, "remap-pending")  # another node's trouble
    out = monitor(rounds=1, model_uri="rules", fast_forward=True, node="a100-0")
    assert out["devices"] == 4 and {k.split(":")[0] for k in out["max_risk"]} == {"a100-0"}
    assert out["emitted"] == []
    state = gpuflow_home / "health" / "monitor"
    assert (state / "node-a100-0" / "incidents.json").exists()
    assert not (state / "incidents.json").exists()  # the fleet-wide monitor's stays apart


def test_a_node_inventory_samples_its_node(gpuflow_home: Path) -> None:
    out = inventory(node="dcu-0")
    assert out["samples"] == 2 and out["devices"] == 2
    assert Inventory().last_telemetry("dcu-0", 1) is not None
    assert Inventory().last_telemetry("a100-0", 0) is None


def test_a_worker_that_owns_a_node_runs_no_other_nodes_monitor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLOW_NODE", "a100-0")
    with pytest.raises(InvalidRequestError, match="owns node 'a100-0', not 'v100-0'"):
        monitor(rounds=1, model_uri="rules", fast_forward=True, node="v100-0")
