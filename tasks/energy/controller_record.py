"""The DVFS controller's run in MLflow (experiment ``gpuflow-energy``): one run per
controller run; per device and job its totals (energy J, average power W, energy and time
per unit of work, the chosen power limit); per decision the choice's numbers, its evidence
as JSON and the two plots (tasks.energy.plots): the energy-time Pareto front of the probes
with the chosen point, and the fitted time curve against the measured points."""

from __future__ import annotations

import re
from typing import Any

from gpuflow.tasks import tracking
from gpuflow.tasks.energy.controller_report import ControllerRun
from gpuflow.tasks.energy.record import log_choice

EXPERIMENT = "gpuflow-energy"
TOTAL_FIELDS = ("energy_j", "average_power_w", "energy_per_unit_j", "time_per_unit_s")


def _key(device: str, job_id: str) -> str:
    """An MLflow-safe metric prefix for one device and job."""
    return re.sub(r"[^A-Za-z0-9_.\-/]", "_", f"{device}/{job_id}")


def record_controller_run(
    run: ControllerRun, params: dict[str, Any], *, run_name: str | None = None
) -> str:
    """Log ``run`` (and the controller's ``params``) as one MLflow run; returns its id."""
    run_id = tracking.open_run(
        EXPERIMENT,
        run_name or f"dvfs {run.holder}",
        tags={"gpuflow.capability": "dvfs", "gpuflow.holder": run.holder},
        params=params,
    )
    with tracking.fail_on_error(run_id):
        metrics: dict[str, float | int | None] = {
            "ticks": run.ticks,
            "decisions": len(run.decisions),
            "cleaned_on_start": len(run.cleaned),
        }
        for t in run.totals:
            d = t.to_dict()
            key = _key(d["device"], t.job_id)
            metrics.update({f"{key}/{f}": d[f] for f in TOTAL_FIELDS})
            metrics[f"{key}/chosen_power_limit_w"] = d["chosen_power_limit_w"]
        tracking.log_metrics(run_id, metrics)
        for i, decision in enumerate(run.decisions):
            key = _key(f"{decision.node}:{decision.index}", decision.job_id)
            log_choice(
                run_id,
                decision.choice,
                key,
                where=f"energy/dvfs/{key}/decision-{i}",
                step=i,
                evidence=decision.to_dict(),
            )
        tracking.log_json(run_id, run.to_dict(), "energy/dvfs/run.json")
    tracking.close_run(run_id)
    return run_id
