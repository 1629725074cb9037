"""The `gpuflow` command line: thin verbs over the plain functions of hardware/ and tasks/."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from gpuflow.hardware.backend import HardwareError, InvalidRequestError

app = typer.Typer(
    name="gpuflow",
    help="A control plane for mixed GPU fleets (NVIDIA, Hygon DCU, or the digital twin).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
hw_app = typer.Typer(help="Devices: list them, partition them.", no_args_is_help=True)
partition_app = typer.Typer(
    help="Hard partitions from a mig-parted plan: apply, assert, export.", no_args_is_help=True
)
sim_app = typer.Typer(
    help="The digital twin: inject faults, repair, fast-forward.", no_args_is_help=True
)
app.add_typer(hw_app, name="hw")
hw_app.add_typer(partition_app, name="partition")
app.add_typer(sim_app, name="sim")


def _mount_capabilities() -> None:
    """Each capability keeps its verbs in its own module (gpuflow/cli_<area>.py)."""
    from gpuflow import cli_edge, cli_health, cli_remediate, cli_schedule

    app.add_typer(cli_health.app, name="health")
    app.add_typer(cli_remediate.app, name="remediate")
    app.add_typer(cli_schedule.app, name="schedule")
    app.add_typer(cli_edge.app, name="edge")


_mount_capabilities()

# Piped output (CI logs, `| less`) gets a table wide enough for nvidia-smi-like rows.
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, soft_wrap=True)  # errors stay one greppable line

F = TypeVar("F", bound=Callable[..., Any])


def _clean_errors(fn: F) -> F:
    """Bad input and refused operations end as one red line and a non-zero exit, not a trace."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except InvalidRequestError as exc:
            err_console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        except HardwareError as exc:
            err_console.print(f"[red]hardware error:[/red] {exc}")
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", "-b", help="auto | nvml | hygon | sim (default: GPUFLOW_BACKEND or auto)"
    ),
]


def _backend(name: str | None):
    from gpuflow.hardware.select import get_backend, resolve_backend_name

    chosen, reason = resolve_backend_name(name)
    err_console.print(f"[dim]backend: {chosen} ({reason})[/dim]")
    return get_backend(chosen)


def _sync_inventory(backend) -> None:
    """Keep the inventory in step after a change to devices (it is what schedulers read)."""
    from gpuflow.hardware.inventory import Inventory

    Inventory().sync(backend)


# --- hw ---------------------------------------------------------------------------------


@hw_app.command("list")
@_clean_errors
def hw_list(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    backend: BackendOpt = None,
) -> None:
    """List every device: node, index, SKU, memory, partitions, temperature, power, health."""
    from gpuflow.tasks.fleet import fleet_rows

    rows = fleet_rows(_backend(backend))
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    console.print(fleet_table(rows))


