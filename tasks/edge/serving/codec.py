"""numpy arrays <-> Open Inference Protocol (KServe v2) tensors.

Arrays travel as raw contents (``raw_input_contents`` / ``raw_output_contents``): the
elements flattened row-major, little-endian, no padding. Decoding also accepts the typed
``contents`` fields (``fp32_contents`` ...) that some standard clients send, so any OIP
client can call a gpuflow server. Every size is checked before a byte is interpreted:
a tensor whose bytes do not match its shape x datatype is a ``TensorCodecError`` naming the
tensor, never a silently reshaped array. BYTES (strings) tensors are not supported: shards
carry numeric activations only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from gpuflow.tasks.edge.manifest import KSERVE_TO_NUMPY, kserve_dtype
from gpuflow.tasks.edge.serving.proto import oip as pb

# Which typed-contents field carries each datatype (the protocol's table); FP16 has none.
_TYPED_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


class TensorCodecError(ValueError):
    """A tensor's name, datatype, shape or contents are inconsistent or unsupported."""


def wire_dtype(datatype: str) -> np.dtype:
    """The little-endian numpy dtype of a KServe datatype; TensorCodecError if unsupported."""
    try:
        return KSERVE_TO_NUMPY[datatype].newbyteorder("<")
    except (KeyError, TypeError):
        raise TensorCodecError(
            f"datatype {datatype!r} is not supported; supported: {', '.join(KSERVE_TO_NUMPY)}"
        ) from None


def _check_shape(name: str, shape: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise TensorCodecError(f"tensor {name!r}: shape {list(dims)} has a negative dimension")
    return dims


def encode_array(name: str, array: Any) -> tuple[str, list[int], bytes]:
    """(datatype, shape, raw bytes) of an array; TensorCodecError for an unsupported dtype."""
    arr = np.asarray(array)
    try:
        # Byte order is a storage detail here (the wire is always little-endian).
        datatype = kserve_dtype(arr.dtype.newbyteorder("="))
    except ValueError as exc:
        raise TensorCodecError(f"tensor {name!r}: {exc}") from None
    # ascontiguousarray + '<' byte order: the wire layout is row-major little-endian.
    raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
    return datatype, list(arr.shape), raw


def build_infer_request(
    model_name: str,
    inputs: Mapping[str, Any],
    outputs: Sequence[str] | None = None,
    *,
    model_version: str = "",
    request_id: str = "",
) -> pb.ModelInferRequest:
    """A ModelInferRequest carrying ``inputs`` as raw contents, in the mapping's order."""
    if not isinstance(model_name, str) or not model_name:
        raise TensorCodecError(f"model name must be a non-empty string, got {model_name!r}")
    if not inputs:
        raise TensorCodecError(f"request for model {model_name!r} has no input tensors")
    request = pb.ModelInferRequest(
        model_name=model_name, model_version=model_version, id=request_id
    )
    for name, array in inputs.items():
        datatype, shape, raw = encode_array(name, array)
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def add_output(response: pb.ModelInferResponse, name: str, array: Any) -> None:
    """Append one output tensor to a response as raw contents."""
    datatype, shape, raw = encode_array(name, array)
    response.outputs.add(name=name, datatype=datatype, shape=shape)
    response.raw_output_contents.append(raw)


def decode_tensors(tensors: Sequence[Any], raw_contents: Sequence[bytes]) -> dict[str, np.ndarray]:
    """Arrays from the ``inputs`` of a request or the ``outputs`` of a response.

    ``tensors`` are InferInputTensor or InferOutputTensor messages and ``raw_contents`` the
    matching raw list (empty when typed contents are used). The arrays share memory with the
    message bytes (no copy) and are read-only.
    """
    if raw_contents and len(raw_contents) != len(tensors):
        raise TensorCodecError(
            f"{len(tensors)} tensors but {len(raw_contents)} raw contents entries; "
            "the protocol needs exactly one raw entry per tensor, in order"
        )
    arrays: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(tensors):
        name = tensor.name
        if not name:
            raise TensorCodecError(f"tensor #{index} has no name")
        if name in arrays:
            raise TensorCodecError(f"tensor {name!r} appears twice")
        dtype = wire_dtype(tensor.datatype)
        shape = _check_shape(name, tensor.shape)
        count = math.prod(shape)
        if raw_contents:
            if tensor.HasField("contents"):
                raise TensorCodecError(
                    f"tensor {name!r} has typed contents although raw contents are used; "
                    "the protocol allows one or the other"
                )
            raw = raw_contents[index]
            want = count * dtype.itemsize
            if len(raw) != want:
                raise TensorCodecError(
                    f"tensor {name!r}: raw contents are {len(raw)} bytes but shape "
                    f"{list(shape)} x {tensor.datatype} ({dtype.itemsize} B) needs {want} bytes"
                )
            arrays[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
        else:
            arrays[name] = _decode_typed(name, tensor.datatype, dtype, shape, count, tensor)
    return arrays


def _decode_typed(
    name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], count: int, tensor: Any
) -> np.ndarray:
    field = _TYPED_FIELD.get(datatype)
    if field is None:
        raise TensorCodecError(
            f"tensor {name!r}: {datatype} can only travel as raw contents (the protocol has no "
            "typed field for it)"
        )
    values = getattr(tensor.contents, field)
    if len(values) != count:
        raise TensorCodecError(
            f"tensor {name!r}: {field} holds {len(values)} elements but shape {list(shape)} "
            f"needs {count}"
        )
    outside = TensorCodecError(f"tensor {name!r}: {field} holds values outside {datatype}")
    try:
        array = np.array(values, dtype=dtype)
    except OverflowError:  # numpy refuses a Python int that does not fit (protobuf 6's lists)
        raise outside from None
    if datatype not in ("BOOL", "FP32", "FP64") and not np.array_equal(array, np.array(values)):
        # int_contents/uint_contents are 32-bit on the wire: reject values that wrap.
        raise outside
    return array.reshape(shape)


def decode_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """The output arrays of a ModelInferResponse, by name, in the response's order."""
    return decode_tensors(response.outputs, response.raw_output_contents)
