"""Serve one model shard over the Open Inference Protocol (KServe v2) gRPC API.

    python -m gpuflow.tasks.edge.serving.server --shard-dir DIR --host 127.0.0.1 --port 8001 \
        [--forward-to HOST:PORT --forward-model NEXT_MODEL | --no-forward]

At start the shard's sha256 is checked against its manifest (a mismatch refuses to start:
exit code 3, the reason on stderr), the ONNX file is loaded with onnxruntime and its inputs
and outputs are checked against the manifest (exit code 2 on any other startup problem).
Once serving, one line ``READY model=<name> address=<host>:<port> ...`` goes to stdout
(``--port 0`` picks a free port; the line says which). SIGTERM or SIGINT stops it
gracefully: readiness turns false, in-flight requests finish, then it exits 0.

RPCs: ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer and
Triton's ModelStreamInfer of ``inference.GRPCInferenceService``; tensors as raw contents
(typed contents are accepted too). On the same port ``grpc.health.v1.Health``; with ``--http-port`` the KServe v2 REST
health endpoints and Prometheus ``/metrics`` in Triton's names (probes.py, metrics.py).
Status codes:

- ModelInfer for a model name or version this server does not serve: NOT_FOUND (as Triton
  answers). With anything else malformed -- an unknown, missing or repeated input, a wrong
  datatype or shape, raw bytes that do not match shape x datatype, an unknown requested
  output -- INVALID_ARGUMENT, with a message naming the problem. The server keeps serving.
- ModelMetadata for an unknown model or version: NOT_FOUND. ModelReady for one: ready=false.
  A forwarding shard's metadata lists the outputs its ModelInfer returns: the chain's final
  ones (its next hop's metadata); UNAVAILABLE while the next hop cannot say.
- Forwarding mode: the next hop's own status code, details prefixed with the hop; an
  unreachable next hop is UNAVAILABLE; outputs that cannot be handed to the next shard's
  inputs (a chain wired wrong) FAILED_PRECONDITION.

Forwarding mode (``--forward-to``, or the manifest's ``next_hop``): after computing, the
server renames its outputs to the next shard's inputs (names from the next hop's
ModelMetadata; see handoff.py), sends them to the next hop within the caller's deadline -
on one of a few open ModelStreamInfer streams, else unary ModelInfer (next_hop.py,
stream.py) - and returns that response, so the caller of shard 0 gets the chain's final
outputs. The caller's requested outputs name the final shard's outputs and are passed on.
ServerReady/ModelReady are true only while the next hop is ready too, so the head's
readiness covers the whole chain.
"""

# ruff: noqa: E402 - GRPC_EXPERIMENTS must be set before grpc is imported (see below)
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time

# gRPC's EventEngine listener and endpoints (on by default in grpcio 1.85) hand each read
# to a thread pool of their own: one more thread wake-up per message. With the older
# iomgr endpoints a 1.6 MB shared-memory hop measured 0.08-0.10 ms faster (docs/edge.md,
# "The hop at 1.6 MB"). gRPC reads the variable once, when it is imported, so only the
# server process sets it (run as ``python -m``, before the import below); a value the
# operator set is left alone, and an experiment a later grpcio no longer knows is logged
# once and ignored.
GRPC_EXPERIMENTS = "-event_engine_listener,-event_engine_for_all_other_endpoints"
if __name__ == "__main__":
    os.environ.setdefault("GRPC_EXPERIMENTS", GRPC_EXPERIMENTS)
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata as importlib_metadata
from pathlib import Path
from types import TracebackType

