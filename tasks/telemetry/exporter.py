"""The telemetry exporter: a sampler thread refreshes a snapshot every interval, an HTTP
server hands the last one to Prometheus.

Scrapes and sampling are decoupled on purpose: Prometheus may scrape every 15 s from two
servers at once, but the devices are read once per interval (never faster than 5 s,
tasks/health/sampler.MIN_INTERVAL_S), by one long-lived backend session.

``TelemetryExporter(builder, interval_s)``; ``start(host, port)`` binds first (a port in
use is refused before any device is read), takes the first snapshot (a scrape never sees an
empty exporter), then serves and starts the sampler thread; ``stop()`` ends both.
``refresh()`` takes a snapshot now (tests trigger one instead of sleeping); ``wait`` (the
sampler's pause, ``wait(stop_event, seconds) -> stopped``) is injectable for the same
reason.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.health.sampler import DEFAULT_INTERVAL_S
from gpuflow.tasks.telemetry.collector import SnapshotCollector
from gpuflow.tasks.telemetry.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    PORT_TAKEN,
    resolve_host,
    validate_exporter_interval,
    validate_port,
)
from gpuflow.tasks.telemetry.snapshot import (
    EXPORTER_DURATION,
    EXPORTER_FAILURES,
    EXPORTER_INFO,
    EXPORTER_INTERVAL,
    EXPORTER_LAST_REFRESH,
    EXPORTER_REFRESHES,
    EXPORTER_STAGE_ERRORS,
    Family,
    Snapshot,
    SnapshotBuilder,
    family,
)
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

Wait = Callable[[threading.Event, float], bool]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - base signature
        pass  # a line per scrape (every 15 s, per Prometheus) would bury the log


def _server_class(family: socket.AddressFamily) -> type[WSGIServer]:
    return type("ExporterServer", (ThreadingWSGIServer,), {"address_family": family})


def _stopped_after(stop: threading.Event, seconds: float) -> bool:
    return stop.wait(seconds)


class TelemetryExporter:
    """Serves ``builder``'s snapshots on /metrics, refreshed every ``interval_s``."""

    def __init__(
        self,
        builder: SnapshotBuilder,
        interval_s: float = DEFAULT_INTERVAL_S,
        wait: Wait = _stopped_after,
    ) -> None:
        self.builder = builder
        self.interval_s = validate_exporter_interval(interval_s)
        self._wait = wait
        self._lock = threading.Lock()  # one refresh at a time
        self._changed = threading.Condition()
        self._snapshot: Snapshot | None = None
        self.refreshes = 0
        self.refresh_failures = 0
        self._stop = threading.Event()
        self._server: WSGIServer | None = None
        self._threads: list[threading.Thread] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(self.families))
        self.host = ""
        self.port = 0

    # -- snapshots -----------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def refresh(self) -> Snapshot | None:
        """Take a snapshot now. One that fails keeps the previous snapshot (its age shows
        in gpuflow_exporter_last_refresh_timestamp_seconds) and is counted."""
        with self._lock:
            try:
                snap: Snapshot | None = self.builder.take()
            except Exception as exc:  # a backend that failed this round: next round again
                log.warning("telemetry exporter: refresh failed: %s", exc, exc_info=True)
                snap = None
            with self._changed:
                if snap is None:
                    self.refresh_failures += 1
                else:
                    self._snapshot = snap
                    self.refreshes += 1
                self._changed.notify_all()
            return self._snapshot

    def wait_for_refresh(self, after: int, timeout_s: float = 30.0) -> bool:
        """Until more than ``after`` refreshes were attempted; False on timeout."""
        with self._changed:
            return self._changed.wait_for(
                lambda: self.refreshes + self.refresh_failures > after, timeout_s
            )

    def families(self) -> list[Family]:
        """What a scrape gets: the last snapshot's families and the exporter's own."""
        snap = self._snapshot
        b = self.builder
        nodes = ",".join(sorted(b.nodes or ())) or "all"
        own = [
            family(
                EXPORTER_INFO,
                [({"backend": b.backend.name, "model": b.model_source, "nodes": nodes}, 1.0)],
            ),
            family(EXPORTER_INTERVAL, [({}, self.interval_s)]),
            family(EXPORTER_REFRESHES, [({}, float(self.refreshes))]),
            family(EXPORTER_FAILURES, [({}, float(self.refresh_failures))]),
        ]
        if b.stage_errors:
            stages = sorted(b.stage_errors.items())
            own.append(family(EXPORTER_STAGE_ERRORS, [({"stage": k}, float(v)) for k, v in stages]))
        if snap is None:
            return own
        own.append(family(EXPORTER_LAST_REFRESH, [({}, snap.taken_at_s)]))
        own.append(family(EXPORTER_DURATION, [({}, snap.duration_s)]))
        return [*snap.families, *own]

    # -- serving -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> str:
        """Bind, take the first snapshot, serve and start sampling; returns the URL."""
        if self._server is not None:
            raise InvalidRequestError("this exporter is already serving")
        port = validate_port(port)
        family, address = resolve_host(host)
        try:
            server = make_server(
                address,
                port,
                make_wsgi_app(self.registry),
                server_class=_server_class(family),
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise InvalidRequestError(
                f"--port {port} on --host {host} {PORT_TAKEN} ({exc.strerror or exc}); "
                "pick another (0: any free port)"
            ) from None
        self._server = server
        self.host, self.port = address, int(server.server_address[1])
        self.refresh()
        self._stop.clear()
        self._threads = [
            threading.Thread(target=server.serve_forever, name="exporter-http", daemon=True),
            threading.Thread(target=self._sample, name="exporter-sampler", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self.url

    def _sample(self) -> None:
        # The pause is what is left of the interval, so the period stays the interval
        # however long a refresh takes (as the monitor's sampler does).
        spent = 0.0
        while not self._wait(self._stop, max(self.interval_s - spent, 0.0)):
            started = time.monotonic()
            self.refresh()
            spent = time.monotonic() - started
            if spent > self.interval_s:
                log.warning(
                    "telemetry exporter: a refresh took %.1f s, longer than the %.0f s interval",
                    spent,
                    self.interval_s,
                )

    def stop(self) -> None:
        """Stop sampling and serving; the backend stays open (its owner closes it)."""
        self._stop.set()
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []

    def __enter__(self) -> TelemetryExporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["TelemetryExporter"]
