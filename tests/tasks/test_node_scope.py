"""A per-node view of a backend: a host's monitor and inventory see their node only."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.node_scope import NodeView, check_node, node_backend


def test_the_view_discovers_and_samples_its_node_only() -> None:
    twin = SimBackend()
    view = NodeView(twin, "a100-1")
    assert [n.name for n in view.discover()] == ["a100-1"]
    assert {d.node for d in view.devices()} == {"a100-1"} and len(view.devices()) == 4
    assert view.telemetry("a100-1", 0).node == "a100-1"
    assert view.power_limits("a100-1", 0) == twin.power_limits("a100-1", 0)
    assert view.name == twin.name
    with pytest.raises(InvalidRequestError, match="'a100-0' is not this view's node 'a100-1'"):
        view.telemetry("a100-0", 0)
    with pytest.raises(InvalidRequestError, match="a100-0"):
        view.set_power_limit_mw("a100-0", 0, 100_000)
    # The twin's own extras (its clock) pass through.
    assert view.advance == twin.advance


def test_the_view_answers_capabilities_modes_and_resets_for_its_node_only() -> None:
    twin = SimBackend()
    view = NodeView(twin, "v100-0")
    assert view.telemetry_fields("v100-0", 0) == twin.telemetry_fields("v100-0", 0)
    assert "remapped_rows_pending" not in view.telemetry_fields("v100-0", 0)
    a100 = NodeView(twin, "a100-1")
    twin.set_workload("a100-1", 2, "job-1", 0.5)
    assert a100.device_processes("a100-1", 2) == ["tenant job-1"]
    assert a100.partition_mode_state("a100-1", 0) == twin.partition_mode_state("a100-1", 0)
    with pytest.raises(InvalidRequestError, match=r"\['a100-0'\] are not this view's node"):
        a100.reset_devices([("a100-1", 0), ("a100-0", 0)])
    with pytest.raises(InvalidRequestError, match="a100-0"):
        a100.telemetry_fields("a100-0", 0)


def test_a_node_outside_the_fleet_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="node 'gpu-9' is not in the fleet"):
        NodeView(SimBackend(), "gpu-9")


def test_no_node_means_the_whole_backend() -> None:
    twin = SimBackend()
    assert node_backend(twin, None) is twin
    assert len(node_backend(twin, "dcu-0").devices()) == 2


def test_a_worker_that_owns_a_node_works_on_that_node_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLOW_NODE", "a100-0")
    assert check_node("a100-0") == "a100-0"
    assert check_node(None) is None
    with pytest.raises(InvalidRequestError, match="owns node 'a100-0', not 'a100-1'"):
        node_backend(SimBackend(), "a100-1")