import grpc
import numpy as np
from gpuflow.tasks.edge.manifest import (
    ManifestError,
    ShardIntegrityError,
    ShardManifest,
    parse_hop,
)
from gpuflow.tasks.edge.serving.client import (
    DEFAULT_MAX_MESSAGE_MB,
    OipError,
    SharedMemoryMode,
    channel_options,
)
from gpuflow.tasks.edge.serving.codec import (
    TensorCodecError,
    add_output,
    decode_response,
    output_places,
)
from gpuflow.tasks.edge.serving.handoff import HandoffError, map_outputs_to_inputs
from gpuflow.tasks.edge.serving.metrics import InstrumentedServicer, ShardMetrics
from gpuflow.tasks.edge.serving.next_hop import NextHop
from gpuflow.tasks.edge.serving.probes import ProbeServer, ShardHealth, add_health
from gpuflow.tasks.edge.serving.proto import oip as pb
from gpuflow.tasks.edge.serving.shard_model import (
    InvalidRequestError,
    ModelNotFoundError,
    ShardModel,
)
from gpuflow.tasks.edge.serving.shm import RegionRegistry, SharedMemoryError
from gpuflow.tasks.edge.serving.stream import stream_error
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument as OrtInvalidArgument

log = logging.getLogger(__name__)

SERVER_NAME = "gpuflow-shard"
# Triton's platform string for ONNX models; OIP clients use it to tell runtimes apart.
PLATFORM = "onnxruntime_onnx"
READY_PREFIX = "READY "
EXIT_STARTUP_ERROR = 2
EXIT_INTEGRITY_ERROR = 3
# What ServerMetadata lists: Triton's extension names.
EXTENSIONS = ("system_shared_memory",)


def _server_version() -> str:
    try:
        return importlib_metadata.version("gpuflow")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


