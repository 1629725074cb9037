"""The `gpuflow` command line: thin verbs over the plain functions of hardware/ and tasks/.

Each capability keeps its verbs in its own module (gpuflow/cli_<area>.py); this one mounts
them and holds the verbs of the platform itself: bench, up, join, down, demo.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gpuflow.cli_base import clean_errors, console
from gpuflow.controlplane import DEFAULT_EXPORTER_PORT, DEFAULT_MLFLOW_PORT, DEFAULT_PREFECT_PORT
from gpuflow.controlplane_address import LOOPBACK
from gpuflow.hardware.backend import InvalidRequestError

app = typer.Typer(
    name="gpuflow",
    help="A control plane for mixed GPU fleets (NVIDIA, Hygon DCU, or the digital twin).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def _process_defaults() -> None:
    # A command run without `gpuflow up` gets a temporary Prefect server; with Prefect's
    # default it sends usage heartbeats (from machines often offline) and prints their
    # traceback when its SQLite database is busy. `up` and the tour keep it off; so does
    # every command now, unless the user turned it on.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


def _mount_capabilities() -> None:
    """`gpuflow --help` lists commands in the order they are registered (these two, then
    bench, up, join, down, demo below), then the command groups in this order."""
    from gpuflow import (
        cli_edge,
        cli_energy,
        cli_health,
        cli_hw,
        cli_multimodal,
        cli_remediate,
        cli_schedule,
        cli_telemetry,
        cli_train,
    )

    app.command("train")(cli_train.train_cmd)
    app.command("compare-precision")(cli_train.compare_precision_cmd)
    app.add_typer(cli_hw.hw_app, name="hw")
    app.add_typer(cli_hw.sim_app, name="sim")
    app.add_typer(cli_health.app, name="health")
    app.add_typer(cli_remediate.app, name="remediate")
    app.add_typer(cli_schedule.app, name="schedule")
    app.add_typer(cli_edge.app, name="edge")
    app.add_typer(cli_telemetry.app, name="telemetry")
    app.add_typer(cli_energy.app, name="energy")
    app.add_typer(cli_multimodal.app, name="multimodal")


_mount_capabilities()


# --- benchmarks ---------------------------------------------------------------------------

# Each benchmark is a module gpuflow/bench/<name>_bench.py with
# run(quick: bool, report: Callable[[str], None]) -> dict (JSON-ready, nested one level).
BENCHMARKS = (
    "train",
    "scheduler",
    "service_pass",
    "downtime",
    "edge",
    "health",
    "distributed",
    "energy",
    "multimodal",
    "isolation",
)


@app.command("bench")
@clean_errors
def bench_cmd(
    name: Annotated[str, typer.Argument(help=f"Benchmark: {', '.join(BENCHMARKS)}")],
    quick: Annotated[
        bool, typer.Option(help="A smoke run with tiny sizes (figures mean little).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw result as JSON.")] = False,
) -> None:
    """Run a benchmark; ratios are measured side by side in one run, saved under GPUFLOW_HOME/bench."""
    import importlib
    import time as _time

    from gpuflow.hardware.home import gpuflow_home

    if name not in BENCHMARKS:
        raise InvalidRequestError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    try:
        module = importlib.import_module(f"gpuflow.bench.{name}_bench")
    except ModuleNotFoundError:
        raise InvalidRequestError(f"benchmark {name!r} is not built yet") from None
    with console.status(f"bench {name}") as status:
        result = module.run(quick=quick, report=lambda msg: status.update(f"bench {name}: {msg}"))
    out = gpuflow_home() / "bench" / f"{name}-{_time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    for section, values in result.items():
        if not isinstance(values, dict):
            continue
        table = Table(title=section)
        table.add_column("measure")
        table.add_column("value", justify="right")
        for key, value in values.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        console.print(table)
    console.print(f"saved {out}")


# --- control plane ------------------------------------------------------------------------


def _default_project_dir() -> Path:
    """The checkout this gpuflow runs from (editable install), else the current folder."""
    here = Path(__file__).resolve().parents[1]
    return here if (here / "prefect.yaml").is_file() else Path.cwd()


ExporterPort = Annotated[
    int,
    typer.Option(
        help="Port of this host's telemetry exporter (Prometheus scrapes it; 0 = any free)."
    ),
]
NoExporter = Annotated[
    bool, typer.Option("--no-exporter", help="Start no telemetry exporter on this host.")
]


@app.command("up")
@clean_errors
def up_cmd(
    project_dir: Annotated[
        Path | None, typer.Option(help="The gpuflow checkout (holds prefect.yaml).")
    ] = None,
    prefect_port: Annotated[
        int, typer.Option(help="Prefect server port (0 = any free).")
    ] = DEFAULT_PREFECT_PORT,
    mlflow_port: Annotated[
        int, typer.Option(help="MLflow server port (0 = any free).")
    ] = DEFAULT_MLFLOW_PORT,
    workers: Annotated[int, typer.Option(help="Process workers on the pool's default queue.")] = 1,
    node_worker: Annotated[
        list[str] | None,
        typer.Option("--node-worker", help="Start a worker that owns this node (repeatable)."),
    ] = None,
    prefect_database_url: Annotated[
        str | None,
        typer.Option(
            envvar="GPUFLOW_PREFECT_DATABASE_URL",
            help="PostgreSQL URL for Prefect (default SQLite). It holds a password: prefer "
            "the environment variable, as an option is visible in this command's argv.",
        ),
    ] = None,
    mlflow_backend_uri: Annotated[
        str | None,
        typer.Option(
            envvar="GPUFLOW_MLFLOW_BACKEND_URI",
            help="MLflow backend store URL (default SQLite); prefer the environment "
            "variable for one with a password.",
        ),
    ] = None,
    mlflow_artifacts: Annotated[
        str | None, typer.Option(help="MLflow artifact destination (e.g. s3://bucket/mlflow).")
    ] = None,
    no_deploy: Annotated[
        bool, typer.Option("--no-deploy", help="Skip `prefect deploy --all`.")
    ] = False,
    host: Annotated[
        str,
        typer.Option(
            help="Address the Prefect and MLflow servers bind: an IP address or a host name "
            "of this machine. Give the one other hosts reach it by (the URLs name it); "
            "0.0.0.0 binds every interface and names the one with the default route."
        ),
    ] = LOOPBACK,
    exporter_port: ExporterPort = DEFAULT_EXPORTER_PORT,
    no_exporter: NoExporter = False,
) -> None:
    """Start a local control plane: Prefect server, MLflow server, work pool, Blocks, deployments, workers, telemetry exporter."""
    from pydantic import SecretStr

    from gpuflow import controlplane

    with console.status("gpuflow up") as status:
        plane = controlplane.up(
            project_dir or _default_project_dir(),
            prefect_port=prefect_port,
            mlflow_port=mlflow_port,
            workers=workers,
            node_workers=tuple(node_worker or ()),
            prefect_database_url=SecretStr(prefect_database_url) if prefect_database_url else None,
            mlflow_backend_uri=SecretStr(mlflow_backend_uri) if mlflow_backend_uri else None,
            mlflow_artifacts=mlflow_artifacts,
            deploy=not no_deploy,
            report=lambda msg: status.update(f"gpuflow up: {msg}"),
            host=host,
            exporter_port=None if no_exporter else exporter_port,
        )
    table = Table(title="gpuflow control plane")
    table.add_column("what")
    table.add_column("where")
    table.add_row("Prefect UI", plane.prefect_ui_url)
    table.add_row("Prefect API", plane.prefect_api_url)
    table.add_row("MLflow", plane.mlflow_url)
    table.add_row("telemetry exporter", plane.exporter_url or "- (--no-exporter)")
    table.add_row("work pool", plane.pool)
    table.add_row("deployments", "\n".join(plane.deployments) or "-")
    for s in plane.services:
        table.add_row(s.name, f"pid {s.pid}, log {s.log}")
    console.print(table)
    console.print(
        "use it from a shell:  "
        + "  ".join(f"export {k}={v}" for k, v in plane.client_env().items())
    )


@app.command("join")
@clean_errors
def join_cmd(
    control: Annotated[
        str,
        typer.Option(help="The control plane's Prefect API URL, e.g. http://CONTROL:4200/api."),
    ],
    node: Annotated[str, typer.Option(help="The node this host owns (its devices' node name).")],
    mlflow: Annotated[
        str | None,
        typer.Option(help="MLflow URL; default: the one the control plane saved at `up`."),
    ] = None,
    project_dir: Annotated[
        Path | None, typer.Option(help="This host's gpuflow checkout (holds prefect.yaml).")
    ] = None,
    exporter_host: Annotated[
        str,
        typer.Option(
            help="Address this host's telemetry exporter binds: the one Prometheus reaches "
            "this host by (0.0.0.0: every interface)."
        ),
    ] = LOOPBACK,
    exporter_port: ExporterPort = DEFAULT_EXPORTER_PORT,
    no_exporter: NoExporter = False,
) -> None:
    """Join this host to a control plane: register its node there, start its worker and its telemetry exporter."""
    from gpuflow import controlplane

    with console.status("gpuflow join") as status:
        plane = controlplane.join(
            control,
            node,
            project_dir or _default_project_dir(),
            mlflow_url=mlflow,
            report=lambda msg: status.update(f"gpuflow join: {msg}"),
            exporter_host=exporter_host,
            exporter_port=None if no_exporter else exporter_port,
        )
    for s in plane.services:
        console.print(f"{s.name}: pid {s.pid}, log {s.log}" + (f", {s.url}" if s.url else ""))
    console.print(f"node {node} joined {plane.prefect_ui_url}: {', '.join(plane.deployments)}")


@app.command("down")
@clean_errors
def down_cmd(
    node: Annotated[
        str | None,
        typer.Option(help="Stop the worker `gpuflow join --node NODE` started instead."),
    ] = None,
) -> None:
    """Stop what `gpuflow up` (or `gpuflow join`) started, and only that."""
    from gpuflow import controlplane

    stopped = controlplane.down(report=lambda msg: console.print(msg), node=node)
    console.print(f"stopped {len(stopped)} process(es)")


# --- demo -------------------------------------------------------------------------------


@app.command("demo")
@clean_errors
def demo(
    quick: Annotated[
        bool,
        typer.Option(help="A short tour: fewer training steps and requests (figures mean little)."),
    ] = False,
) -> None:
    """The tour on the digital twin: discover, partition, show."""
    from gpuflow.tour import TourSize, run_demo

    run_demo(console, TourSize.quick() if quick else TourSize())


def main() -> None:  # pragma: no cover - console entry
    app()
