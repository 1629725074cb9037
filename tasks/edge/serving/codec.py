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
from gpuflow.tasks.edge.serving.shm import (
    RegionRegistry,
    SharedMemoryError,
    ShmTensorRef,
    set_tensor_ref,
    tensor_ref,
)

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


def _datatype(name: str, arr: np.ndarray) -> str:
    try:
        # Byte order is a storage detail here (the wire is always little-endian).
        return kserve_dtype(arr.dtype.newbyteorder("="))
    except ValueError as exc:
        raise TensorCodecError(f"tensor {name!r}: {exc}") from None


def encode_array(name: str, array: Any) -> tuple[str, list[int], bytes]:
    """(datatype, shape, raw bytes) of an array; TensorCodecError for an unsupported dtype."""
    arr = np.asarray(array)
    datatype = _datatype(name, arr)
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
    shm: Sequence[ShmTensorRef] | None = None,
) -> pb.ModelInferRequest:
    """A ModelInferRequest carrying ``inputs`` as raw contents, in the mapping's order, or,
    with ``shm`` (one place per input, already written there), by reference."""
    if not isinstance(model_name, str) or not model_name:
        raise TensorCodecError(f"model name must be a non-empty string, got {model_name!r}")
    if not inputs:
        raise TensorCodecError(f"request for model {model_name!r} has no input tensors")
    if shm is not None and len(shm) != len(inputs):
        raise TensorCodecError(f"{len(inputs)} inputs but {len(shm)} shared-memory places")
    request = pb.ModelInferRequest(
        model_name=model_name, model_version=model_version, id=request_id
    )
    for index, (name, array) in enumerate(inputs.items()):
        if shm is not None:
            arr = np.asarray(array)
            tensor = request.inputs.add(
                name=name, datatype=_datatype(name, arr), shape=list(arr.shape)
            )
            set_tensor_ref(tensor.parameters, shm[index])
            continue
        datatype, shape, raw = encode_array(name, array)
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(raw)
    for name in outputs or ():
        request.outputs.add(name=name)
    return request


def add_output(
    response: pb.ModelInferResponse,
    name: str,
    array: Any,
    place: ShmTensorRef | None = None,
    regions: RegionRegistry | None = None,
) -> None:
    """Append one output tensor to a response: as raw contents, or written into the
    shared-memory ``place`` the request named (then its raw entry is empty, as Triton's
    server leaves it, so raw entries keep one index per output)."""
    if place is None:
        datatype, shape, raw = encode_array(name, array)
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(raw)
        return
    arr = np.ascontiguousarray(array)
    datatype = _datatype(name, arr)
    if regions is None or arr.nbytes > place.byte_size:
        raise TensorCodecError(
            f"output {name!r} needs {arr.nbytes} bytes but shared-memory region "
            f"{place.region!r} offers {place.byte_size if regions is not None else 0}"
        )
    try:
        view = regions.view(place.region, place.offset, arr.nbytes, name)
    except SharedMemoryError as exc:
        raise TensorCodecError(str(exc)) from None
    np.frombuffer(view, dtype=np.uint8)[...] = arr.reshape(-1).view(np.uint8)
    tensor = response.outputs.add(name=name, datatype=datatype, shape=list(arr.shape))
    set_tensor_ref(tensor.parameters, ShmTensorRef(place.region, arr.nbytes, place.offset))
    response.raw_output_contents.append(b"")


def output_places(request: pb.ModelInferRequest) -> dict[str, ShmTensorRef]:
    """The requested outputs that are to be written into shared memory, by name."""
    places: dict[str, ShmTensorRef] = {}
    for out in request.outputs:
        try:
            ref = tensor_ref(out.parameters, out.name)
        except SharedMemoryError as exc:
            raise TensorCodecError(str(exc)) from None
        if ref is not None:
            places[out.name] = ref
    return places


def decode_tensors(
    tensors: Sequence[Any],
    raw_contents: Sequence[bytes],
    regions: RegionRegistry | None = None,
) -> dict[str, np.ndarray]:
    """Arrays from the ``inputs`` of a request or the ``outputs`` of a response.

    ``tensors`` are InferInputTensor or InferOutputTensor messages and ``raw_contents`` the
    matching raw list (empty when typed contents are used). A tensor with the shared-memory
    parameters (shm.py) is read in place from ``regions`` and has no raw entry, as in
    Triton's extension; the raw entries belong to the other tensors, in order. The arrays
    share memory with the message bytes or the region (no copy) and are read-only.
    """
    refs = [_shm_ref(t, regions) for t in tensors]
    carried = [t for t, ref in zip(tensors, refs, strict=True) if ref is None]
    if raw_contents and len(raw_contents) != len(carried):
        raise TensorCodecError(
            f"{len(carried)} tensors but {len(raw_contents)} raw contents entries; the protocol "
            "needs exactly one raw entry per tensor not in shared memory, in order"
        )
    raw_iter = iter(raw_contents)
    arrays: dict[str, np.ndarray] = {}
    for index, (tensor, ref) in enumerate(zip(tensors, refs, strict=True)):
        name = tensor.name
        if not name:
            raise TensorCodecError(f"tensor #{index} has no name")
        if name in arrays:
            raise TensorCodecError(f"tensor {name!r} appears twice")
        dtype = wire_dtype(tensor.datatype)
        shape = _check_shape(name, tensor.shape)
        count = math.prod(shape)
        if ref is not None:
            assert regions is not None
            _check_size(name, tensor.datatype, dtype, shape, ref.byte_size, "shared memory holds")
            try:
                view = regions.view(ref.region, ref.offset, ref.byte_size, name)
            except SharedMemoryError as exc:
                raise TensorCodecError(str(exc)) from None
            array = np.frombuffer(view, dtype=dtype).reshape(shape)
            array.flags.writeable = False
            arrays[name] = array
        elif raw_contents:
            if tensor.HasField("contents"):
                raise TensorCodecError(
                    f"tensor {name!r} has typed contents although raw contents are used; "
                    "the protocol allows one or the other"
                )
            raw = next(raw_iter)
            _check_size(name, tensor.datatype, dtype, shape, len(raw), "raw contents are")
            arrays[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
        else:
            arrays[name] = _decode_typed(name, tensor.datatype, dtype, shape, count, tensor)
    return arrays


def _shm_ref(tensor: Any, regions: RegionRegistry | None) -> ShmTensorRef | None:
    try:
        ref = tensor_ref(tensor.parameters, tensor.name)
    except SharedMemoryError as exc:
        raise TensorCodecError(str(exc)) from None
    if ref is not None and regions is None:
        raise TensorCodecError(
            f"tensor {tensor.name!r} names shared-memory region {ref.region!r}, but shared "
            "memory is not available here"
        )
    return ref


def _check_size(
    name: str, datatype: str, dtype: np.dtype, shape: tuple[int, ...], have: int, where: str
) -> None:
    want = math.prod(shape) * dtype.itemsize
    if have != want:
        raise TensorCodecError(
            f"tensor {name!r}: {where} {have} bytes but shape {list(shape)} x "
            f"{datatype} ({dtype.itemsize} B) needs {want} bytes"
        )


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
