"""Probes of a shard server for the systems that run it: gRPC health and HTTP.

* ``grpc.health.v1.Health`` (grpcio-health-checking's own servicer, on the OIP port):
  ``Check`` for the service ``""`` (the server) and ``inference.GRPCInferenceService``
  answers SERVING while the shard is ready (for a forwarding shard: while its next hop is
  ready too, so the head speaks for the chain) and NOT_SERVING otherwise; an unknown
  service is NOT_FOUND. ``Watch`` streams the changes: a watcher thread re-reads
  readiness every ``interval_s``; shutdown turns everything NOT_SERVING first.
  What Kubernetes' gRPC probes, grpc-health-probe and Envoy speak.
* HTTP (``--http-port``), the KServe v2 REST health endpoints and Prometheus:
  ``GET /v2/health/live`` 200 ``{"live": true}``; ``GET /v2/health/ready`` 200
  ``{"ready": true}`` or 503 ``{"ready": false}``; ``GET /v2/models/{name}[/versions/{v}]/ready``
  200 or 503 as readiness, 404 for a model this server does not serve; ``GET /metrics``
  the server's counters (metrics.py). Anything else is 404. Not-ready is 503 (any non-2xx
  fails a Kubernetes probe; Triton answers 400 there).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from gpuflow.tasks.edge.serving.proto.oip import SERVICE
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_SERVICES = ("", SERVICE)
_MODEL_READY = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/ready$")


class ShardHealth(health.HealthServicer):
    """grpcio-health-checking's servicer, its statuses kept to the shard's readiness."""

    def __init__(self, ready: Callable[[], bool], interval_s: float = 1.0) -> None:
        super().__init__(experimental_non_blocking=True)
        self._ready, self.interval_s = ready, interval_s
        self._stop = threading.Event()
        self._status: int | None = None
        self.refresh()
        self._thread = threading.Thread(target=self._watch, name="shard-health", daemon=True)
        self._thread.start()

    def refresh(self) -> int:
        """Read readiness now; publish it to Check and Watch if it changed."""
        status = SERVING if not self._stop.is_set() and self._ready() else NOT_SERVING
        if status != self._status:
            self._status = status
            for service in HEALTH_SERVICES:
                self.set(service, status)
        return status

    def Check(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        if request.service in HEALTH_SERVICES and not self._stop.is_set():
            self.refresh()  # a probe sees readiness as it is, not as of the last tick
        return super().Check(request, context)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.refresh()

    def shutdown(self) -> None:
        """NOT_SERVING everywhere (watchers are told), and the watcher thread ends."""
        self._stop.set()
        self.enter_graceful_shutdown()
        self._thread.join(timeout=5)


def add_health(server: grpc.Server, ready: Callable[[], bool]) -> ShardHealth:
    servicer = ShardHealth(ready)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return servicer


class ProbeServer:
    """The HTTP endpoints of one shard server, served from a thread of their own."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        ready: Callable[[], bool],
        serves: Callable[[str, str], bool],
        registry: Any,  # prometheus_client CollectorRegistry
    ) -> None:
        handler = _handler(ready, serves, registry)
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = host, int(self.httpd.server_address[1])
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="shard-http", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


def _handler(
    ready: Callable[[], bool], serves: Callable[[str, str], bool], registry: Any
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            path = self.path.split("?", 1)[0]
            if path == "/v2/health/live":
                self._json(200, {"live": True})
            elif path == "/v2/health/ready":
                ok = ready()
                self._json(200 if ok else 503, {"ready": ok})
            elif path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif match := _MODEL_READY.match(path):
                name, version = match.group(1), match.group(2) or ""
                if not serves(name, version):
                    self._json(404, {"error": f"model {name!r} version {version!r} not found"})
                else:
                    ok = ready()
                    self._json(200 if ok else 503, {"name": name, "ready": ok})
            else:
                self._json(404, {"error": f"no endpoint {path}"})

        def _json(self, status: int, body: dict[str, Any]) -> None:
            self._send(status, json.dumps(body).encode(), "application/json")

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            return  # probes every few seconds would flood the shard's log

    return Handler
