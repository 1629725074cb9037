"""The Open Inference Protocol (KServe v2 gRPC) messages and service, without generated code.

The message classes are built at import from ``grpc_predict_v2.binpb`` (the serialized
descriptor of grpc_predict_v2.proto, scripts/gen_oip_protos.sh) in a descriptor pool of
gpuflow's own. Why not protoc's ``*_pb2.py``:

* Generated code pins the protobuf runtime it was made with (``ValidateProtobufRuntime
  Version``): stubs from protobuf 7 refuse protobuf 6, which tritonclient, KServe and
  MLServer require (< 7). A descriptor loads on either, so gpuflow installs beside them.
* Generated code registers its symbols in protobuf's default pool, where KServe's and
  Triton's stubs register the same names (package ``inference``): importing two sets in
  one process fails with "duplicate symbol 'inference.ServerLiveRequest'". A private pool
  holds ours apart; on the wire only field numbers and the method paths count, and those
  are the protocol's.

The service side is what grpcio's generated ``*_pb2_grpc.py`` would hold, from the same
descriptor: ``GRPCInferenceServiceStub`` (a client), ``GRPCInferenceServiceServicer`` (a
base whose methods answer UNIMPLEMENTED) and ``add_GRPCInferenceServiceServicer_to_server``.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "inference.GRPCInferenceService"
_DESCRIPTOR_FILE = "grpc_predict_v2.binpb"


def _load_pool() -> tuple[descriptor_pool.DescriptorPool, Any]:
    data = resources.files(__package__).joinpath(_DESCRIPTOR_FILE).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return pool, pool.FindFileByName(files.file[-1].name)


_POOL, DESCRIPTOR = _load_pool()
_SERVICE = DESCRIPTOR.services_by_name["GRPCInferenceService"]

# The top-level messages as module attributes (nested ones hang off their parents, as in
# generated code: ModelInferRequest.InferInputTensor, ...).
for _name, _message in DESCRIPTOR.message_types_by_name.items():
    globals()[_name] = message_factory.GetMessageClass(_message)

ServerLiveRequest: Any
ServerLiveResponse: Any
ServerReadyRequest: Any
ServerReadyResponse: Any
ModelReadyRequest: Any
ModelReadyResponse: Any
ServerMetadataRequest: Any
ServerMetadataResponse: Any
ModelMetadataRequest: Any
ModelMetadataResponse: Any
ModelInferRequest: Any
ModelInferResponse: Any
InferParameter: Any
InferTensorContents: Any
SystemSharedMemoryStatusRequest: Any
SystemSharedMemoryStatusResponse: Any
SystemSharedMemoryRegisterRequest: Any
SystemSharedMemoryRegisterResponse: Any
SystemSharedMemoryUnregisterRequest: Any
SystemSharedMemoryUnregisterResponse: Any
ModelStreamInferResponse: Any

# method name -> (request class, response class), in the protocol's order.
METHODS: dict[str, tuple[Any, Any]] = {
    m.name: (
        message_factory.GetMessageClass(m.input_type),
        message_factory.GetMessageClass(m.output_type),
    )
    for m in _SERVICE.methods
}
# The bidirectional streaming ones (Triton's ModelStreamInfer); the rest are unary.
STREAMING = frozenset(m.name for m in _SERVICE.methods if m.client_streaming or m.server_streaming)


def method_path(name: str) -> str:
    return f"/{SERVICE}/{name}"


class GRPCInferenceServiceStub:
    """A client of every RPC of the service on ``channel``: ``stub.ModelInfer(request)``."""

    def __init__(self, channel: grpc.Channel) -> None:
        for name, (request, response) in METHODS.items():
            kind = channel.stream_stream if name in STREAMING else channel.unary_unary
            setattr(
                self,
                name,
                kind(
                    method_path(name),
                    request_serializer=request.SerializeToString,
                    response_deserializer=response.FromString,
                    # As grpcio's generated stubs do: the channel resolves the method once.
                    _registered_method=True,
                ),
            )


class GRPCInferenceServiceServicer:
    """Base class of a server: every RPC answers UNIMPLEMENTED until a subclass defines it."""

    def _unimplemented(self, context: grpc.ServicerContext, name: str) -> None:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{SERVICE}/{name} is not implemented")

    def __getattr__(self, name: str) -> Any:
        if name in METHODS:
            return lambda request, context: self._unimplemented(context, name)
        raise AttributeError(name)


def add_GRPCInferenceServiceServicer_to_server(  # noqa: N802 - grpcio's generated name
    servicer: Any, server: grpc.Server
) -> None:
    """Register ``servicer``'s methods under the protocol's service name on ``server``."""
    handlers = {
        name: (
            grpc.stream_stream_rpc_method_handler
            if name in STREAMING
            else grpc.unary_unary_rpc_method_handler
        )(
            getattr(servicer, name),
            request_deserializer=request.FromString,
            response_serializer=response.SerializeToString,
        )
        for name, (request, response) in METHODS.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    # As grpcio's generated code does: calls then find their handler by name directly.
    server.add_registered_method_handlers(SERVICE, handlers)