def fleet_table(rows: list[dict[str, Any]], title: str = "gpuflow fleet") -> Table:
    from gpuflow.tasks.fleet import partition_summary

    table = Table(title=title, header_style="bold")
    for col, justify in (
        ("node", "left"),
        ("idx", "right"),
        ("region", "left"),
        ("SKU", "left"),
        ("memory", "right"),
        ("partitions", "left"),
        ("temp", "right"),
        ("power", "right"),
        ("util", "right"),
        ("health", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    colours = {"ok": "green", "warn": "yellow", "critical": "red", "lost": "red"}
    for r in rows:
        node = r["node"] + (" (spare)" if r["role"] == "spare" else "")
        health = r["health"] + (
            f" ({', '.join(r['health_reasons'])})" if r["health_reasons"] else ""
        )
        table.add_row(
            node,
            str(r["index"]),
            r["region"],
            r["sku"],
            f"{r['memory_total_mb'] // 1024} GiB",
            partition_summary(r["partitions"]),
            "-" if r["temperature_c"] is None else f"{r['temperature_c']:.0f} C",
            "-" if r["power_mw"] is None else f"{r['power_mw'] / 1000:.0f} W",
            "-" if r["utilization_ratio"] is None else f"{r['utilization_ratio']:.0%}",
            f"[{colours.get(r['health'], 'white')}]{health}[/]",
        )
    return table


PlanFile = Annotated[
    Path, typer.Option("--file", "-f", help="Partition plan (mig-parted v1 format).")
]
ConfigName = Annotated[
    str, typer.Option("--config", "-c", help="The mig-config to use from the plan.")
]
NodesOpt = Annotated[
    list[str] | None,
    typer.Option("--node", "-n", help="Only these nodes (repeatable); default all."),
]


def _read_plan(path: Path):
    from gpuflow.hardware.partition_plan import load_plan

    if not path.is_file():
        raise InvalidRequestError(f"plan file {str(path)!r} does not exist")
    return load_plan(path)


@partition_app.command("apply")
@_clean_errors
def partition_apply(
    file: PlanFile, config: ConfigName, node: NodesOpt = None, backend: BackendOpt = None
) -> None:
    """Validate the whole plan, then bring every selected device to it (idempotent)."""
    from gpuflow.hardware.partition_plan import apply_plan

    plan = _read_plan(file)
    be = _backend(backend)
    report = apply_plan(be, plan, config, nodes=node or None)
    _sync_inventory(be)
    changed = [d for d in report.devices if d.changed]
    console.print(
        f"applied config [bold]{config}[/bold]: {len(changed)} device(s) changed, "
        f"{len(report.devices) - len(changed)} already matched"
    )
    for d in changed:
        console.print(f"  {d.node}:{d.index}  {d.before_summary} -> {d.after_summary}")


@partition_app.command("assert")
@_clean_errors
def partition_assert(
    file: PlanFile, config: ConfigName, node: NodesOpt = None, backend: BackendOpt = None
) -> None:
    """Exit 0 when every selected device matches the plan, 1 (listing mismatches) otherwise."""
    from gpuflow.hardware.partition_plan import assert_plan

    plan = _read_plan(file)
    mismatches = assert_plan(_backend(backend), plan, config, nodes=node or None)
    if mismatches:
        for m in mismatches:
            err_console.print(f"[red]mismatch[/red] {m}")
        raise typer.Exit(1)
    console.print(f"[green]all selected devices match config {config}[/green]")


@partition_app.command("export")
@_clean_errors
def partition_export(
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Write the plan here (default: stdout).")
    ] = None,
    node: NodesOpt = None,
    backend: BackendOpt = None,
) -> None:
    """Write the current layout as a mig-parted plan (config "current")."""
    from gpuflow.hardware.partition_plan import dump_yaml, export_layout

    text = dump_yaml(export_layout(_backend(backend), nodes=node or None))
    if file is None:
        sys.stdout.write(text)
    else:
        file.write_text(text)
        console.print(f"wrote {file}")


# --- sim --------------------------------------------------------------------------------


def _parse_device(text: str) -> tuple[str, int]:
    node, sep, index = text.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise InvalidRequestError(f"--device {text!r}: expected NODE:INDEX, e.g. a100-0:2")
    return node, int(index)


def _twin():
    from gpuflow.hardware.sim import SimBackend

    return SimBackend()


@sim_app.command("inject")
@_clean_errors
def sim_inject(
    device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX, e.g. a100-0:2")],
    fault: Annotated[
        str, typer.Option("--fault", "-k", help="Fault kind (see `gpuflow sim faults`).")
    ],
) -> None:
    """Inject a fault into a twin device now; every process reading the twin sees it."""
    node, index = _parse_device(device)
    record = _twin().inject_fault(node, index, fault)
    console.print(
        f"injected [bold]{fault}[/bold] on {node}:{index}: {json.dumps(record, default=str)}"
    )


@sim_app.command("faults")
def sim_faults() -> None:
    """List the fault kinds the twin can inject."""
    from gpuflow.hardware.sim import FAULT_KINDS

    for kind in FAULT_KINDS:
        console.print(kind)


@sim_app.command("repair")
@_clean_errors
def sim_repair(device: Annotated[str, typer.Option("--device", "-d", help="NODE:INDEX")]) -> None:
    """Reset or replace a twin device: its faults are cleared."""
    node, index = _parse_device(device)
    _twin().repair(node, index)
    console.print(f"repaired {node}:{index}")


@sim_app.command("advance")
@_clean_errors
def sim_advance(
    seconds: Annotated[float, typer.Argument(help="Simulated seconds to fast-forward.")],
) -> None:
    """Fast-forward the twin's clock (physics and fault hazards run in between)."""
    if seconds <= 0:
        raise InvalidRequestError(f"seconds must be > 0, got {seconds}")
    twin = _twin()
    twin.advance(seconds)
    console.print(f"twin clock now at {twin.now_s():.0f} s")


@sim_app.command("reset")
@_clean_errors
def sim_reset(
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Cluster spec YAML (default: the embedded fleet).")
    ] = None,
) -> None:
    """Re-create the twin's state from a cluster spec (all partitions and faults gone)."""
    from gpuflow.hardware.sim import SimBackend

    SimBackend.reset_state(spec_path=spec)
    console.print("twin reset")


