"""An energy decision in MLflow: its numbers, its evidence as JSON, and the two plots (the
energy-time Pareto front of the probes with the chosen point; the fitted time curve against
the measured points, tasks.energy.plots). The in-training tuner and the DVFS controller's
flow log their decisions through here."""

from __future__ import annotations

from typing import Any

from gpuflow.tasks import tracking
from gpuflow.tasks.energy.optimizer import Choice


def choice_metrics(c: Choice, prefix: str) -> dict[str, float]:
    return {
        f"{prefix}_power_limit_w": c.chosen.setting,
        f"{prefix}_energy_saving": c.energy_saving,
        f"{prefix}_slowdown": c.slowdown,
        f"{prefix}_probes": float(len(c.probes)),
        f"{prefix}_time_per_unit_s": c.chosen.time_s,
        f"{prefix}_energy_per_unit_j": c.chosen.energy_j,
        f"{prefix}_average_power_w": c.chosen.power_w,
        f"{prefix}_exponent": c.exponent,
    }


def log_choice(
    run_id: str,
    c: Choice,
    prefix: str,
    *,
    where: str | None = None,
    step: int = 0,
    evidence: dict[str, Any] | None = None,
) -> None:
    """Log one decision to run ``run_id``: metrics under ``prefix`` (at ``step``: a
    re-decision is the next point of one series), ``evidence`` (default: the choice) as
    JSON and both plots, under the artifact path ``where`` (default energy/<prefix>)."""
    from gpuflow.tasks.energy.plots import curve_plot, pareto_plot

    where = where or f"energy/{prefix}"
    tracking.log_metrics(run_id, choice_metrics(c, prefix), step=step)
    tracking.log_json(run_id, evidence if evidence is not None else c.to_dict(), f"{where}.json")
    tracking.log_figure(run_id, pareto_plot(c), f"{where}-pareto.png")
    tracking.log_figure(run_id, curve_plot(c), f"{where}-curve.png")
