"""`gpuflow health train|score|monitor|status`: the predictive health model and its monitor.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_health.app, name="health")``.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

app = typer.Typer(
    help="Predictive device health: train the risk model, score the fleet, watch it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console(width=None if Console().is_terminal else 160)
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code)


def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def comparison_table(summary: dict[str, Any]) -> Table:
    """Test-split figures of every model (the monitor threshold and the val-tuned one)."""
    table = Table(title="health model vs baselines, test split")
    for col in (
        "model",
        "threshold",
        "precision",
        "recall",
        "hbm",
        "thermal",
        "xid79",
        "ecc-unc.",
        "FA/1000 dev-days",
        "PR-AUC",
        "lead p50 min",
    ):
        table.add_column(col, justify="left" if col == "model" else "right")
    for key, suffix in (("test_at_monitor_threshold", ""), ("test_at_tuned_threshold", " (tuned)")):
        for name, r in summary[key].items():
            c = r["by_class"]
            lead = r.get("lead_p50_s")
            table.add_row(
                name + suffix,
                _fmt(r["threshold"], 2),
                _fmt(r["precision"]),
                _fmt(r["recall"]),
                *(
                    _fmt(c[k]["recall"], 2)
                    for k in ("hbm", "thermal", "xid79", "ecc-uncorrectable")
                ),
                _fmt(r["fa_per_1000_device_days"], 2),
                _fmt(r["pr_auc"]),
                _fmt(lead / 60 if isinstance(lead, float) and not math.isnan(lead) else None, 1),
            )
    return table


@app.command("train")
def train_cmd(
    quick: Annotated[
        bool, typer.Option(help="Small fleet, tiny LSTM: seconds, not minutes.")
    ] = False,
    nodes: Annotated[int | None, typer.Option(help="Nodes in the simulated fleet history.")] = None,
    days: Annotated[float | None, typer.Option(help="Days of history.")] = None,
    epochs: Annotated[int | None, typer.Option(help="LSTM epochs.")] = None,
    threshold: Annotated[
        float, typer.Option(help="Monitor threshold the test figures use.")
    ] = 0.85,
    register: Annotated[bool, typer.Option(help="Register the model and move the alias.")] = True,
    cache: Annotated[bool, typer.Option(help="Reuse a cached history under GPUFLOW_HOME.")] = True,
) -> None:
    """Generate (or load) the fleet history, train the LSTM and the GBT, evaluate them and
    the baselines on the test split, record in MLflow, register the champion."""
    from gpuflow.flows.health_train import health_train
    from gpuflow.tasks.health.history import HistoryConfig
    from gpuflow.tasks.health.model import TrainConfig

    try:
        base = HistoryConfig.small() if quick else HistoryConfig()
        overrides = {k: v for k, v in (("nodes", nodes), ("days", days)) if v is not None}
        history = base.model_copy(update=overrides) if overrides else base
        HistoryConfig(**history.model_dump())  # validate the overrides
        training = TrainConfig.small() if quick else TrainConfig()
        if epochs is not None:
            training = TrainConfig(**{**training.to_dict(), "epochs": epochs})
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        result = health_train(
            history=history,
            training=training,
            quick=quick,
            threshold=threshold,
            register_model=register,
            cache=cache,
        )
    except ValueError as exc:
        raise _fail(str(exc)) from None
    console.print(comparison_table(result["summary"]))
    console.print(
        f"MLflow run {result['run_id']}"
        + (
            f"; registered {result['registry_uri']} (v{result['model_version']})"
            if "registry_uri" in result
            else ""
        )
    )


def _model(model: str | None):
    from gpuflow.tasks.health.monitor import load_health_model

    try:
        return load_health_model(model)
    except (OSError, ValueError) as exc:
        raise _fail(f"cannot load model {model!r}: {exc}") from None


@app.command("score")
def score_cmd(
    model: Annotated[
        str | None, typer.Option(help="MLflow model URI or 'rules'; default champion.")
    ] = None,
    top: Annotated[int, typer.Option(help="Show the riskiest N devices.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Score every device once, continuing the monitor's windows (nothing is emitted or saved)."""
    from gpuflow.hardware.select import get_backend
    from gpuflow.tasks.health.features import FleetWindows
    from gpuflow.tasks.health.monitor import monitor_dir
    from gpuflow.tasks.health.scoring import FleetScorer, score_fleet

    m, source = _model(model)
    windows = FleetWindows.load_or_new(monitor_dir() / "windows.npz", window=m.window)
    risks = score_fleet(get_backend(), scorer=FleetScorer(m, windows))
    risks.sort(key=lambda r: -r.risk)
    if as_json:
        console.print_json(json.dumps([r.to_dict() for r in risks[:top]]))
        return
    table = Table(title=f"device risk (model {source})")
    for col in ("device", "sku", "risk", "reason", "top features"):
        table.add_column(col)
    for r in risks[:top]:
        feats = ", ".join(f"{k}={v:g}" for k, v in r.top_features.items())
        table.add_row(f"{r.node}:{r.index}", r.sku, f"{r.risk:.4f}", r.reason, feats)
    console.print(table)


