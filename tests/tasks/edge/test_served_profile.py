"""Shards are timed where their servers will run: on their node's cores, with the threads
the server will have there."""

from __future__ import annotations

import os

import onnx
import onnxruntime as ort
import pytest
from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.planning import plan_shards
from gpuflow.tasks.edge.served_profile import pinned, time_shards
from gpuflow.tasks.edge.serving.shard_model import served_session_options

NO_SUCH_CORE = 4095  # above any core count this suite runs on (the kernel's mask limit)


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def test_pinned_holds_the_thread_to_the_cores_and_auto_threads_count_them() -> None:
    before = os.sched_getaffinity(0)
    core = _cores()[-1]
    with pinned([core]):
        assert os.sched_getaffinity(0) == {core}
        # "auto" threads, as a server pinned to this one core would start them
        assert served_session_options(0).intra_op_num_threads == 1
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def test_pinned_to_a_core_it_cannot_use_names_it_and_changes_nothing() -> None:
    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match=rf"node 'far'.*core\(s\) \[{NO_SUCH_CORE}\]"):
        with pinned([_cores()[0], NO_SUCH_CORE], "node 'far'"):
            pass  # pragma: no cover - not reached
    assert os.sched_getaffinity(0) == before


def test_each_shard_is_timed_on_its_nodes_cores(
    exported_digits, digits_profile, monkeypatch: pytest.MonkeyPatch
) -> None:
    cores = _cores()
    nodes = [
        EdgeNode(name="a", cpus=[cores[0]]),
        EdgeNode(name="b", cpus=[cores[-1]]),
        EdgeNode(name="c"),  # not pinned: timed wherever the planner runs
    ]
    result = plan_shards(exported_digits, digits_profile, nodes, 3, as_served=False)
    outputs = {result.cuts.boundaries[s.stop_segment].name: s.node for s in result.dp.shards}
    seen: dict[str, set[frozenset[int]]] = {}
    run = ort.InferenceSession.run

    def spy(self, output_names, *args, **kwargs):
        seen.setdefault(outputs[output_names[0]], set()).add(frozenset(os.sched_getaffinity(0)))
        return run(self, output_names, *args, **kwargs)

    monkeypatch.setattr(ort.InferenceSession, "run", spy)
    before = os.sched_getaffinity(0)
    times = time_shards(
        onnx.load(str(exported_digits.onnx_path)),
        result.cuts,
        result.dp,
        exported_digits.sample_inputs(batch=digits_profile.batch),
        intra_op_threads=1,
        cpus_of={n.name: n.cpus for n in nodes},
        runs=2,
        warmup=1,
    )
    assert len(times) == 3 and all(t > 0 for t in times)
    assert seen == {
        "a": {frozenset({cores[0]})},
        "b": {frozenset({cores[-1]})},
        "c": {frozenset(before)},
    }
    assert os.sched_getaffinity(0) == before


def test_a_plan_for_a_node_on_a_core_this_machine_lacks_is_refused_before_launch(
    exported_digits, digits_profile
) -> None:
    nodes = [EdgeNode(name="near"), EdgeNode(name="far", cpus=[NO_SUCH_CORE])]
    with pytest.raises(ValueError, match=rf"node 'far'.*\[{NO_SUCH_CORE}\]"):
        plan_shards(exported_digits, digits_profile, nodes, 2)
