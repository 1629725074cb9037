"""One stable endpoint per edge deployment: whatever version serves, clients keep one address.

    python -m gpuflow.tasks.edge.serving.endpoint --target-file FILE --host H --port P

A gRPC server that forwards every unary call it receives (any method: the OIP service,
grpc.health.v1 Check, ...) as raw bytes, unparsed, to the address written in
``--target-file`` ("host:port" of the current version's head; deploy.set_current writes
it), and answers with the target's response or its status code and details. Promoting or
rolling back a version rewrites the file; the endpoint sees the change at the next call
(it compares the file's mtime and size on every call: a stat, no read) and moves to a
persistent channel to the new head. An empty or missing file is UNAVAILABLE, saying so.
A generic handler cannot tell a stream from a unary call, so the streaming methods a shard
serves are named (``SERVER_STREAMING``: grpc.health.v1 Watch; ``BIDI_STREAMING``: Triton's
ModelStreamInfer) and forwarded as streams: the messages pass through as they come until
either side ends it; a stream opened before a switch stays on the version it began with. One line ``READY
endpoint address=HOST:PORT`` on stdout once it serves; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
from gpuflow.tasks.edge.serving.client import DEFAULT_MAX_MESSAGE_MB, channel_options

log = logging.getLogger(__name__)
READY_PREFIX = "READY endpoint "
# The streaming methods of a shard server (everything else it serves is unary).
SERVER_STREAMING = frozenset({"/grpc.health.v1.Health/Watch"})
BIDI_STREAMING = frozenset({"/inference.GRPCInferenceService/ModelStreamInfer"})
DEFAULT_TIMEOUT_S = 60.0


class Target:
    """The address in a file, and one channel to it, re-read when the file changes."""

    def __init__(self, path: Path, max_message_mb: int = DEFAULT_MAX_MESSAGE_MB) -> None:
        self.path, self.max_message_mb = Path(path), max_message_mb
        self._stamp: tuple[int, int] | None = None
        self._address = ""
        self._channel: grpc.Channel | None = None
        self._calls: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self._lock = threading.Lock()

    def call(self, method: str) -> tuple[str, grpc.UnaryUnaryMultiCallable | None]:
        """(the target's address, a raw-bytes caller of ``method`` on it), made once per
        channel and method: the hot path is a stat and a dict lookup."""
        address, channel = self.channel()
        if channel is None:
            return address, None
        with self._lock:
            caller = self._calls.get(method)
            if caller is None or self._channel is not channel:
                caller = self._calls[method] = channel.unary_unary(method)
            return address, caller

    def channel(self) -> tuple[str, grpc.Channel | None]:
        with self._lock:
            try:
                stat = os.stat(self.path)
                stamp = (stat.st_mtime_ns, stat.st_size)
            except FileNotFoundError:
                stamp = None
            if stamp != self._stamp:
                self._stamp = stamp
                address = self.path.read_text().strip() if stamp else ""
                if address != self._address:
                    if self._channel is not None:
                        self._channel.close()
                    self._calls = {}
                    self._address = address
                    self._channel = (
                        grpc.insecure_channel(address, options=channel_options(self.max_message_mb))
                        if address
                        else None
                    )
                    log.info("endpoint now forwards to %s", address or "nothing")
            return self._address, self._channel

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None


class _Forward(grpc.GenericRpcHandler):
    def __init__(self, target: Target, timeout_s: float) -> None:
        self.target, self.timeout_s = target, timeout_s

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            address, caller = self.target.call(method)
            if caller is None:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no version of this deployment is current ({self.target.path} is empty)",
                )
            remaining = context.time_remaining()
            timeout = self.timeout_s if remaining is None else min(remaining, self.timeout_s)
            try:
                return caller(request, timeout=timeout)
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or f"from {address}")

        def relay(open_call: str, request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
            """A streaming call passed through: ``open_call`` is the channel's unary_stream
            (one request in) or stream_stream (ours read by gRPC as they come)."""
            address, channel = self.target.channel()
            if channel is None:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"no version of this deployment is current ({self.target.path} is empty)",
                )
            call = getattr(channel, open_call)(method)(request)  # long-lived: no deadline
            context.add_callback(call.cancel)  # the client left: stop the upstream stream
            try:
                yield from call
            except grpc.RpcError as exc:
                if context.is_active():
                    context.abort(exc.code(), exc.details() or f"from {address}")

        # No (de)serializers: the bytes go through as they came.
        if method in BIDI_STREAMING:
            return grpc.stream_stream_rpc_method_handler(
                lambda requests, context: relay("stream_stream", requests, context)
            )
        if method in SERVER_STREAMING:
            return grpc.unary_stream_rpc_method_handler(
                lambda request, context: relay("unary_stream", request, context)
            )
        return grpc.unary_unary_rpc_method_handler(forward)


class EndpointServer:
    """A running endpoint; ``stop()`` shuts it down."""

    def __init__(
        self,
        target_file: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_workers: int = 8,
        max_message_mb: int = DEFAULT_MAX_MESSAGE_MB,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.target = Target(target_file, max_message_mb)
        options = [*channel_options(max_message_mb), ("grpc.so_reuseport", 0)]
        self.server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="oip-endpoint"),
            handlers=[_Forward(self.target, timeout_s)],
            options=options,
        )
        bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self.server.add_insecure_port(bind)
        except RuntimeError as exc:
            raise OSError(f"cannot bind the endpoint to {bind}: {exc}") from None
        if not self.port:
            raise OSError(f"cannot bind the endpoint to {bind}")
        self.host = host
        self.server.start()

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def stop(self, grace_s: float = 1.0) -> None:
        self.server.stop(grace_s).wait()
        self.target.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuflow.tasks.edge.serving.endpoint")
    parser.add_argument("--target-file", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-message-mb", type=int, default=DEFAULT_MAX_MESSAGE_MB)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        endpoint = EndpointServer(
            args.target_file, args.host, args.port, max_message_mb=args.max_message_mb
        )
    except (OSError, ValueError) as exc:
        print(f"gpuflow endpoint: cannot start: {exc}", file=sys.stderr)
        return 2
    print(f"{READY_PREFIX}address={endpoint.address}", flush=True)
    while not stop.wait(timeout=1.0):
        pass
    endpoint.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a process by deploy.ensure_endpoint
    sys.exit(main())