@app.command("monitor")
def monitor_cmd(
    rounds: Annotated[int, typer.Option(help="Samples of every device to take.")] = 12,
    interval: Annotated[float, typer.Option(help="Seconds between samples (>= 5).")] = 5.0,
    threshold: Annotated[float, typer.Option(help="Emit at or above this risk.")] = 0.85,
    model: Annotated[
        str | None, typer.Option(help="MLflow model URI or 'rules'; default champion.")
    ] = None,
    fast_forward: Annotated[
        bool, typer.Option(help="Twin only: advance its clock, don't sleep.")
    ] = False,
) -> None:
    """Run the `monitor` flow here: sample, score, emit gpuflow.device.health-risk events."""
    from gpuflow.flows.monitor import monitor

    with Progress(
        TextColumn("monitor"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err_console,
    ) as bar:
        job = bar.add_task("monitor", total=rounds)
        try:
            result = monitor(
                rounds=rounds,
                interval_s=interval,
                threshold=threshold,
                model_uri=model,
                fast_forward=fast_forward,
            )
        except ValueError as exc:
            raise _fail(str(exc)) from None
        bar.update(job, completed=rounds)
    console.print(
        f"{result['devices']} devices, {result['rounds']} rounds, model {result['model']}: "
        f"{len(result['emitted'])} events emitted, {len(result['open_incidents'])} "
        "incidents open"
    )
    for e in result["emitted"]:
        console.print(f"  event {e['event_id']} {e['device']} risk {e['risk']:.3f} ({e['reason']})")


@app.command("status")
def status_cmd() -> None:
    """The champion model and its test-split figures; the monitor's open incidents."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from gpuflow.tasks.health.model import CHAMPION_ALIAS, REGISTERED_MODEL
    from gpuflow.tasks.health.monitor import IncidentBook, monitor_dir
    from gpuflow.tasks.tracking import tracking_uri

    uri = tracking_uri()
    client = MlflowClient(uri, registry_uri=uri)
    try:
        mv = client.get_model_version_by_alias(REGISTERED_MODEL, CHAMPION_ALIAS)
    except MlflowException:
        console.print(
            f"no champion: {REGISTERED_MODEL}@{CHAMPION_ALIAS} is not registered "
            "(`gpuflow health train`); the monitor uses the threshold rules"
        )
    else:
        metrics = client.get_run(mv.run_id).data.metrics
        table = Table(
            title=f"{REGISTERED_MODEL}@{CHAMPION_ALIAS} = v{mv.version} (run {mv.run_id})"
        )
        table.add_column("test-split metric")
        table.add_column("value", justify="right")
        for key in (
            "lstm_pr_auc",
            "lstm_precision",
            "lstm_recall",
            "lstm_fa_per_1000_device_days",
            "tuned_lstm_precision",
            "tuned_lstm_recall",
            "threshold_lstm",
            "gbt_pr_auc",
            "rules_precision",
            "rules_recall",
        ):
            if key in metrics:
                table.add_row(key, f"{metrics[key]:.4f}")
        console.print(table)
    book = IncidentBook(monitor_dir() / "incidents.json")
    table = Table(title=f"open incidents ({len(book.open)})")
    for col in ("device", "sku", "risk", "reason", "since (UTC)", "event"):
        table.add_column(col)
    for key, inc in sorted(book.open.items()):
        since = datetime.fromtimestamp(inc["opened_s"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(
            key, inc.get("sku", ""), f"{inc['risk']:.3f}", inc["reason"], since, inc["event_id"]
        )
    console.print(table)
