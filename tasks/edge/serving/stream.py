"""Persistent ModelStreamInfer streams to one server: the hop between shards without a call
set up per request.

A unary ModelInfer pays gRPC's per-call work each time (a call object, HTTP/2 HEADERS both
ways, a server thread picked from the pool): a 200-byte echo between two processes measured
0.31-0.40 ms unary and 0.17-0.29 ms as messages on one open stream (2-core VM; docs/edge.md
"Hops on streams"). Triton's ``ModelStreamInfer``
(bidirectional: requests in, one response per request, in order) carries exactly the same
ModelInferRequest, so a forwarding shard keeps a few such streams open to its next hop and
sends each request on an idle one.

Rules that keep it safe:

* A stream is used by one request at a time (taken from the idle list, given back after its
  response), so responses pair with requests by order, as Triton's non-decoupled models
  answer.
* At most ``max_streams`` are open: an open stream holds one of the next server's worker
  threads while idle (gRPC's synchronous server), and its probes and metadata calls need
  the others. A request finding none idle and the cap reached goes unary.
* An error inside the stream (a bad input, a next hop's failure) comes back as
  ``error_message`` "<STATUS_CODE>: details" (``stream_error``; the stream goes on), and is
  raised as the OipError the unary call would have raised. A broken stream (the server
  restarted, was cancelled, or closed it while draining) is dropped and the request goes
  unary once, which yields the real status.
* Deadlines: a stream has no per-message deadline, so a watchdog thread cancels a stream
  whose request is past its own deadline (checked every ``WATCHDOG_S``; a hop may overrun
  its deadline by up to that much) and the caller gets DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
from gpuflow.tasks.edge.serving.proto import oip as pb

log = logging.getLogger(__name__)

MAX_STREAMS = 2  # a shard server's pool is 4 threads by default: 2 stay for probes
WATCHDOG_S = 0.25
_CLOSE = object()  # ends a stream's request iterator


def stream_error(code: grpc.StatusCode, details: str) -> str:
    """The ``error_message`` of a failed request on a stream: the status code's name first,
    so the other end can raise what a unary call would have."""
    return f"{code.name}: {details}"


def parse_stream_error(message: str) -> tuple[grpc.StatusCode, str]:
    """(code, details) from an ``error_message``; UNKNOWN where it names no status code
    (another server's free text)."""
    name, sep, details = message.partition(": ")
    code = getattr(grpc.StatusCode, name, None) if sep else None
    if isinstance(code, grpc.StatusCode) and code is not grpc.StatusCode.OK:
        return code, details
    return grpc.StatusCode.UNKNOWN, message


class StreamBroken(Exception):
    """The stream failed as a transport (not a request's error): use a unary call."""


class _Stream:
    """One open ModelStreamInfer call; one request at a time."""

    def __init__(self, open_call: Callable[[Any], Any]) -> None:
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._call = open_call(iter(self._requests.get, _CLOSE))
        self.deadline: float | None = None  # monotonic; set while a request is out
        self.timed_out = False

    def exchange(self, request: pb.ModelInferRequest, timeout_s: float) -> Any:
        # A cancel that raced a previous answer (late by a hair) marks no new request late.
        self.timed_out = False
        self.deadline = time.monotonic() + timeout_s
        self._requests.put(request)
        try:
            return next(self._call)
        except grpc.RpcError as exc:
            raise StreamBroken(f"{exc.code()}: {exc.details()}") from None
        except StopIteration:
            raise StreamBroken("the server ended the stream") from None
        finally:
            self.deadline = None

    def cancel_if_late(self, now: float) -> None:
        deadline = self.deadline
        if deadline is not None and now > deadline:
            self.timed_out = True
            self._call.cancel()

    def close(self) -> None:
        self._requests.put(_CLOSE)  # frees gRPC's thread that reads our requests
        self._call.cancel()


class StreamPool:
    """Up to ``max_streams`` ModelStreamInfer streams to one server (see the module doc).

    ``open_call(request_iterator)``: the stub's ModelStreamInfer. ``infer`` raises
    ``StreamBroken`` when the caller should send the request unary instead, and the
    ``error`` callable's exception for a request that failed on the stream."""

    def __init__(
        self,
        open_call: Callable[[Any], Any],
        error: Callable[[grpc.StatusCode, str], Exception],
        max_streams: int = MAX_STREAMS,
    ) -> None:
        if not isinstance(max_streams, int) or max_streams < 0:
            raise ValueError(f"max_streams must be an int >= 0, got {max_streams!r}")
        self._open_call = open_call
        self._error = error
        self.max_streams = max_streams
        self._idle: list[_Stream] = []
        self._open: set[_Stream] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._watchdog: threading.Thread | None = None

    def _take(self) -> _Stream | None:
        with self._lock:
            if self._closed.is_set():
                return None
            if self._idle:
                return self._idle.pop()
            if len(self._open) >= self.max_streams:
                return None
            stream = _Stream(self._open_call)
            self._open.add(stream)
            if self._watchdog is None:
                self._watchdog = threading.Thread(
                    target=self._watch, name="oip-stream-watchdog", daemon=True
                )
                self._watchdog.start()
            return stream

    def _drop(self, stream: _Stream) -> None:
        with self._lock:
            self._open.discard(stream)
        stream.close()

    def infer(self, request: pb.ModelInferRequest, timeout_s: float) -> pb.ModelInferResponse:
        stream = self._take()
        if stream is None:
            raise StreamBroken("no idle stream")
        try:
            answer = stream.exchange(request, timeout_s)
        except StreamBroken:
            self._drop(stream)
            if stream.timed_out:
                raise self._error(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {timeout_s:.3g} s"
                ) from None
            raise
        with self._lock:
            if self._closed.is_set():
                stream.close()
            else:
                self._idle.append(stream)
        if answer.error_message:
            raise self._error(*parse_stream_error(answer.error_message))
        return answer.infer_response

    def _watch(self) -> None:
        while not self._closed.wait(WATCHDOG_S):
            now = time.monotonic()
            with self._lock:
                streams = list(self._open)
            for stream in streams:
                stream.cancel_if_late(now)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            streams, self._open, self._idle = list(self._open), set(), []
        for stream in streams:
            stream.close()
