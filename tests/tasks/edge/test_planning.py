"""A redeploy reuses the profile of the version it replaces only when that profile stands
for the very same export, measured the same way, and the plan it settled on while its
nodes remain; settling keeps the plan that measured fastest."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpuflow.blocks.edge_fleet import default_nodes
from gpuflow.tasks.edge import served_profile
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.partition import ChainCosts, NodeCapacity, Plan, evaluate_split
from gpuflow.tasks.edge.planning import plan_message, plan_shards, stored_profile


def _previous(root: Path, exported, profile) -> SimpleNamespace:
    """A previous version's record as the flow leaves it: model/ with export and profile."""
    model_dir = root / "model"
    shutil.copytree(exported.onnx_path.parent, model_dir)
    profile.save(model_dir / "profile.json")
    return SimpleNamespace(root=root)


def test_the_same_export_measured_the_same_way_reuses_the_profile(
    exported_digits, digits_profile, tmp_path: Path
) -> None:
    previous = _previous(tmp_path / "v1", exported_digits, digits_profile)
    assert ExportedModel.load(previous.root / "model").model_name == exported_digits.model_name
    threads = digits_profile.intra_op_threads
    reused = stored_profile(previous, exported_digits, threads)
    assert reused is not None and reused.node_ms == digits_profile.node_ms
    assert stored_profile(None, exported_digits, threads) is None
    assert stored_profile(previous, exported_digits, threads + 1) is None  # other threads


def test_another_export_or_a_missing_profile_measures_again(
    exported_digits, digits_profile, tmp_path: Path
) -> None:
    previous = _previous(tmp_path / "v1", exported_digits, digits_profile)
    threads = digits_profile.intra_op_threads
    changed_onnx = tmp_path / "changed.onnx"
    changed_onnx.write_bytes(exported_digits.onnx_path.read_bytes() + b"\0")
    changed = dataclasses.replace(exported_digits, onnx_path=changed_onnx)
    assert stored_profile(previous, changed, threads) is None  # not the same bytes
    assert stored_profile(previous, exported_digits, threads) is not None
    (previous.root / "model" / "profile.json").unlink()
    assert stored_profile(previous, exported_digits, threads) is None


def test_a_redeploy_takes_the_stored_plan_while_its_nodes_remain(
    exported_digits, digits_profile
) -> None:
    """The stored cuts and node order are kept even where a fresh DP on the stored costs
    would choose otherwise; a node gone or another shard count plans afresh."""
    nodes = default_nodes(3)
    first = plan_shards(exported_digits, digits_profile, nodes, 2, as_served=False)
    m = len(first.segment_ms)
    cut = 1 if first.dp.cuts != [1] else 2  # a cut the DP did not choose
    order = [nodes[2].name, nodes[0].name]  # an order it would not choose either
    stored = {
        "segment_ms": first.segment_ms,
        "served_ms": [1.0, 2.0],
        "rounds": 2,
        "settled": False,
        "plan": {"cuts": [cut], "nodes": order},
    }
    again = plan_shards(exported_digits, digits_profile, nodes, stored=stored)
    assert again.dp.cuts == [cut] and [s.node for s in again.dp.shards] == order
    assert again.served_ms == [1.0, 2.0] and again.rounds == 2 and not again.settled
    assert "still alternating" in plan_message(again)
    assert plan_shards(exported_digits, digits_profile, nodes, as_served=False).settled
    assert again.dp.shards[0].stop_segment == cut and again.dp.shards[1].stop_segment == m
    # nodes[2] has left the fleet: planned again, on what there is
    fresh = plan_shards(exported_digits, digits_profile, nodes[:2], stored=stored, as_served=False)
    assert {s.node for s in fresh.dp.shards} <= {nodes[0].name, nodes[1].name}
    # three shards asked for: not the stored two
    three = plan_shards(exported_digits, digits_profile, nodes, 3, stored=stored, as_served=False)
    assert len(three.dp.shards) == 3


def test_out_of_rounds_the_plan_that_measured_fastest_is_taken(monkeypatch) -> None:
    """Plans that oscillate between two cuts: settle_plan keeps the one whose slowest
    stage, as measured, was smaller, priced with the costs of its own round."""
    costs = ChainCosts([1.0, 1.0, 1.0, 1.0], [8, 8, 8, 8, 8])
    nodes = [NodeCapacity("a"), NodeCapacity("b")]

    def price(segment_ms: list[float], plan: Plan) -> Plan:
        return evaluate_split(dataclasses.replace(costs, segment_ms=segment_ms), nodes, plan.cuts)

    calls = iter([[1], [3], [1], [3]])

    def plan_with(segment_ms: list[float]) -> Plan:
        return price(segment_ms, evaluate_split(costs, nodes, next(calls)))

    # round 1 (cut at 1) measures a 5 ms stage; round 2 (cut at 3) a 2.5 ms one
    measured = iter([[1.0, 5.0], [2.5, 1.0], [1.0, 5.0]])
    monkeypatch.setattr(served_profile, "time_shards", lambda *a, **k: next(measured))
    settled = served_profile.settle_plan(
        None, None, costs.segment_ms, plan_with, {}, intra_op_threads=1, price=price, rounds=2
    )
    assert settled.plan.cuts == [3] and settled.rounds == 2 and not settled.settled
    assert settled.served_ms == [2.5, 1.0]
    assert max(s.stage_ms for s in settled.plan.shards) == pytest.approx(2.5)


def test_a_plan_the_dp_chooses_again_is_settled_in_that_round(monkeypatch) -> None:
    """A fixed point: the DP on the rescaled costs cuts where it cut before."""
    costs = ChainCosts([1.0, 1.0, 1.0, 1.0], [8, 8, 8, 8, 8])
    nodes = [NodeCapacity("a"), NodeCapacity("b")]

    def price(segment_ms: list[float], plan: Plan) -> Plan:
        return evaluate_split(dataclasses.replace(costs, segment_ms=segment_ms), nodes, plan.cuts)

    monkeypatch.setattr(served_profile, "time_shards", lambda *a, **k: [2.0, 2.0])
    settled = served_profile.settle_plan(
        None,
        None,
        costs.segment_ms,
        lambda ms: price(ms, evaluate_split(costs, nodes, [2])),
        {},
        intra_op_threads=1,
        price=price,
    )
    assert settled.settled and settled.rounds == 1 and settled.plan.cuts == [2]