# --- training ---------------------------------------------------------------------------

StorageOpt = Annotated[str, typer.Option("--storage", help="local | s3")]


def _storage(
    storage: str,
    path: Path | None,
    bucket: str | None,
    prefix: str,
    endpoint_url: str | None,
    block: str | None,
):
    """A CheckpointStorage from options; S3 credentials come from the usual AWS variables."""
    import os

    from pydantic import SecretStr, ValidationError

    from gpuflow.blocks.checkpoint_storage import CheckpointStorage

    if block:
        return CheckpointStorage.load(block)
    if storage not in ("local", "s3"):
        raise InvalidRequestError(f"--storage {storage!r}: use local or s3")
    secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
    try:
        return CheckpointStorage(
            kind=storage,
            path=str(path) if path else "",
            bucket=bucket or "",
            prefix=prefix,
            endpoint_url=endpoint_url,
            access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_access_key=SecretStr(secret) if secret else None,
        )
    except ValidationError as exc:
        raise InvalidRequestError(str(exc)) from None


def _train_spec(**fields: Any):
    from pydantic import ValidationError

    from gpuflow.tasks.training.spec import TrainSpec

    try:
        return TrainSpec(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        msgs = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidRequestError(msgs) from None


class _StepProgress:
    """A Rich progress bar fed by the training loop's step observers."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            "loss {task.fields[loss]}",
            "{task.fields[precision]}",
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, Any] = {}

    def __call__(self, job_id: str, total: int, info: Any) -> None:
        if job_id not in self.tasks:
            self.tasks[job_id] = self.progress.add_task(job_id, total=total, loss="-", precision="")
        self.progress.update(
            self.tasks[job_id],
            completed=info.step,
            loss=f"{info.loss:.3f}",
            precision=info.precision,
        )

    def __enter__(self) -> _StepProgress:
        from gpuflow.tasks.training import job

        self.progress.start()
        job.step_observers.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        from gpuflow.tasks.training import job

        job.step_observers.remove(self)
        self.progress.stop()


def _run_flow(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a flow in this process; its refusals become clean CLI errors."""
    from gpuflow.tasks.training.checkpoint import CheckpointError
    from gpuflow.tasks.training.precision import PrecisionError
    from gpuflow.tasks.training.storage import StorageError

    try:
        return fn(*args, **kwargs)
    except (PrecisionError, StorageError, CheckpointError, ValueError) as exc:
        raise InvalidRequestError(str(exc)) from None


@app.command("train")
@_clean_errors
def train_cmd(
    model: Annotated[
        str, typer.Option(help="Model name (llama-tiny, byte-lm, resnet18-digits, ...).")
    ] = "llama-tiny",
    steps: Annotated[int, typer.Option(help="Total optimizer steps.")] = 200,
    precision: Annotated[str, typer.Option(help="fp32 | bf16 | fp16 | auto")] = "auto",
    job_id: Annotated[
        str | None, typer.Option(help="Job id (names checkpoints); default generated.")
    ] = None,
    batch_size: Annotated[int | None, typer.Option()] = None,
    checkpoint_interval: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 50,
    seed: Annotated[int, typer.Option()] = 0,
    sku: Annotated[
        str | None, typer.Option(help="Run on a device of this SKU (a100-40gb, v100, ...).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option(help="Run on a partition of this profile (3g.20gb, vdcu).")
    ] = None,
    storage: StorageOpt = "local",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Local checkpoint root.")] = None,
    s3_bucket: Annotated[str | None, typer.Option(help="S3 bucket for checkpoints.")] = None,
    s3_prefix: Annotated[str, typer.Option(help="Key prefix in the bucket.")] = "",
    s3_endpoint_url: Annotated[str | None, typer.Option(help="Any S3-compatible endpoint.")] = None,
    storage_block: Annotated[
        str | None, typer.Option(help="A saved CheckpointStorage block.")
    ] = None,
) -> None:
    """Train a model on the fleet (the `train` flow): lease, train, checkpoint, record in MLflow."""
    from gpuflow.flows.train import train
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _train_spec(
        job_id=job_id,
        model=model,
        steps=steps,
        precision=precision,
        batch_size=batch_size,
        checkpoint_interval=checkpoint_interval,
        seed=seed,
    )
    store = _storage(storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block)
    with _StepProgress():
        result = _run_flow(
            train, spec, device=DeviceRequest(sku=sku, profile=profile), storage=store
        )
    table = Table(title=f"train {spec.job_id}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in (
        "steps_done",
        "resumed_from_step",
        "final_loss",
        "eval_loss",
        "wall_time_s",
        "run_id",
    ):
        value = result[key]
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    table.add_row("precision switches", str(len(result["switches"])))
    console.print(table)


@app.command("compare-precision")
@_clean_errors
def compare_precision_cmd(
    model: Annotated[str, typer.Option(help="Model name.")] = "byte-lm",
    steps: Annotated[int, typer.Option(help="Steps per run.")] = 300,
    candidate: Annotated[
        list[str] | None,
        typer.Option("--candidate", help="Candidate policy (repeatable); default auto."),
    ] = None,
    threshold: Annotated[
        float, typer.Option(help="Convergence delta threshold (0.005 = 0.5 %).")
    ] = 0.005,
    job_id: Annotated[str | None, typer.Option(help="Job id prefix.")] = None,
    sku: Annotated[str | None, typer.Option(help="Device SKU for every run.")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    storage: StorageOpt = "local",
    checkpoint_dir: Annotated[Path | None, typer.Option(help="Local checkpoint root.")] = None,
    s3_bucket: Annotated[str | None, typer.Option()] = None,
    s3_prefix: Annotated[str, typer.Option()] = "",
    s3_endpoint_url: Annotated[str | None, typer.Option()] = None,
    storage_block: Annotated[str | None, typer.Option()] = None,
) -> None:
    """Train the same job under fp32 and candidate policies; speedup and convergence delta."""
    from gpuflow.flows.compare_precision import compare_precision
    from gpuflow.tasks.training.binding import DeviceRequest

    spec = _train_spec(
        job_id=job_id,
        model=model,
        steps=steps,
        seed=seed,
        checkpoint_interval=max(steps, 1),
    )
    store = _storage(storage, checkpoint_dir, s3_bucket, s3_prefix, s3_endpoint_url, storage_block)
    with _StepProgress():
        out = _run_flow(
            compare_precision,
            spec,
            candidates=candidate or ["auto"],
            device=DeviceRequest(sku=sku),
            storage=store,
            threshold=threshold,
        )
    console.print(comparison_table(out["rows"]))
    console.print(f"MLflow parent run: {out['parent_run_id']}")


def comparison_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="precision vs fp32")
    for col in ("policy", "speedup", "step speedup", "convergence delta", "switches", "verdict"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for r in rows:
        colour = "green" if r["verdict"] == "pass" else "red"
        table.add_row(
            r["policy"],
            f"{r['speedup']:.2f}x",
            f"{r['step_speedup']:.2f}x",
            f"{100 * r['convergence_delta']:.3f} %",
            str(r["switches"]),
            f"[{colour}]{r['verdict']}[/]",
        )
    return table


# --- benchmarks ---------------------------------------------------------------------------

# Each benchmark is a module gpuflow/bench/<name>_bench.py with
# run(quick: bool, report: Callable[[str], None]) -> dict (JSON-ready, nested one level).
BENCHMARKS = ("train", "scheduler", "downtime", "edge", "health")


@app.command("bench")
@_clean_errors
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


@app.command("up")
@_clean_errors
def up_cmd(
    project_dir: Annotated[
        Path | None, typer.Option(help="The gpuflow checkout (holds prefect.yaml).")
    ] = None,
    prefect_port: Annotated[int, typer.Option(help="Prefect server port (0 = any free).")] = 4200,
    mlflow_port: Annotated[int, typer.Option(help="MLflow server port (0 = any free).")] = 5000,
    workers: Annotated[int, typer.Option(help="Process workers on the pool's default queue.")] = 1,
    node_worker: Annotated[
        list[str] | None,
        typer.Option("--node-worker", help="Start a worker that owns this node (repeatable)."),
    ] = None,
    prefect_database_url: Annotated[
        str | None,
        typer.Option(
            envvar="GPUFLOW_PREFECT_DATABASE_URL",
            help="PostgreSQL URL for Prefect (default SQLite).",
        ),
    ] = None,
    mlflow_backend_uri: Annotated[
        str | None,
        typer.Option(
            envvar="GPUFLOW_MLFLOW_BACKEND_URI", help="MLflow backend store URL (default SQLite)."
        ),
    ] = None,
    mlflow_artifacts: Annotated[
        str | None, typer.Option(help="MLflow artifact destination (e.g. s3://bucket/mlflow).")
    ] = None,
    no_deploy: Annotated[
        bool, typer.Option("--no-deploy", help="Skip `prefect deploy --all`.")
    ] = False,
) -> None:
    """Start a local control plane: Prefect server, MLflow server, work pool, Blocks, deployments, workers."""
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
        )
    table = Table(title="gpuflow control plane")
    table.add_column("what")
    table.add_column("where")
    table.add_row("Prefect UI", plane.prefect_ui_url)
    table.add_row("Prefect API", plane.prefect_api_url)
    table.add_row("MLflow", plane.mlflow_url)
    table.add_row("work pool", plane.pool)
    table.add_row("deployments", "\n".join(plane.deployments) or "-")
    for s in plane.services:
        table.add_row(s.name, f"pid {s.pid}, log {s.log}")
    console.print(table)
    console.print(
        "use it from a shell:  "
        + "  ".join(f"export {k}={v}" for k, v in plane.client_env().items())
    )


@app.command("down")
@_clean_errors
def down_cmd() -> None:
    """Stop what `gpuflow up` started, and only that."""
    from gpuflow import controlplane

    stopped = controlplane.down(report=lambda msg: console.print(msg))
    console.print(f"stopped {len(stopped)} process(es)")


# --- demo -------------------------------------------------------------------------------


@app.command("demo")
@_clean_errors
def demo() -> None:
    """The tour on the digital twin: discover, partition, show."""
    from gpuflow.demo import run_demo

    run_demo(console)


def main() -> None:  # pragma: no cover - console entry
    app()
