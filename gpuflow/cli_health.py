"""`gpuflow health train|score|decide|monitor|status`: the predictive health model, the
decision by cost it feeds, and the monitor.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_health.app, name="health")``.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuflow.tasks.health.decision import DRAIN_RISK

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
    from gpuflow.tasks.health.fleet_windows import FleetWindows
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


THRESHOLD_HELP = (
    "Drain at once at or above this risk, whatever the costs (the cost rule acts below it)."
)


@app.command("decide")
def decide_cmd(
    device: Annotated[str, typer.Option(help="The device, NODE:INDEX.")],
    model: Annotated[
        str | None, typer.Option(help="MLflow model URI or 'rules'; default champion.")
    ] = None,
    threshold: Annotated[float, typer.Option(help=THRESHOLD_HELP)] = DRAIN_RISK,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Score one device now and show what the monitor would decide, with the numbers:
    its risk and horizon, each job's lost work and costs (and where they come from), the
    break-even risk and the drain level. Nothing is emitted or saved."""
    from gpuflow.hardware.backend import InvalidRequestError
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.hardware.select import get_backend
    from gpuflow.tasks.health.fleet_windows import FleetWindows
    from gpuflow.tasks.health.monitor import decision_for, monitor_dir, validate_thresholds
    from gpuflow.tasks.health.scoring import FleetScorer, score_fleet
    from gpuflow.tasks.remediation.costs import FleetCosts
    from gpuflow.tasks.remediation.devices import parse_device_ref

    try:
        ref = parse_device_ref(device)
        validate_thresholds(threshold, None)
    except (InvalidRequestError, ValueError) as exc:
        raise _fail(str(exc)) from None
    m, source = _model(model)
    windows = FleetWindows.load_or_new(monitor_dir() / "windows.npz", window=m.window)
    risks = score_fleet(get_backend(), scorer=FleetScorer(m, windows))
    found = next((r for r in risks if (r.node, r.index) == (ref.node, ref.index)), None)
    if found is None:
        raise _fail(f"no device {ref} in this fleet")
    d = decision_for(found, threshold, FleetCosts(Inventory()), source, always_look_up=True)
    if as_json:
        console.print_json(json.dumps(d.to_dict()))
        return
    console.print(f"{ref}: {d.summary()}")
    console.print(f"  {d.why}")
    table = Table(title="jobs on the device (seconds of the gang's time)")
    for col in ("job", "GPUs", "since ckpt", "lost if fails", "ckpt save", "restart", "relaunch"):
        table.add_column(col, justify="left" if col == "job" else "right")
    for j in d.jobs:
        table.add_row(
            j["job_id"],
            str(j["gang_gpus"]),
            *(
                f"{j[k]:.0f}"
                for k in (
                    "since_checkpoint_s",
                    "lost_work_s",
                    "checkpoint_save_s",
                    "restart_s",
                    "relaunch_s",
                )
            ),
        )
    if d.jobs:
        console.print(table)
        for j in d.jobs:
            for name, where in sorted(j["sources"].items()):
                console.print(f"  {j['job_id']} {name}: {where}")


@app.command("monitor")
def monitor_cmd(
    rounds: Annotated[int, typer.Option(help="Samples of every device to take.")] = 12,
    interval: Annotated[float, typer.Option(help="Seconds between samples (>= 5).")] = 5.0,
    threshold: Annotated[float, typer.Option(help=THRESHOLD_HELP)] = DRAIN_RISK,
    model: Annotated[
        str | None, typer.Option(help="MLflow model URI or 'rules'; default champion.")
    ] = None,
    fast_forward: Annotated[
        bool, typer.Option(help="Twin only: advance its clock, don't sleep.")
    ] = False,
    challenger: Annotated[
        str | None,
        typer.Option(
            help="Model scored in shadow (never acted on): an MLflow URI or 'none'; "
            "default the registered challenger."
        ),
    ] = None,
) -> None:
    """Run the `monitor` flow here: sample, score, decide by cost, emit
    gpuflow.device.health-risk events (act: expected loss > checkpoint + migration;
    drain-now: risk >= --threshold)."""
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
                challenger_uri=challenger,
            )
        except ValueError as exc:
            raise _fail(str(exc)) from None
        bar.update(job, completed=rounds)
    console.print(
        f"{result['devices']} devices, {result['rounds']} rounds, model {escape(result['model'])}: "
        f"{len(result['emitted'])} events emitted, {len(result['open_incidents'])} "
        "incidents open"
    )
    for e in result["emitted"]:
        console.print(
            f"  event {e['event_id']} {e['device']} ({e['reason']}): {escape(e['decision'])}"
        )
    shadow = result.get("shadow")
    if shadow:
        console.print(
            f"challenger in shadow, {escape(shadow['model'])}: would have acted on "
            f"{len(shadow['emitted'])} device(s); nothing was done for it"
        )
        for e in shadow["emitted"]:
            console.print(f"  would have: {e['device']} ({e['reason']}): {escape(e['decision'])}")


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
    for col in ("device", "sku", "risk", "decision", "reason", "since (UTC)", "event"):
        table.add_column(col)
    for key, inc in sorted(book.open.items()):
        since = datetime.fromtimestamp(inc["opened_s"], UTC).strftime("%Y-%m-%d %H:%M:%S")
        decision = inc.get("decision") or {}  # incidents opened before decisions had none
        table.add_row(
            key,
            inc.get("sku", ""),
            f"{inc['risk']:.3f}",
            f"{decision.get('action', '')} ({decision.get('decided_by', '')})" if decision else "",
            inc["reason"],
            since,
            inc["event_id"],
        )
    console.print(table)
    _print_scorecard(monitor_dir())


def _print_scorecard(state_dir: Any) -> None:
    """The champion against the challenger in shadow, since the pair started (if any)."""
    from gpuflow.tasks.health.shadow import SCORECARD, Scorecard, scorecard_rows

    card = Scorecard.read(state_dir / SCORECARD)
    if card is None:
        return  # no challenger has been scored here
    since = datetime.fromtimestamp(card.since_s, UTC).strftime("%Y-%m-%d %H:%M:%S")
    console.print(
        f"champion vs challenger (in shadow, not acted on) since {since} (device clock): "
        f"{escape(card.champion)} against {escape(card.challenger)}"
    )
    table = Table()
    rows = scorecard_rows(card.summary())
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else escape(str(v)) for v in row.values()))
    console.print(table)
