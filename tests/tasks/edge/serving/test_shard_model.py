"""A shard in onnxruntime writing its outputs into arrays it is given (the forwarding
shard's IOBinding path), and falling back where the graph's output shapes depend on the
data rather than on the input shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from gpuflow.tasks.edge.serving.shard_model import ShardModel
from onnx import TensorProto, helper

from tests.tasks.edge.serving.conftest import _model, package_shard


def _nonzero_shard(root: Path) -> ShardModel:
    """x[N] -> positions of its non-zero entries [1, M]: M depends on the data."""
    model = _model(
        [helper.make_node("NonZero", ["x"], ["idx"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [1, "M"])],
        [],
    )
    onnx.save(model, root / "nz.onnx")
    return ShardModel(package_shard(root / "nz.onnx", root / "nz", "nz", 0, 1))


def test_outputs_written_into_given_arrays_once_their_shapes_are_known(tmp_path: Path) -> None:
    shard = _nonzero_shard(tmp_path)
    x = np.array([0.0, 1.0, 0.0, 2.0], np.float32)
    assert shard.output_layout({"x": x}, ["idx"]) is None  # never ran: nothing known
    shard.run({"x": x}, ["idx"])
    assert shard.output_layout({"x": x}, ["idx"]) is None  # not asked to learn it
    first = shard.run({"x": x}, ["idx"], learn_layout=True)
    layout = shard.output_layout({"x": x}, ["idx"])
    assert layout == [(np.dtype(np.int64), (1, 2))]
    into = [np.full((1, 2), -1, np.int64)]
    got = shard.run({"x": x}, ["idx"], into)
    assert got["idx"] is into[0]  # written where it was asked to be
    np.testing.assert_array_equal(into[0], first["idx"])


def test_shapes_that_depend_on_the_data_are_not_bound_again(tmp_path: Path) -> None:
    shard = _nonzero_shard(tmp_path)
    x = np.array([0.0, 1.0, 0.0, 2.0], np.float32)
    shard.run({"x": x}, ["idx"], learn_layout=True)
    more = np.array([3.0, 1.0, 0.0, 2.0], np.float32)  # same signature, three non-zeros
    stale = [np.zeros((1, 2), np.int64)]  # laid out as the signature's last run
    got = shard.run({"x": more}, ["idx"], stale)  # onnxruntime refuses; run as usual
    np.testing.assert_array_equal(got["idx"], [[0, 1, 3]])
    assert shard.output_layout({"x": x}, ["idx"]) is None  # never bound again
    shard.run({"x": x}, ["idx"], learn_layout=True)
    assert shard.output_layout({"x": x}, ["idx"]) is None


def test_a_shard_keeps_the_layouts_of_a_bounded_number_of_signatures(tmp_path: Path) -> None:
    from gpuflow.tasks.edge.serving import shard_model

    shard = _nonzero_shard(tmp_path)
    for n in range(1, shard_model._MAX_LAYOUTS + 3):  # each length a signature of its own
        shard.run({"x": np.ones(n, np.float32)}, ["idx"], learn_layout=True)
    assert shard.output_layout({"x": np.ones(1, np.float32)}, ["idx"]) is not None
    beyond = {"x": np.ones(shard_model._MAX_LAYOUTS + 2, np.float32)}
    assert shard.output_layout(beyond, ["idx"]) is None  # not learnt: the table was full
