"""The two plots of an energy decision, shared by the DVFS controller's flow and the
in-training tuner: the energy-time Pareto front of the probes with the chosen point, and
the fitted time curve against the measured points.

Both return a matplotlib Figure built without pyplot (no global figure state, safe in a
worker's threads, no display needed: the Agg canvas), and write a PNG when given a path.
tracking.log_figure logs one to MLflow.
"""

from __future__ import annotations

from pathlib import Path

from gpuflow.tasks.energy.optimizer import (
    POWER_LIMIT_W,
    Choice,
    Measurement,
    SettingSearch,
)
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

CURVE_POINTS = 200
UNIT = {POWER_LIMIT_W: "W"}


def _figure() -> Figure:
    fig = Figure(figsize=(6.4, 4.4), layout="constrained")
    FigureCanvasAgg(fig)  # attaches the Agg canvas: savefig works without pyplot
    return fig


def _unit(choice: Choice) -> str:
    return UNIT.get(choice.knob, "MHz")


def _save(fig: Figure, path: str | Path | None) -> Figure:
    if path is not None:
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, format="png", dpi=110)
    return fig


def pareto_front(points: list[Measurement]) -> list[Measurement]:
    """The measured points no other point beats on both time and energy, fastest first."""
    front: list[Measurement] = []
    for p in sorted(points, key=lambda m: (m.time_s, m.energy_j)):
        if not front or p.energy_j < front[-1].energy_j:
            front.append(p)
    return front


def pareto_plot(choice: Choice, path: str | Path | None = None) -> Figure:
    """Energy per unit against time per unit of every probe, the Pareto front joined, the
    chosen point starred, the reference (highest setting) ringed, and for a slowdown
    objective the bound as a vertical line."""
    if not choice.probes:
        raise ValueError("pareto_plot needs a choice with at least one probe")
    fig = _figure()
    ax = fig.add_subplot()
    unit = _unit(choice)
    ax.scatter(
        [p.time_s for p in choice.probes],
        [p.energy_j for p in choice.probes],
        color="tab:blue",
        label="probes",
        zorder=3,
    )
    for p in choice.probes:
        ax.annotate(
            f"{p.setting:g} {unit}",
            (p.time_s, p.energy_j),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    front = pareto_front(choice.probes)
    ax.plot(
        [p.time_s for p in front],
        [p.energy_j for p in front],
        color="tab:blue",
        alpha=0.5,
        label="Pareto front",
    )
    ref = choice.reference
    ax.scatter(
        [ref.time_s],
        [ref.energy_j],
        s=160,
        facecolors="none",
        edgecolors="tab:gray",
        label=f"highest setting ({ref.setting:g} {unit})",
        zorder=4,
    )
    ax.scatter(
        [choice.chosen.time_s],
        [choice.chosen.energy_j],
        marker="*",
        s=260,
        color="tab:red",
        label=f"chosen ({choice.chosen.setting:g} {unit})",
        zorder=5,
    )
    if choice.objective.slowdown is not None:
        ax.axvline(
            ref.time_s * (1.0 + choice.objective.slowdown),
            color="tab:red",
            linestyle="--",
            alpha=0.6,
            label=f"slowdown bound ({choice.objective.slowdown:.0%})",
        )
    ax.set_xlabel("time per unit of work (s)")
    ax.set_ylabel("energy per unit of work (J)")
    ax.set_title(
        f"{choice.objective.describe()}: saves {choice.energy_saving:.1%} "
        f"at {choice.slowdown:+.1%} time"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def curve_plot(
    choice: Choice,
    search_or_exponent: SettingSearch | float | None = None,
    path: str | Path | None = None,
) -> Figure:
    """Measured time ratio T/T0 of every probe against its setting, with the fitted curve
    T/T0 = max(1, knee / s) ** k drawn over the probed range. ``search_or_exponent``: the
    search (its model, over its whole grid), an exponent k, or None for the choice's k;
    the knee is the power drawn at the highest setting (clocks: the highest clock)."""
    if not choice.probes:
        raise ValueError("curve_plot needs a choice with at least one probe")
    ref = choice.reference
    knee = ref.power_w if choice.knob == POWER_LIMIT_W else ref.setting
    settings = [p.setting for p in choice.probes]
    lo, hi = min(settings), max(settings)
    if isinstance(search_or_exponent, SettingSearch):
        search = search_or_exponent
        lo, hi = min(lo, search.grid[0]), max(hi, search.grid[-1])
        k = search.exponent()

        def ratio(s: float) -> float:
            return search.predicted_time_ratio(s)

    else:
        if search_or_exponent is None:
            k = choice.exponent
        elif isinstance(search_or_exponent, int | float) and search_or_exponent >= 0:
            k = float(search_or_exponent)
        else:
            raise ValueError(
                "search_or_exponent must be a SettingSearch, an exponent >= 0 or None, got "
                f"{search_or_exponent!r}"
            )

        def ratio(s: float) -> float:
            return float(max(1.0, knee / s) ** k)

    fig = _figure()
    ax = fig.add_subplot()
    unit = _unit(choice)
    span = hi - lo
    xs = [lo + span * i / (CURVE_POINTS - 1) for i in range(CURVE_POINTS)] if span else [lo]
    ax.plot(xs, [ratio(x) for x in xs], color="tab:orange", label=f"fitted, k = {k:.2f}")
    ax.scatter(
        settings,
        [p.time_s / ref.time_s for p in choice.probes],
        color="tab:blue",
        label="measured",
        zorder=3,
    )
    ax.scatter(
        [choice.chosen.setting],
        [choice.chosen.time_s / ref.time_s],
        marker="*",
        s=260,
        color="tab:red",
        label="chosen",
        zorder=4,
    )
    if choice.objective.slowdown is not None:
        ax.axhline(1.0 + choice.objective.slowdown, color="tab:red", linestyle="--", alpha=0.6)
    ax.set_xlabel(f"{'power limit' if choice.knob == POWER_LIMIT_W else 'SM clock'} ({unit})")
    ax.set_ylabel("time per unit / time at the highest setting")
    ax.set_title("time model against the measured points")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
