"""Cut points by graph analysis: skip connections, constants, and the ResNet block rule."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from gpuflow.tasks.edge.cuts import CutError, find_cuts, live_tensor_counts
from onnx import TensorProto, helper


def _model(nodes, extra_outputs=(), initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 4]), *extra_outputs],
        initializer=list(initializers),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return onnx.shape_inference.infer_shapes(model)


def test_skip_connection_keeps_two_tensors_live() -> None:
    # x -> a=Relu -> b=Neg(a) -> c=Add(b, a) -> d=Relu -> out=Sigmoid(d*k), k a Constant
    # made first and read last: a constant is not live, so it must not block any cut.
    k = helper.make_tensor("kval", TensorProto.FLOAT, [4], np.full(4, 2.0, np.float32))
    model = _model(
        [
            helper.make_node("Constant", [], ["k"], name="const", value=k),
            helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
            helper.make_node("Neg", ["a"], ["b"], name="neg"),
            helper.make_node("Add", ["b", "a"], ["c"], name="add_skip"),
            helper.make_node("Relu", ["c"], ["d"], name="relu_d"),
            helper.make_node("Mul", ["d", "k"], ["e"], name="mul_k"),
            helper.make_node("Sigmoid", ["e"], ["out"], name="sigmoid"),
        ]
    )
    cuts = find_cuts(model)
    # b is not a cut: while it is live, a is still needed by the Add (the skip path).
    assert [c.tensor for c in cuts.cuts] == ["a", "c", "d", "e"]
    assert [c.spec.shape for c in cuts.cuts] == [(-1, 4)] * 4
    assert cuts.cuts[0].bytes_per_item == 16
    # Segments partition every node exactly once, in dependency order.
    flat = sorted(i for seg in cuts.segments for i in seg)
    assert flat == list(range(len(cuts.order)))
    assert len(cuts.segments) == len(cuts.cuts) + 1
    names = [[cuts.node_names[i] for i in seg] for seg in cuts.segments]
    assert names[1] == ["neg", "add_skip"]
    assert "const" in names[-1] or any("const" in s for s in names)
    assert max(live_tensor_counts(model)) == 2


def test_names_do_not_matter_topology_does() -> None:
    # The file lists the nodes out of order; the analysis sorts them topologically itself.
    model = _model(
        [
            helper.make_node("Sigmoid", ["t2"], ["out"], name="z"),
            helper.make_node("Relu", ["t1"], ["t2"], name="y"),
            helper.make_node("Relu", ["x"], ["t1"], name="x"),
        ]
    )
    assert [c.tensor for c in find_cuts(model).cuts] == ["t1", "t2"]


def test_input_reused_at_the_end_leaves_no_cut() -> None:
    model = _model(
        [
            helper.make_node("Relu", ["x"], ["a"], name="r1"),
            helper.make_node("Neg", ["a"], ["b"], name="n1"),
            helper.make_node("Add", ["b", "x"], ["out"], name="long_skip"),
        ]
    )
    assert find_cuts(model).cuts == []


def test_two_inputs_are_rejected() -> None:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["out"])],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1])],
    )
    with pytest.raises(CutError, match="one graph input"):
        find_cuts(helper.make_model(graph))


def test_resnet_cuts_fall_only_between_blocks(exported_digits) -> None:
    model = onnx.load(str(exported_digits.onnx_path))
    cuts = find_cuts(model)
    producer = {o: n for n in cuts.order for o in n.output}
    ops = [producer[c.tensor].op_type for c in cuts.cuts]
    # resnet18: 8 basic blocks; each ends in Add (the skip joins) then Relu, both cuts.
    assert ops.count("Add") == 8
    # No cut inside a block: the only Conv output that is a cut is the stem's.
    conv_cuts = [c.tensor for c, op in zip(cuts.cuts, ops, strict=True) if op == "Conv"]
    assert conv_cuts == [cuts.order[0].output[0]]
    # Every block's inner tensors (the conv outputs) are excluded while the skip is live.
    inner = [n.output[0] for n in cuts.order[1:] if n.op_type == "Conv"]
    assert not set(inner) & {c.tensor for c in cuts.cuts}
    # The boundaries shrink spatially and grow in channels, as the stages do.
    assert cuts.cuts[-1].spec.shape == (-1, 256)
    assert sum(cuts.weight_bytes) > 0
