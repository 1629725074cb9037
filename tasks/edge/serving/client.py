"""A small Open Inference Protocol (KServe v2) gRPC client.

``OipClient`` speaks the standard ``inference.GRPCInferenceService``, so it works against a
gpuflow shard server as well as Triton, KServe, MLServer or OpenVINO Model Server. Tensors
travel as raw contents. Every failed call raises ``OipError`` carrying the gRPC status code
and the server's details, prefixed with the RPC and the address.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import grpc
import numpy as np
from gpuflow.tasks.edge.manifest import parse_hop
from gpuflow.tasks.edge.serving.codec import build_infer_request, decode_response
from gpuflow.tasks.edge.serving.proto import oip as pb

# Activation tensors exceed gRPC's 4 MiB default receive limit (a ResNet stage boundary at
# batch 8 is ~25 MB); servers and clients both raise it to this.
DEFAULT_MAX_MESSAGE_MB = 256


def channel_options(max_message_mb: int = DEFAULT_MAX_MESSAGE_MB) -> list[tuple[str, int]]:
    """gRPC channel/server options raising the send and receive message limits."""
    if not isinstance(max_message_mb, int) or not 1 <= max_message_mb <= 2047:
        # gRPC stores the limit in an int32.
        raise ValueError(f"max_message_mb must be an int in [1, 2047], got {max_message_mb!r}")
    limit = max_message_mb * 1024 * 1024
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
    ]


class OipError(RuntimeError):
    """An OIP call failed; ``code`` is the grpc.StatusCode, ``details`` the server's message."""

    def __init__(self, method: str, address: str, code: grpc.StatusCode, details: str) -> None:
        self.method = method
        self.address = address
        self.code = code
        self.details = details
        super().__init__(f"{method} on {address} failed: {code.name}: {details}")


@dataclass(frozen=True)
class TensorMetadata:
    """A model input or output as the server describes it (-1 = variable dimension)."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


@dataclass(frozen=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


def _tensors(items: Sequence[Any]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(t.name, t.datatype, tuple(t.shape)) for t in items)


class OipClient:
    """Blocking OIP client for one server; thread-safe (one channel, many calls in flight)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
    ) -> None:
        parse_hop(address)  # a clear error for a malformed "host:port" before any connection
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        self.address = address
        self.timeout_s = float(timeout_s)
        self._channel = grpc.insecure_channel(address, options=channel_options(max_message_mb))
        self.stub = pb.GRPCInferenceServiceStub(self._channel)

    def _call(self, method: str, request: Any, timeout_s: float | None = None) -> Any:
        try:
            return getattr(self.stub, method)(request, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as exc:
            raise OipError(method, self.address, exc.code(), exc.details() or "") from None

    def server_live(self) -> bool:
        return bool(self._call("ServerLive", pb.ServerLiveRequest()).live)

    def server_ready(self) -> bool:
        return bool(self._call("ServerReady", pb.ServerReadyRequest()).ready)

    def model_ready(self, name: str, version: str = "") -> bool:
        return bool(
            self._call("ModelReady", pb.ModelReadyRequest(name=name, version=version)).ready
        )

    def server_metadata(self) -> ServerMetadata:
        resp = self._call("ServerMetadata", pb.ServerMetadataRequest())
        return ServerMetadata(resp.name, resp.version, tuple(resp.extensions))

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        resp = self._call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version))
        return ModelMetadata(
            name=resp.name,
            versions=tuple(resp.versions),
            platform=resp.platform,
            inputs=_tensors(resp.inputs),
            outputs=_tensors(resp.outputs),
        )

    def infer_request(
        self, request: pb.ModelInferRequest, timeout_s: float | None = None
    ) -> pb.ModelInferResponse:
        """Send a prepared ModelInferRequest and return the raw response message."""
        return self._call("ModelInfer", request, timeout_s)

    def infer(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        *,
        version: str = "",
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """Run model ``name`` on ``inputs``; the output arrays by name (read-only, zero-copy).

        ``outputs`` limits which outputs come back (default: all of them).
        """
        request = build_infer_request(
            name, inputs, outputs, model_version=version, request_id=request_id
        )
        return decode_response(self.infer_request(request))

    def wait_until_ready(
        self, model_name: str | None = None, timeout_s: float = 60.0, poll_s: float = 0.1
    ) -> None:
        """Block until the server (and ``model_name``, if given) is ready; TimeoutError naming
        the last reason otherwise. A server that is still starting is not an error."""
        deadline = time.monotonic() + timeout_s
        reason = "no answer yet"
        while True:
            # Each probe gets at most the time left, so a hung server cannot stretch the wait.
            probe_s = max(0.05, min(self.timeout_s, deadline - time.monotonic()))
            try:
                if not self._call("ServerReady", pb.ServerReadyRequest(), probe_s).ready:
                    reason = "server answers but is not ready"
                elif (
                    model_name is not None
                    and not self._call(
                        "ModelReady", pb.ModelReadyRequest(name=model_name), probe_s
                    ).ready
                ):
                    reason = f"model {model_name!r} is not ready"
                else:
                    return
            except OipError as exc:
                reason = str(exc)
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"OIP server {self.address} not ready after {timeout_s:.1f} s: {reason}"
                )
            time.sleep(poll_s)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> OipClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