class ShardServicer(pb.GRPCInferenceServiceServicer):
    """GRPCInferenceService for one ShardModel, optionally forwarding to a next hop."""

    def __init__(
        self,
        model: ShardModel,
        next_hop: NextHop | None = None,
        metrics: ShardMetrics | None = None,
    ) -> None:
        self.model = model
        self.next_hop = next_hop
        self.metrics = metrics
        self.draining = False
        self.regions = RegionRegistry()  # Triton's system shared-memory extension (shm.py)
        self._streams: set[grpc.ServicerContext] = set()  # open ModelStreamInfer calls
        self._streams_lock = threading.Lock()

    def ready(self) -> bool:
        """Serving, and (forwarding) the next hop is ready: what every probe reports."""
        if self.draining:
            return False
        return self.next_hop is None or self.next_hop.ready()

    def ServerLive(self, request, context):  # noqa: N802 (protocol method names)
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):  # noqa: N802
        return pb.ServerReadyResponse(ready=self.ready())

    def ModelReady(self, request, context):  # noqa: N802
        return pb.ModelReadyResponse(
            ready=self.model.serves(request.name, request.version) and self.ready()
        )

    def ServerMetadata(self, request, context):  # noqa: N802
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=_server_version(), extensions=list(EXTENSIONS)
        )

    def SystemSharedMemoryRegister(self, request, context):  # noqa: N802
        try:
            self.regions.register(request.name, request.key, request.offset, request.byte_size)
        except SharedMemoryError as exc:
            context.abort(exc.code, str(exc))
        return pb.SystemSharedMemoryRegisterResponse()

    def SystemSharedMemoryUnregister(self, request, context):  # noqa: N802
        self.regions.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    def SystemSharedMemoryStatus(self, request, context):  # noqa: N802
        try:
            regions = self.regions.status(request.name)
        except SharedMemoryError as exc:
            context.abort(exc.code, str(exc))
        response = pb.SystemSharedMemoryStatusResponse()
        for name, key, offset, byte_size in regions:
            status = response.regions[name]
            status.name, status.key, status.offset, status.byte_size = name, key, offset, byte_size
        return response

    def ModelMetadata(self, request, context):  # noqa: N802
        if not self.model.serves(request.name, request.version):
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.name!r} version {request.version!r} is not served here; "
                f"this server serves {self.model.name!r}",
            )
        response = pb.ModelMetadataResponse(
            name=self.model.name,
            versions=[self.model.version] if self.model.version else [],
            platform=PLATFORM,
        )
        for spec in self.model.inputs.values():
            response.inputs.add(name=spec.name, datatype=spec.dtype, shape=list(spec.shape))
        for name, dtype, shape in self._returned_outputs(context):
            response.outputs.add(name=name, datatype=dtype, shape=list(shape))
        return response

    def _returned_outputs(self, context) -> list[tuple[str, str, tuple[int, ...]]]:
        """What a ModelInfer of this model returns: its own outputs, or, forwarding, the
        chain's final ones (the next hop's metadata says them, recursively)."""
        if self.next_hop is None:
            return [(s.name, s.dtype, tuple(s.shape)) for s in self.model.outputs.values()]
        try:
            meta = self.next_hop.metadata()
        except OipError as exc:
            context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"next hop {self.next_hop.address} cannot say what the chain returns: {exc}",
            )
        return [(t.name, t.datatype, t.shape) for t in meta.outputs]

    def ModelInfer(self, request, context):  # noqa: N802
        response, failure = self.infer(request, context.time_remaining())
        if failure:
            context.abort(*failure)
        return response

    def ModelStreamInfer(self, requests, context):  # noqa: N802
        """Triton's streaming inference: each request answered in order on the stream, a
        failure as ``error_message`` (stream.stream_error) and the stream goes on. ``drain``
        cancels open streams (their callers send unary from then on)."""
        with self._streams_lock:
            if self.draining:
                return
            self._streams.add(context)
        try:
            for request in requests:
                response, failure = self.infer(request, None)
                if failure:
                    yield pb.ModelStreamInferResponse(error_message=stream_error(*failure))
                else:
                    yield pb.ModelStreamInferResponse(infer_response=response)
        except grpc.RpcError:
            return  # cancelled (the caller went, or we drain): nothing left to answer
        finally:
            with self._streams_lock:
                self._streams.discard(context)

    def drain(self) -> None:
        """Stop taking work: not ready from now on, no new stream, and every open stream
        cancelled (each holds a worker thread while idle, and would hold a graceful stop
        for its whole grace period)."""
        with self._streams_lock:
            self.draining = True
            contexts, self._streams = list(self._streams), set()
        for context in contexts:
            context.cancel()

    def infer(
        self, request: pb.ModelInferRequest, time_remaining_s: float | None
    ) -> tuple[pb.ModelInferResponse | None, tuple[grpc.StatusCode, str] | None]:
        """One inference request, unary or on a stream: (response, None) or (None,
        (code, message)). ``time_remaining_s``: the caller's deadline, which a forwarded
        request keeps (None: the hop's own timeout)."""
        started = time.perf_counter()
        try:
            inputs = self.model.decode_inputs(request, self.regions)
            self._observe("input", started)
            wanted = (
                list(self.model.outputs)
                if self.next_hop is not None
                else self.model.requested_outputs(request)
            )
            places = output_places(request)
        except ModelNotFoundError as exc:  # before InvalidRequestError, its base
            log.info("rejected request %r: %s", request.id, exc)
            return None, (grpc.StatusCode.NOT_FOUND, str(exc))
        except (TensorCodecError, InvalidRequestError) as exc:
            log.info("rejected request %r: %s", request.id, exc)
            return None, (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        forwarded = None
        if self.next_hop is None:
            failure, outputs = self._run(inputs, wanted)
        else:
            failure, forwarded = self._run_and_forward(request, inputs, wanted, time_remaining_s)
        if failure:
            return None, failure
        if forwarded is not None:
            forwarded.id = request.id
            log.debug("request %r forwarded in %.1f ms", request.id, _ms_since(started))
            if not places:
                return forwarded, None
        encoding = time.perf_counter()
        if forwarded is not None:
            # The caller's shared memory is registered here, not at the last shard.
            model_name, outputs = forwarded.model_name, decode_response(forwarded)
        else:
            model_name = self.model.name
        response = pb.ModelInferResponse(
            model_name=model_name, model_version=self.model.version, id=request.id
        )
        try:
            for name, array in outputs.items():
                add_output(response, name, array, places.get(name), self.regions)
        except TensorCodecError as exc:
            return None, (grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        self._observe("output", encoding)
        log.debug("request %r served in %.1f ms", request.id, _ms_since(started))
        return response, None

    def _run_and_forward(
        self,
        request: pb.ModelInferRequest,
        inputs: dict[str, np.ndarray],
        wanted: list[str],
        remaining: float | None,
    ) -> tuple[tuple[grpc.StatusCode, str] | None, pb.ModelInferResponse | None]:
        # Where the next hop takes shared memory and this signature's output shapes are
        # known, onnxruntime writes the outputs straight into the slot they are sent from:
        # a forwarding shard then makes no copy of the boundary tensor (0.11 ms at 1.6 MB
        # on a Xeon guest; docs/edge.md "Hops through shared memory").
        assert self.next_hop is not None
        layout = self.model.output_layout(inputs, wanted)
        reservation = self.next_hop.client.reserve_inputs(layout) if layout else None
        answered = False  # a slot whose call did not answer may still be read: dropped
        try:
            into = reservation.arrays if reservation is not None else None
            failure, outputs = self._run(inputs, wanted, into)
            if failure:
                return failure, None
            handed = time.perf_counter()
            failure, forwarded = self._forward(request, outputs, remaining)
            self._observe("forward", handed)
            answered = failure is None
            return failure, forwarded
        finally:
            if reservation is not None:
                reservation.release(reuse=answered)

    def _run(
        self,
        inputs: dict[str, np.ndarray],
        wanted: list[str],
        into: list[np.ndarray] | None = None,
    ) -> tuple[tuple[grpc.StatusCode, str] | None, dict[str, np.ndarray]]:
        started = time.perf_counter()
        try:
            outputs = self.model.run(inputs, wanted, into, learn_layout=self.next_hop is not None)
            self._observe("infer", started)
            return None, outputs
        except OrtInvalidArgument as exc:
            # e.g. a variable dimension the graph cannot take: still the caller's input.
            return (grpc.StatusCode.INVALID_ARGUMENT, f"model {self.model.name!r}: {exc}"), {}
        except Exception as exc:
            log.exception("model %s failed", self.model.name)
            return (grpc.StatusCode.INTERNAL, f"model {self.model.name!r} failed: {exc}"), {}

    def _observe(self, phase: str, started: float) -> None:
        if self.metrics is not None:
            self.metrics.observe_phase(phase, time.perf_counter() - started)

    def _forward(
        self,
        request: pb.ModelInferRequest,
        outputs: dict[str, np.ndarray],
        remaining: float | None,
    ) -> tuple[tuple[grpc.StatusCode, str] | None, pb.ModelInferResponse | None]:
        hop = self.next_hop
        assert hop is not None
        timeout_s = hop.timeout_s if remaining is None else min(remaining, hop.timeout_s)
        if timeout_s <= 0:
            return (grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed before forwarding"), None
        try:
            next_inputs = map_outputs_to_inputs(outputs, hop.input_names())
            # Outputs by name only: a caller's shared-memory places are this server's.
            response = hop.client.infer_response(
                hop.model_name,
                next_inputs,
                [o.name for o in request.outputs],
                request_id=request.id,
                timeout_s=timeout_s,
            )
            return None, response
        except OipError as exc:
            return (
                exc.code,
                f"next hop {hop.address} (model {hop.model_name!r}): {exc.details}",
            ), None
        except HandoffError as exc:
            return (grpc.StatusCode.FAILED_PRECONDITION, f"chain wired wrong: {exc}"), None


def _ms_since(started: float) -> float:
    return (time.perf_counter() - started) * 1e3


@dataclass
class ShardServer:
    """A running shard server; ``stop()`` (or leaving the ``with`` block) shuts it down."""

    server: grpc.Server
    servicer: ShardServicer
    host: str
    port: int
    health: ShardHealth
    metrics: ShardMetrics
    http: ProbeServer | None = None  # /v2/health/*, /v2/models/*/ready, /metrics

    @property
    def address(self) -> str:
        return f"{_bracket(self.host)}:{self.port}"

    @property
    def manifest(self) -> ShardManifest:
        return self.servicer.model.manifest

    @property
    def http_address(self) -> str | None:
        return self.http.address if self.http is not None else None

    @property
    def forward_to(self) -> str | None:
        return self.servicer.next_hop.address if self.servicer.next_hop else None

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop accepting work, let in-flight requests finish (up to grace_s), then close."""
        self.servicer.drain()
        self.health.shutdown()  # probes and watchers see NOT_SERVING before the port closes
        self.server.stop(grace_s).wait()
        if self.http is not None:
            self.http.stop()
        if self.servicer.next_hop is not None:
            self.servicer.next_hop.client.close()
        self.servicer.regions.close()

    def __enter__(self) -> ShardServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop(grace_s=1.0)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def start_shard_server(
    shard_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    forward_to: str | None = None,
    *,
    forward_model: str | None = None,
    max_workers: int = 4,
    intra_op_threads: int = 0,
    max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
    forward_timeout_s: float = 60.0,
    providers: Sequence[str] = (),
    http_port: int | None = None,
    shared_memory: SharedMemoryMode = "auto",
) -> ShardServer:
    """Verify and load the shard, then serve it; ``port=0`` picks a free port.

    ``forward_to``: None uses the manifest's ``next_hop``; "" turns forwarding off; "host:port"
    forwards there. The next shard's model name is ``forward_model``, else the manifest's
    ``extra["next_model"]``. Raises ShardIntegrityError on a sha256 mismatch, ManifestError
    or ValueError on any other bad shard or argument, OSError if the port cannot be bound.
    ``http_port``: also serve the HTTP probes and /metrics there (0: a free port; None: no
    HTTP). grpc.health.v1 is always on the OIP port (probes.py). ``shared_memory``: how a
    forwarding shard hands tensors to its next hop ("auto": through shared memory when that
    is on this host; "off": always raw contents).
    """
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
    if http_port is not None and (not isinstance(http_port, int) or not 0 <= http_port <= 65535):
        raise ValueError(f"http_port must be an int in [0, 65535] or None, got {http_port!r}")
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers must be a positive int, got {max_workers!r}")
    # gRPC sets SO_REUSEPORT by default: a second server on a busy port would bind and
    # silently share it. Off, so a taken port is an error.
    options = [*channel_options(max_message_mb), ("grpc.so_reuseport", 0)]
    model = ShardModel(shard_dir, intra_op_threads=intra_op_threads, providers=providers)
    hop_address = model.manifest.next_hop if forward_to is None else (forward_to or None)
    next_hop = None
    if hop_address is not None:
        parse_hop(hop_address)
        next_model = forward_model or model.manifest.extra.get("next_model")
        if not next_model:
            raise ManifestError(
                f"shard {model.name}: forwarding to {hop_address} needs the next shard's model "
                "name: pass forward_model (--forward-model) or set extra['next_model'] in the "
                "manifest"
            )
        next_hop = NextHop(
            hop_address, str(next_model), max_message_mb, forward_timeout_s, shared_memory
        )
    metrics = ShardMetrics(model.name, model.version)
    servicer = ShardServicer(model, next_hop, metrics)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=f"oip-{model.name}"),
        options=options,
    )
    pb.add_GRPCInferenceServiceServicer_to_server(InstrumentedServicer(servicer, metrics), server)
    health = add_health(server, servicer.ready)
    bind = f"{_bracket(host)}:{port}"
    try:
        bound = server.add_insecure_port(bind)
    except RuntimeError as exc:  # grpcio >= 1.5x raises instead of returning 0
        bound, reason = 0, str(exc)
    else:
        reason = "port in use or address not local"
    if not bound:
        health.shutdown()
        if next_hop is not None:
            next_hop.client.close()
        raise OSError(f"cannot bind the OIP server to {bind}: {reason}")
    server.start()
    running = ShardServer(
        servicer=servicer, server=server, host=host, port=bound, health=health, metrics=metrics
    )
    if http_port is not None:
        try:
            running.http = ProbeServer(
                host,
                http_port,
                ready=servicer.ready,
                serves=model.serves,
                registry=metrics.registry,
            )
        except OSError as exc:
            running.stop(grace_s=0)
            raise OSError(
                f"cannot bind the HTTP probes to {_bracket(host)}:{http_port}: {exc}"
            ) from None
    log.info(
        "serving %s (shard %d/%d, %s) on %s%s",
        model.name,
        model.manifest.shard_index + 1,
        model.manifest.num_shards,
        ",".join(model.providers),
        running.address,
        f", forwarding to {next_hop.address} ({next_hop.model_name})" if next_hop else "",
    )
    return running


def serve_shard(
    shard_dir: str | Path,
    host: str,
    port: int,
    forward_to: str | None = None,
    **kwargs: object,
) -> grpc.Server:
    """Like start_shard_server, returning the bare grpc.Server (stop it with ``.stop(grace)``)."""
    return start_shard_server(shard_dir, host, port, forward_to, **kwargs).server  # type: ignore[arg-type]


def ready_line(running: ShardServer) -> str:
    """The one stdout line that says the server is up (parsed by process.py)."""
    m = running.manifest
    return (
        f"{READY_PREFIX}model={m.model_name} address={running.address} "
        f"shard={m.shard_index + 1}/{m.num_shards} forward_to={running.forward_to or '-'} "
        f"http={running.http_address or '-'}"
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gpuflow.tasks.edge.serving.server",
        description="Serve one ONNX shard over the Open Inference Protocol (KServe v2) gRPC API.",
    )
    parser.add_argument("--shard-dir", required=True, type=Path, help="folder with manifest.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    hop = parser.add_mutually_exclusive_group()
    hop.add_argument("--forward-to", metavar="HOST:PORT", help="next shard (default: manifest)")
    hop.add_argument("--no-forward", action="store_true", help="ignore the manifest's next_hop")
    parser.add_argument("--forward-model", help="the next shard's model name")
    parser.add_argument("--workers", type=int, default=4, help="gRPC worker threads")
    parser.add_argument(
        "--http-port", type=int, default=None, help="HTTP probes and /metrics (0: any port)"
    )
    parser.add_argument("--intra-op-threads", type=int, default=0, help="onnxruntime threads")
    parser.add_argument(
        "--shared-memory",
        choices=("auto", "on", "off"),
        default="auto",
        help="hand tensors to the next hop through shared memory (auto: when it is local)",
    )
    parser.add_argument("--max-message-mb", type=int, default=DEFAULT_MAX_MESSAGE_MB)
    parser.add_argument("--grace-s", type=float, default=5.0, help="shutdown grace period")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    stop = threading.Event()
    # Handlers go in before loading, so a SIGTERM during a slow load still stops cleanly.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    forward_to = "" if args.no_forward else args.forward_to
    try:
        running = start_shard_server(
            args.shard_dir,
            args.host,
            args.port,
            forward_to,
            forward_model=args.forward_model,
            max_workers=args.workers,
            intra_op_threads=args.intra_op_threads,
            max_message_mb=args.max_message_mb,
            http_port=args.http_port,
            shared_memory=args.shared_memory,
        )
    except ShardIntegrityError as exc:
        print(f"gpuflow shard server: refusing to start: {exc}", file=sys.stderr)
        return EXIT_INTEGRITY_ERROR
    except (ManifestError, ValueError, OSError) as exc:
        print(f"gpuflow shard server: cannot start: {exc}", file=sys.stderr)
        return EXIT_STARTUP_ERROR
    print(ready_line(running), flush=True)
    while not stop.wait(timeout=1.0):  # a timed wait keeps the main thread responsive
        pass
    log.info(
        "signal received; stopping %s (grace %.1f s)", running.manifest.model_name, args.grace_s
    )
    running.stop(grace_s=args.grace_s)
    log.info("stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover - exercised through subprocess tests
    sys.exit(main())
