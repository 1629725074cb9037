"""Which model decides: the one whose decisions cost least on validation.

Each candidate (rules, trees, LSTM) at each of its horizons is run through the cost rule
of tasks.health.decision with its defaults, for a reference job on every device: a gang
of ``REFERENCE_GANG`` GPUs checkpointing at its Young/Daly period T, its last checkpoint
T/2 ago on average. A device in alarm at risk >= the rule's break-even risk for that
horizon (or at the drain level) is acted on: once per alarm episode, checkpoint + relaunch
(C + M) for the gang. A failure its device was not acted on in time for (between the
horizon and ``lead_min_s`` before it) costs the gang the work since its checkpoint and an
unplanned restart (T/2 + R). Net cost, in GPU-hours per 1,000 device-days (background
episodes weighted by the population they stand for):

    cost  = gang x [alarm episodes x (C + M) + missed failures x (T/2 + R)]
            + false alarm episodes x K                 (K: decision.py's cordon cost, 0
                                                        unless the costs set a hold)
    saved = gang x failures x (T/2 + R) - cost        (what doing nothing would cost)

With a cordon hold (``hold_s``), an episode that begins under an earlier one's standing
cordon moves nothing and costs nothing (evaluate.py); without one every episode is a move.

The champion is the (model, horizon) with the lowest cost; its threshold is not tuned:
it is the rule's break-even risk, so the monitor decides exactly as it was chosen.
What this leaves out by default (cordon cost 0): a drained device's lost capacity while
it waits to be cleared (acting 72 h early is priced like acting 1 h early), jobs of other
sizes (the break-even risk
barely depends on the gang: decision.py), and idle devices (nothing to save).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from gpuflow.tasks.health.decision import (
    DRAIN_RISK,
    CostDefaults,
    DeviceCosts,
    JobCosts,
    decide,
)
from gpuflow.tasks.health.evaluate import DEFAULT_LEAD_MIN_S, alarm_episodes
from gpuflow.tasks.health.history import SplitData
from gpuflow.tasks.health.horizons import horizon_label

REFERENCE_GANG = 8


def reference_costs(
    defaults: CostDefaults | None = None, gang: int = REFERENCE_GANG
) -> DeviceCosts:
    """The reference job of the module doc, as decision.py's rule reads it (with the
    defaults' cordon cost)."""
    d = defaults or CostDefaults()
    period = d.young_daly_s(gang)
    job = JobCosts(
        job_id="reference",
        gang_gpus=gang,
        since_checkpoint_s=period / 2.0,
        checkpoint_save_s=d.checkpoint_save_s,
        restart_s=d.restart_s,
        relaunch_s=d.relaunch_s,
        checkpoint_every_s=period,
        sources={"all": "default: tasks.health.decision constants, Young/Daly period"},
    )
    return DeviceCosts(jobs=(job,), room_elsewhere=True, cordon_gpu_s=d.cordon_gpu_s())


def decision_threshold(horizon_s: float, costs: DeviceCosts | None = None) -> float:
    """The risk at which the rule acts for the reference job: its break-even risk, or the
    drain level if that is lower."""
    d = decide(0.0, horizon_s, costs or reference_costs())
    be = d.break_even_risk
    return DRAIN_RISK if be is None else min(be, DRAIN_RISK)


@dataclass(frozen=True)
class CostResult:
    model: str
    horizon_s: float
    threshold: float
    alarms: float  # episodes (background ones by their weight)
    failures: float
    detected: float
    cost_gpu_h_per_1000_dd: float
    saved_gpu_h_per_1000_dd: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "horizon": horizon_label(self.horizon_s),
            "threshold": round(self.threshold, 6),
            "alarms": round(self.alarms, 2),
            "failures": self.failures,
            "detected": self.detected,
            "cost_gpu_h_per_1000_dd": round(self.cost_gpu_h_per_1000_dd, 3),
            "saved_gpu_h_per_1000_dd": round(self.saved_gpu_h_per_1000_dd, 3),
        }


def decision_cost(
    name: str,
    split: SplitData,
    risks: np.ndarray,
    horizon_s: float,
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
    costs: DeviceCosts | None = None,
    threshold: float | None = None,
    hold_s: float = 0.0,
) -> CostResult:
    """The net cost of acting on ``risks`` (P(fail within ``horizon_s``), one per window)
    by the rule, its cordons standing ``hold_s`` (see the module doc)."""
    costs = costs or reference_costs()
    t = decision_threshold(horizon_s, costs) if threshold is None else threshold
    ep = alarm_episodes(
        split, np.asarray(risks, dtype=np.float64), t, horizon_s, lead_min_s, hold_s
    )
    job = costs.jobs[0]
    act = job.gang_gpus * (job.checkpoint_save_s + job.relaunch_s)
    period = job.checkpoint_every_s or 0.0
    miss = job.gang_gpus * (period / 2.0 + job.restart_s)
    false = float(ep.weight[ep.false_moves].sum())
    alarms = float(ep.true_moves.sum()) + false
    failures, detected = float(len(split.fail_s)), float(ep.detected.sum())
    cost = alarms * act + false * costs.cordon_gpu_s + (failures - detected) * miss
    per = 1000.0 / split.device_days / 3600.0 if split.device_days > 0 else float("nan")
    return CostResult(
        name,
        horizon_s,
        t,
        alarms,
        failures,
        detected,
        cost * per,
        (failures * miss - cost) * per,
    )


def cost_table(
    candidates: dict[str, Any],
    split: SplitData,
    risks: dict[str, np.ndarray],
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
    defaults: CostDefaults | None = None,
) -> list[CostResult]:
    """Every candidate at every one of its horizons; ``risks[name]`` is [n, H];
    ``defaults``: the cluster's costs (its cordon's hold and price included)."""
    costs = reference_costs(defaults)
    hold = defaults.cordon_hold_s if defaults is not None else 0.0
    out = []
    for name, model in candidates.items():
        for j, h in enumerate(model.horizons_s):
            r = risks[name][:, j]
            out.append(decision_cost(name, split, r, h, lead_min_s, costs, hold_s=hold))
    return out


def best_by_model(table: list[CostResult]) -> dict[str, CostResult]:
    """Each model's cheapest horizon (ties: the shorter horizon, listed first)."""
    best: dict[str, CostResult] = {}
    for r in table:
        if r.model not in best or r.cost_gpu_h_per_1000_dd < best[r.model].cost_gpu_h_per_1000_dd:
            best[r.model] = r
    return best


def champion_of(table: list[CostResult]) -> CostResult:
    """The cheapest (model, horizon) overall (ties: the first listed)."""
    if not table:
        raise ValueError("no candidate to choose a champion from")
    return min(table, key=lambda r: r.cost_gpu_h_per_1000_dd)


def challenger_of(table: list[CostResult], champion: str) -> CostResult | None:
    """The cheapest (model, horizon) of another kind than ``champion``: what the monitor
    scores in shadow beside it (tasks.health.shadow); None when there is no other kind."""
    others = [r for r in table if r.model != champion]
    return champion_of(others) if others else None
