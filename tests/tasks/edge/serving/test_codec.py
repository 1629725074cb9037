"""numpy <-> OIP tensor encoding, and the hand-off of outputs to the next shard's inputs."""

from __future__ import annotations

import numpy as np
import pytest
from gpuflow.tasks.edge.manifest import KSERVE_TO_NUMPY
from gpuflow.tasks.edge.serving.codec import (
    TensorCodecError,
    add_output,
    build_infer_request,
    decode_response,
    decode_tensors,
)
from gpuflow.tasks.edge.serving.handoff import HandoffError, map_outputs_to_inputs
from gpuflow.tasks.edge.serving.proto import oip as pb


@pytest.mark.parametrize("datatype", sorted(KSERVE_TO_NUMPY))
def test_every_datatype_round_trips_through_raw_contents(datatype: str) -> None:
    dtype = KSERVE_TO_NUMPY[datatype]
    array = (np.arange(24).reshape(2, 3, 4) % 7).astype(dtype)
    request = build_infer_request("m", {"t": array})
    assert request.inputs[0].datatype == datatype
    assert list(request.inputs[0].shape) == [2, 3, 4]
    assert len(request.raw_input_contents[0]) == array.nbytes
    decoded = decode_tensors(request.inputs, request.raw_input_contents)["t"]
    assert decoded.dtype == dtype and np.array_equal(decoded, array)


def test_layout_is_row_major_little_endian_whatever_the_array() -> None:
    base = np.arange(6, dtype=">i4").reshape(2, 3)  # big-endian storage
    transposed = base.T  # not C-contiguous
    request = build_infer_request("m", {"t": transposed})
    raw = request.raw_input_contents[0]
    assert raw == np.ascontiguousarray(transposed).astype("<i4").tobytes()
    decoded = decode_tensors(request.inputs, request.raw_input_contents)["t"]
    assert np.array_equal(decoded, transposed)


def test_response_round_trip_keeps_output_order() -> None:
    response = pb.ModelInferResponse(model_name="m")
    add_output(response, "b", np.ones((2, 2), np.float32))
    add_output(response, "a", np.zeros(3, np.int64))
    decoded = decode_response(response)
    assert list(decoded) == ["b", "a"]
    assert decoded["a"].dtype == np.int64 and decoded["b"].shape == (2, 2)


def test_typed_contents_are_accepted() -> None:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2, 2])
    tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    tensor = request.inputs.add(name="i", datatype="INT64", shape=[3])
    tensor.contents.int64_contents.extend([7, -8, 9])
    decoded = decode_tensors(request.inputs, request.raw_input_contents)
    assert np.array_equal(decoded["x"], np.array([[1, 2], [3, 4]], np.float32))
    assert decoded["i"].dtype == np.int64 and decoded["i"].tolist() == [7, -8, 9]


def _raw_request(shape: list[int], raw: bytes, datatype: str = "FP32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


@pytest.mark.parametrize(
    ("request_factory", "expected"),
    [
        (lambda: _raw_request([2, 2], b"\0" * 12), "raw contents are 12 bytes"),
        (lambda: _raw_request([2, -1], b""), "negative dimension"),
        (lambda: _raw_request([1], b"a", "BYTES"), "datatype 'BYTES' is not supported"),
        (lambda: _raw_request([1], b"a", "fp32"), "datatype 'fp32' is not supported"),
    ],
)
def test_inconsistent_tensors_are_refused_with_the_reason(request_factory, expected: str) -> None:
    request = request_factory()
    with pytest.raises(TensorCodecError, match=expected):
        decode_tensors(request.inputs, request.raw_input_contents)


def test_raw_entry_count_must_match_tensor_count() -> None:
    request = build_infer_request("m", {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)})
    del request.raw_input_contents[1]
    with pytest.raises(TensorCodecError, match="2 tensors but 1 raw contents"):
        decode_tensors(request.inputs, request.raw_input_contents)


def test_raw_and_typed_contents_cannot_be_mixed() -> None:
    request = build_infer_request("m", {"a": np.zeros(2, np.float32)})
    request.inputs[0].contents.fp32_contents.extend([0.0, 0.0])
    with pytest.raises(TensorCodecError, match="one or the other"):
        decode_tensors(request.inputs, request.raw_input_contents)


def test_typed_contents_checks_count_range_and_fp16() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[3]).contents.fp32_contents.extend([1.0])
    with pytest.raises(TensorCodecError, match="holds 1 elements but shape"):
        decode_tensors(request.inputs, [])
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="INT8", shape=[1]).contents.int_contents.append(300)
    with pytest.raises(TensorCodecError, match="outside INT8"):
        decode_tensors(request.inputs, [])
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP16", shape=[0])
    with pytest.raises(TensorCodecError, match="FP16 can only travel as raw"):
        decode_tensors(request.inputs, [])


def test_duplicate_tensor_names_are_refused() -> None:
    request = build_infer_request("m", {"a": np.zeros(1, np.float32)})
    request.inputs.add(name="a", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0" * 4)
    with pytest.raises(TensorCodecError, match="appears twice"):
        decode_tensors(request.inputs, request.raw_input_contents)


def test_unsupported_numpy_dtype_is_refused_before_sending() -> None:
    with pytest.raises(TensorCodecError, match="tensor 's'"):
        build_infer_request("m", {"s": np.array(["text"])})
    with pytest.raises(TensorCodecError, match="no input tensors"):
        build_infer_request("m", {})


def test_handoff_by_name_by_position_and_refusal() -> None:
    h = np.ones(2, np.float32)
    extra = np.zeros(1, np.float32)
    assert map_outputs_to_inputs({"h": h, "aux": extra}, ["h"]) == {"h": h}
    renamed = map_outputs_to_inputs({"out0": h}, ["in0"])
    assert list(renamed) == ["in0"] and renamed["in0"] is h
    with pytest.raises(HandoffError, match=r"cannot hand outputs \['a', 'b'\] to inputs \['c'\]"):
        map_outputs_to_inputs({"a": h, "b": extra}, ["c"])
