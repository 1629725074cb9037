"""`gpuflow energy evaluate|tune`: power limits chosen from a few measured points.

Mounted by gpuflow/cli.py with ``app.add_typer(cli_energy.app, name="energy")``. The work is
in gpuflow.tasks.energy (optimizer, evaluate, tune); this module checks the flags before
anything runs and prints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from gpuflow.cli_base import BackendOpt, backend_named, clean_errors, console, err_console
from gpuflow.hardware.backend import InvalidRequestError

app = typer.Typer(
    help="Energy: choose power limits per device and workload from a few measured points.",
    no_args_is_help=True,
)

SlowdownOpt = Annotated[
    float | None,
    typer.Option(help="Least energy within this slowdown (0.10 = 10 %); the default objective."),
]
EtaOpt = Annotated[
    float | None,
    typer.Option(help="Instead: Zeus's cost eta*E + (1-eta)*P_max*T, eta in [0, 1]."),
]


def _objective(slowdown: float | None, eta: float | None):  # -> Objective
    from gpuflow.tasks.energy.optimizer import DEFAULT_SLOWDOWN, Objective

    if slowdown is not None and eta is not None:
        raise InvalidRequestError("give --slowdown or --eta, not both")
    try:
        if eta is not None:
            return Objective(slowdown=None, eta=eta)
        return Objective(slowdown=DEFAULT_SLOWDOWN if slowdown is None else slowdown)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None


def _pct(v: float) -> str:
    return f"{100 * v:+.1f} %"


def _table(title: str, columns: tuple[str, ...]) -> Table:
    """A table whose first column is a name (left) and the rest figures (right)."""
    table = Table(title=title)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    return table


@app.command("evaluate")
@clean_errors
def evaluate_cmd(
    trace: Annotated[Path, typer.Option(help="A Zeus summary_power_<gpu>.csv trace.")],
    slowdown: SlowdownOpt = None,
    eta: EtaOpt = None,
    margin: Annotated[
        float, typer.Option(help="How far past the bound the model may try a limit.")
    ] = 0.06,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print every row as a JSON list and nothing else.")
    ] = False,
) -> None:
    """Replay every workload of a power trace: the optimizer and its baselines side by side."""
    from gpuflow.tasks.energy.evaluate import OPTIMIZER, evaluate_trace, summarise

    objective = _objective(slowdown, eta)
    if not trace.is_file():
        raise InvalidRequestError(f"--trace {trace}: no such file")
    if not 0.0 <= margin <= 1.0:
        raise InvalidRequestError(f"--margin must be in [0, 1], got {margin}")
    try:
        rows = evaluate_trace(trace, objective, margin)
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=1))
        return
    by = {(r.workload, r.method): r for r in rows}
    table = _table(
        f"{trace.name}: {objective.describe()}",
        (
            "workload",
            "limits",
            "optimizer W",
            "saving",
            "slowdown",
            "probes",
            "oracle W",
            "oracle saving",
            "seed rule",
            "profile-all probes",
        ),
    )
    for r in (r for r in rows if r.method == OPTIMIZER):
        p = by[(r.workload, "profile-all")]
        s = by[(r.workload, "seed-rule")]
        table.add_row(
            r.workload,
            str(r.limits),
            f"{r.power_limit_w:g}",
            _pct(r.energy_saving),
            _pct(r.slowdown) + ("" if r.within_bound else " [red]over[/red]"),
            str(r.probes),
            f"{r.oracle_power_limit_w:g}",
            _pct(r.oracle_energy_saving),
            _pct(s.energy_saving),
            str(p.probes),
        )
    console.print(table)
    summary = _table(
        "summary per method (capture: energy saved / the oracle's, in total)",
        (
            "method",
            "workloads",
            "within bound",
            "capture",
            "mean capture",
            "mean saving",
            "probes mean",
            "probes max",
            "limits mean",
        ),
    )
    for s in summarise(rows):
        summary.add_row(
            s.method,
            str(s.workloads),
            str(s.within_bound),
            f"{s.capture:.3f}",
            f"{s.mean_capture:.3f}",
            _pct(s.mean_energy_saving),
            f"{s.mean_probes:.2f}",
            str(s.max_probes),
            f"{s.mean_limits:.2f}",
        )
    console.print(summary)


@app.command("tune")
@clean_errors
def tune_cmd(
    device: Annotated[str, typer.Option(help="NODE:INDEX, e.g. v100-0:0")],
    slowdown: SlowdownOpt = None,
    eta: EtaOpt = None,
    probe_s: Annotated[float, typer.Option(help="Seconds measured per power limit.")] = 2.0,
    keep: Annotated[
        bool, typer.Option(help="Leave the chosen limit on the device (held for --hold-s).")
    ] = False,
    hold_s: Annotated[float, typer.Option(help="With --keep: how long it is held.")] = 3600.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the choice as JSON.")] = False,
    backend: BackendOpt = None,
) -> None:
    """Choose one device's power limit for a reference workload, through the hardware layer."""
    from gpuflow.hardware.inventory import Inventory
    from gpuflow.tasks.energy.tune import parse_device, tune_device

    objective = _objective(slowdown, eta)
    node, index = parse_device(device)
    if not probe_s > 0 or not hold_s > 0:
        raise InvalidRequestError(f"--probe-s and --hold-s must be > 0, got {probe_s}, {hold_s}")
    b = backend_named(backend)
    inventory = Inventory()
    with console.status(f"tuning {device}") as status:
        result = tune_device(
            b,
            inventory,
            node,
            index,
            objective,
            probe_s=probe_s,
            keep=keep,
            hold_s=hold_s,
            progress=status.update,
        )
    c = result.choice
    if as_json:
        typer.echo(json.dumps({"device": device, "kept": result.kept, **c.to_dict()}, indent=1))
        return
    table = _table(
        f"{device}: {objective.describe()}",
        ("power limit W", "time/unit ms", "energy/unit J", "avg power W", ""),
    )
    for p in sorted(c.probes, key=lambda p: p.setting):
        mark = "[green]chosen[/green]" if p is c.chosen else ""
        table.add_row(
            f"{p.setting:g}", f"{1e3 * p.time_s:.2f}", f"{p.energy_j:.3f}", f"{p.power_w:.0f}", mark
        )
    console.print(table)
    console.print(
        f"chosen {c.chosen.setting:g} W: energy {_pct(-c.energy_saving)}, time "
        f"{_pct(c.slowdown)} after {len(c.probes)} probes (default limit "
        f"{result.default_limit_w:g} W)"
        + (f"; kept on the device for {hold_s:g} s" if result.kept else "; device restored")
    )
    err_console.print(
        "[dim]for the reference workload; a job tunes its own with energy='tune'[/dim]"
    )


