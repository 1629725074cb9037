"""A small Open Inference Protocol (KServe v2) gRPC client.

``OipClient`` speaks the standard ``inference.GRPCInferenceService``, so it works against a
gpuflow shard server as well as Triton, KServe, MLServer or OpenVINO Model Server. Tensors
travel as raw contents, or, where the server shares this host, as references into shared
memory (Triton's system shared-memory extension, shm.py): ``shared_memory="auto"`` (the
default) tries it for a loopback address and falls back to raw contents for good if the
server does not take the registration (another host, or no such extension). Every failed
call raises ``OipError`` carrying the gRPC status code and the server's details, prefixed
with the RPC and the address.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal

import grpc
import numpy as np
from gpuflow.tasks.edge.manifest import parse_hop
from gpuflow.tasks.edge.serving.codec import build_infer_request, decode_response
from gpuflow.tasks.edge.serving.proto import oip as pb
from gpuflow.tasks.edge.serving.shm import (
    UNREGISTERED_REGION,
    Reservation,
    SlotPool,
    TensorLayout,
)
from gpuflow.tasks.edge.serving.stream import StreamBroken, StreamPool

log = logging.getLogger(__name__)
SharedMemoryMode = Literal["auto", "on", "off"]
# A registration refused for these reasons will not work later either: the server has no
# such extension, or cannot open our key (it is on another host).
_NO_SHARED_MEMORY = (
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
)

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


def _forgot_our_regions(exc: OipError) -> bool:
    return (
        exc.method == "ModelInfer"
        and exc.code == grpc.StatusCode.INVALID_ARGUMENT
        and UNREGISTERED_REGION in exc.details
    )


def _loopback(host: str) -> bool:
    if host.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _tensors(items: Sequence[Any]) -> tuple[TensorMetadata, ...]:
    return tuple(TensorMetadata(t.name, t.datatype, tuple(t.shape)) for t in items)


class OipClient:
    """Blocking OIP client for one server; thread-safe (one channel, many calls in flight).

    ``streaming``: inference requests travel on persistent ModelStreamInfer streams where
    one is free (stream.py; what a forwarding shard uses for its next hop)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = 30.0,
        max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
        shared_memory: SharedMemoryMode = "auto",
        streaming: bool = False,
    ) -> None:
        host, _ = parse_hop(address)  # a clear error for a malformed "host:port" first
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s!r}")
        if shared_memory not in ("auto", "on", "off"):
            raise ValueError(f"shared_memory must be 'auto', 'on' or 'off', got {shared_memory!r}")
        self.address = address
        self.timeout_s = float(timeout_s)
        self._channel = grpc.insecure_channel(address, options=channel_options(max_message_mb))
        self.stub = pb.GRPCInferenceServiceStub(self._channel)
        self.shared_memory = shared_memory
        # "auto": only where the server is surely on this host; "on" also tries elsewhere.
        self._try_shm = shared_memory == "on" or (shared_memory == "auto" and _loopback(host))
        self._slots: SlotPool | None = None
        self._shm_lock = threading.Lock()
        # streaming: inference on a few open ModelStreamInfer streams (stream.py), unary
        # where none is free or one broke. A stream's error is raised as ModelInfer's.
        self._streams = (
            StreamPool(
                self.stub.ModelStreamInfer,
                lambda code, details: OipError("ModelInfer", address, code, details),
            )
            if streaming
            else None
        )

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
        if self._streams is not None:
            try:
                return self._streams.infer(request, timeout_s or self.timeout_s)
            except StreamBroken as exc:
                log.debug("%s: stream not usable (%s), sending unary", self.address, exc)
        return self._call("ModelInfer", request, timeout_s)

    def register_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=byte_size
        )
        self._call("SystemSharedMemoryRegister", request)

    def unregister_shared_memory(self, name: str = "") -> None:
        self._call(
            "SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name)
        )

    def shared_memory_status(self, name: str = "") -> dict[str, tuple[str, int, int]]:
        """Registered regions: name -> (key, offset, byte_size)."""
        resp = self._call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name))
        return {n: (r.key, r.offset, r.byte_size) for n, r in resp.regions.items()}

    def _gives_up_shared_memory(self, exc: OipError) -> bool:
        """Whether a failed registration means raw contents from now on ("auto" only)."""
        if (
            exc.method != "SystemSharedMemoryRegister"
            or exc.code not in _NO_SHARED_MEMORY
            or self.shared_memory == "on"
        ):
            return False
        log.info(
            "%s: shared memory not available, raw contents from now on: %s",
            self.address,
            exc.details,
        )
        return True

    def _slot_pool(self) -> SlotPool | None:
        """The shared-memory slots for this server, made on first use; None when the raw
        path is in force (off, not this host, or the server refused a registration)."""
        with self._shm_lock:
            if self._try_shm and self._slots is None:
                self._slots = SlotPool(
                    lambda name, key, size: self.register_shared_memory(name, key, size),
                    self.unregister_shared_memory,
                )
            return self._slots

    def reserve_inputs(self, layouts: Sequence[TensorLayout]) -> Reservation | None:
        """A shared-memory slot laid out for inputs of these dtypes and shapes, for the
        caller to write (onnxruntime's IOBinding) and pass to ``infer_response`` uncopied;
        the caller releases it after the call. None where the raw path is in force or the
        slot cannot be had now (``infer_response`` then registers, and says why)."""
        pool = self._slot_pool()
        if pool is None:
            return None
        try:
            return pool.reserve(layouts)
        except (OipError, OSError) as exc:
            log.debug("%s: no slot reserved (%s); the inputs will be copied", self.address, exc)
            return None

    def infer_response(
        self,
        name: str,
        inputs: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        *,
        version: str = "",
        request_id: str = "",
        timeout_s: float | None = None,
    ) -> pb.ModelInferResponse:
        """Run model ``name`` on ``inputs``; the response message. Inputs go through shared
        memory when it is in force for this server, else as raw contents."""
        pool = self._slot_pool()
        if pool is not None:
            arrays = [np.asarray(a) for a in inputs.values()]
            for attempt in (1, 2):
                try:
                    with pool.slot(arrays) as places:
                        request = build_infer_request(
                            name,
                            inputs,
                            outputs,
                            model_version=version,
                            request_id=request_id,
                            shm=places,
                        )
                        return self.infer_request(request, timeout_s)
                except OipError as exc:
                    if attempt == 1 and _forgot_our_regions(exc):
                        # The server restarted (a supervisor brought it back at the same
                        # address): our registrations died with the old process.
                        log.info("%s forgot our shared memory; registering again", self.address)
                        pool.server_forgot()
                        continue
                    if not self._gives_up_shared_memory(exc):
                        raise
                    with self._shm_lock:
                        self._try_shm, self._slots = False, None
                    pool.close()
                    break
        request = build_infer_request(
            name, inputs, outputs, model_version=version, request_id=request_id
        )
        return self.infer_request(request, timeout_s)

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
        return decode_response(
            self.infer_response(name, inputs, outputs, version=version, request_id=request_id)
        )

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
        if self._streams is not None:
            self._streams.close()
        with self._shm_lock:
            pool, self._slots, self._try_shm = self._slots, None, False
        if pool is not None:
            pool.close()  # unregisters (while the channel is open) and unlinks the slots
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
