"""`gpuflow telemetry serve`: the fleet in Prometheus, in DCGM exporter's metric names.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_telemetry.app, name="telemetry")``.
The work is in gpuflow.tasks.telemetry; this module checks the flags (all of them, before
anything starts), opens the backend, the inventory and the health model, and serves until
SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import signal
import threading
from typing import Annotated, Any

import typer

from gpuflow.cli_base import BackendOpt, backend_named, clean_errors, console
from gpuflow.tasks.telemetry.settings import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    MIN_INTERVAL_S,
    resolve_host,
    validate_exporter_interval,
    validate_port,
)

app = typer.Typer(
    help="Fleet telemetry for Prometheus (DCGM exporter's metric names).", no_args_is_help=True
)


def _check_node_names(nodes: list[str]) -> list[str]:
    # The same rule as `gpuflow up --node-worker`; which nodes exist is checked on the backend.
    from gpuflow.controlplane_nodes import validate_node_names

    validate_node_names(nodes)
    return nodes


@app.command("serve")
@clean_errors
def serve_cmd(
    host: Annotated[
        str,
        typer.Option(
            help="Address to listen on: an IP address or a name of this machine (0.0.0.0: "
            "every interface, for a Prometheus on another host)."
        ),
    ] = DEFAULT_HOST,
    port: Annotated[
        int, typer.Option(help="Port to listen on (0: any free one; it is printed).")
    ] = DEFAULT_PORT,
    interval_s: Annotated[
        float,
        typer.Option(
            "--interval-s",
            help=f"Seconds between two reads of the devices (>= {MIN_INTERVAL_S:g}); scrapes "
            "in between are served the last reading.",
        ),
    ] = MIN_INTERVAL_S,
    node: Annotated[
        list[str] | None,
        typer.Option(
            "--node",
            help="Export only this node (repeatable; default every node the backend sees).",
        ),
    ] = None,
    health_model: Annotated[
        str | None,
        typer.Option(
            help="Health model for gpuflow_health_risk: an MLflow model URI, 'rules', or "
            "'none' (default: the registered champion, else the rules)."
        ),
    ] = None,
    backend: BackendOpt = None,
) -> None:
    """Serve /metrics for every device and partition of the local backend."""
    interval_s = validate_exporter_interval(interval_s)
    validate_port(port)
    resolve_host(host)
    nodes = _check_node_names(list(node or ()))
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.telemetry.service import open_exporter, serve_until_stopped

    be = backend_named(backend)
    inventory = Inventory()
    try:
        exporter = open_exporter(
            be, interval_s=interval_s, nodes=nodes, model_uri=health_model, inventory=inventory
        )
        stop = threading.Event()
        previous = _on_signals(stop)
        try:
            serve_until_stopped(exporter, host, port, stop, announce=_announce(exporter))
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    finally:
        inventory.close()
        be.close()


def _announce(exporter: Any) -> Any:
    def announce(url: str) -> None:
        snap = exporter.snapshot
        devices = snap.devices if snap else 0
        # One line, flushed: `gpuflow up` and the tests read the URL from it.
        console.print(
            f"serving {url} ({devices} devices, every {exporter.interval_s:g} s, "
            f"backend {exporter.builder.backend.name}, health model "
            f"{exporter.builder.model_source})",
            soft_wrap=True,
        )
        console.file.flush()

    return announce


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGTERM (`gpuflow down`) and SIGINT stop serving cleanly; returns the old handlers."""

    def handle(_sig: int, _frame: object) -> None:
        stop.set()

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.getsignal(sig)
        signal.signal(sig, handle)
    return previous