@app.command("seed-claim")
@clean_errors
def seed_claim_cmd(
    traces: Annotated[
        Path | None,
        typer.Option(help="Folder of Zeus summary_power_*.csv (default: the packaged copy)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the rows as JSON.")] = False,
) -> None:
    """The seed's "~1.2 GHz cut power per TOPS by 42 %", per SKU on the twin and the traces."""
    from gpuflow.tasks.energy.seed_claim import seed_claim_report

    folder = traces if traces is not None else _default_traces()
    if traces is not None and not traces.is_dir():
        raise InvalidRequestError(f"--traces {traces}: no such folder")
    with console.status("fitting each trace"):
        rows = seed_claim_report(folder if folder.is_dir() else None)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    columns = tuple(rows[0]) if rows else ("source",)
    table = _table("power per unit of work near 1.2 GHz vs max (seed: -42 %)", columns)
    for r in rows:
        table.add_row(*(f"{v:.3g}" if isinstance(v, float) else str(v) for v in r.values()))
    console.print(table)


@app.command("fit")
@clean_errors
def fit_cmd(
    trace: Annotated[Path, typer.Option(help="A Zeus summary_power_<gpu>.csv trace.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the fit report as JSON.")] = False,
) -> None:
    """Fit the twin's voltage curve and every workload's character to a power trace."""
    from gpuflow.tasks.energy.twin_fit import TRACE_DEVICES, fit_twin

    if not trace.is_file():
        raise InvalidRequestError(f"--trace {trace}: no such file")
    gpu = trace.stem.removeprefix("summary_power_")
    if gpu not in TRACE_DEVICES:
        raise InvalidRequestError(
            f"--trace {trace}: no device known for {gpu!r}; known: {', '.join(TRACE_DEVICES)}"
        )
    try:
        report = fit_twin(trace, TRACE_DEVICES[gpu])
    except ValueError as exc:
        raise InvalidRequestError(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1, default=str))
        return
    console.print(
        f"{trace.name}: V_min/V_max {report.v_min_v / report.v_max_v:.3f}, knee "
        f"{report.knee_ratio:.3f} of f_max, static share {report.static_share:.3f}, cap "
        f"headroom {report.cap_headroom:.3f}; median memory-bound ratio "
        f"{report.median_memory_bound_ratio:.2f}, activity {report.median_activity:.2f}"
    )
    table = _table(
        "fit error |model/measured - 1| per workload class",
        ("class", "workloads", "time p50", "time p90", "power p50", "power p90"),
    )
    for e in report.errors:
        table.add_row(
            e.workload_class,
            str(e.workloads),
            f"{e.time_median:.3f}",
            f"{e.time_p90:.3f}",
            f"{e.power_median:.3f}",
            f"{e.power_p90:.3f}",
        )
    console.print(table)


def _default_traces() -> Path:
    from gpuflow.tasks.energy.traces import DEFAULT_TRACES_DIR

    return DEFAULT_TRACES_DIR
