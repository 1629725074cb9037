"""One exporter for one host: a backend, the inventory and the health model wired into a
TelemetryExporter, and the loop that serves it until asked to stop."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from gpuflow.hardware.backend import Backend
from gpuflow.tasks.telemetry.exporter import TelemetryExporter
from gpuflow.tasks.telemetry.settings import validate_exporter_interval
from gpuflow.tasks.telemetry.snapshot import SnapshotBuilder, check_scope

log = logging.getLogger(__name__)

NO_MODEL = "none"  # --health-model none: no gpuflow_health_risk (nothing to load)


def health_model(uri: str | None) -> tuple[Any | None, str]:
    """(model, where it came from) for --health-model: None for the registered champion
    (the threshold rules until one exists, as the monitor does), "rules", an MLflow
    model URI, or "none"."""
    if uri == NO_MODEL:
        return None, NO_MODEL
    from gpuflow.tasks.health.registry import RULES_URI, load_health_model

    if uri is not None:
        return load_health_model(uri)  # asked for by name: failing to load it is an error
    try:
        return load_health_model(None)
    except Exception as exc:  # MLflow down or a broken registry: telemetry still serves
        log.warning("telemetry exporter: the champion could not be loaded (%s); rules", exc)
        model, _ = load_health_model(RULES_URI)
        return model, f"{RULES_URI} (champion unreadable)"


def open_exporter(
    backend: Backend,
    *,
    interval_s: float,
    nodes: Iterable[str] | None = None,
    model_uri: str | None = None,
    inventory: Any | None = None,
) -> TelemetryExporter:
    """An exporter of ``backend``'s devices (those of ``nodes``), not serving yet. The
    interval and the nodes are checked first, so a bad one is refused before any model
    is loaded."""
    interval_s = validate_exporter_interval(interval_s)
    nodes = check_scope(backend, nodes)  # an unknown node is refused before a model loads
    model, source = health_model(model_uri)
    builder = SnapshotBuilder(
        backend,
        nodes=nodes,
        model=model,
        model_source=source,
        inventory=inventory,
        interval_s=interval_s,
    )
    return TelemetryExporter(builder, interval_s)


def serve_until_stopped(
    exporter: TelemetryExporter,
    host: str,
    port: int,
    stop: threading.Event,
    announce: Callable[[str], None] = print,
) -> None:
    """Serve until ``stop`` is set (the CLI sets it on SIGTERM or SIGINT), then stop."""
    url = exporter.start(host, port)
    try:
        announce(url)
        stop.wait()
    finally:
        exporter.stop()


__all__ = ["NO_MODEL", "health_model", "open_exporter", "serve_until_stopped"]
