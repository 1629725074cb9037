"""Replay a measured power-limit trace: the optimizer against its baselines, per workload.

For each workload of a Zeus trace (tasks.energy.traces) every method picks a power limit;
the replay answers a probe with the trace's measurement at that limit, so the optimizer
sees only what it asks for. Methods:

* ``optimizer``: tasks.energy.optimizer.SettingSearch, from a few probes;
* ``max``: the highest limit, what a device runs by default;
* ``seed-rule``: the seed's three-level rule on NVML utilization (> 0.8: max clock, < 0.3:
  1.2 GHz, else the base clock). The traces record no utilization; a training epoch keeps a
  kernel running nearly all the time, which is what NVML's utilization counts (memory-bound
  kernels included), so the replay feeds it ``TRAINING_UTILIZATION`` and the rule keeps the
  highest limit: its saving on these traces is 0 by construction, and that is the finding;
* ``profile-all``: Zeus's own approach, every limit measured once, the best taken;
* the oracle: the best limit knowing the whole trace; on a replay it is what profile-all
  picks, with no probes. Each row carries the oracle's saving beside its own.

Energy saving is 1 - E(choice) / E(highest limit), per epoch; slowdown is T(choice) /
T(highest limit) - 1. "In total" (the summary's ``capture``) is the energy saved over all
workloads divided by the energy the oracle saves over all workloads; ``mean_capture``, the
mean saving over the oracle's mean saving (every workload weighs alike), is beside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuflow.tasks.energy.optimizer import (
    DEFAULT_MARGIN,
    Measurement,
    Objective,
    SettingSearch,
)
from gpuflow.tasks.energy.traces import TracePoint, Workload, read_trace

OPTIMIZER = "optimizer"
MAX = "max"
SEED_RULE = "seed-rule"
PROFILE_ALL = "profile-all"
METHODS = (OPTIMIZER, SEED_RULE, PROFILE_ALL, MAX)
TRAINING_UTILIZATION = 0.95  # see the module docstring
SEED_RULE_LOW_CLOCK_MHZ = 1200


def seed_rule(utilization_ratio: float) -> str:
    """The seed's three-level DVFS rule: 'max', 'low' (1.2 GHz) or 'base'."""
    if utilization_ratio > 0.8:
        return "max"
    if utilization_ratio < 0.3:
        return "low"
    return "base"


@dataclass(frozen=True)
class Row:
    workload: str
    method: str
    power_limit_w: float
    energy_saving: float
    slowdown: float
    probes: int
    oracle_energy_saving: float
    oracle_power_limit_w: float
    within_bound: bool
    limits: int  # how many limits the trace measured for this workload
    energy_j: float  # per epoch at the choice
    oracle_energy_j: float
    max_energy_j: float
    cost_saving: float  # Zeus's cost (eta mode); equals energy_saving's role otherwise

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Summary:
    method: str
    workloads: int
    within_bound: int
    capture: float  # energy saved / the oracle's, over all workloads
    mean_capture: float  # mean saving / the oracle's mean saving (workloads weigh alike)
    mean_energy_saving: float
    mean_probes: float
    max_probes: int
    mean_limits: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _measurement(p: TracePoint) -> Measurement:
    return Measurement(p.power_limit_w, p.time_per_epoch_s, p.energy_j)


def _zeus_cost(p: TracePoint, eta: float, p_max_w: float) -> float:
    return eta * p.energy_j + (1.0 - eta) * p_max_w * p.time_per_epoch_s


def _best(points: Sequence[TracePoint], objective: Objective) -> TracePoint:
    top = max(points)
    if objective.slowdown is not None:
        bound = (1.0 + objective.slowdown) * top.time_per_epoch_s
        ok = [p for p in points if p.time_per_epoch_s <= bound]
        return min(ok, key=lambda p: (p.energy_j, -p.power_limit_w))
    eta = objective.eta or 0.0
    return min(points, key=lambda p: (_zeus_cost(p, eta, top.power_limit_w), -p.power_limit_w))


def replay_workload(
    w: Workload,
    points: Sequence[TracePoint],
    objective: Objective,
    margin: float = DEFAULT_MARGIN,
) -> list[Row]:
    """Every method's row for one workload."""
    by_limit = {p.power_limit_w: p for p in points}
    top = max(points)
    oracle = _best(points, objective)
    search = SettingSearch(list(by_limit), objective, margin=margin)
    while (limit := search.next_probe()) is not None:
        search.tell(_measurement(by_limit[limit]))
    picked = by_limit[search.choice().chosen.setting]
    rule = seed_rule(TRAINING_UTILIZATION)
    if rule != "max":  # not reached on training traces; the rule's clocks have no limit here
        raise NotImplementedError(f"the seed rule says {rule!r}; a trace has no clocks")
    choices = {
        OPTIMIZER: (picked, len(search.probes)),
        SEED_RULE: (top, 0),
        PROFILE_ALL: (oracle, len(points)),
        MAX: (top, 0),
    }
    eta = objective.eta
    rows = []
    for method, (p, probes) in choices.items():
        if eta is None:
            cost_saving = 1.0 - p.energy_j / top.energy_j
        else:
            c_top = _zeus_cost(top, eta, top.power_limit_w)
            cost_saving = 1.0 - _zeus_cost(p, eta, top.power_limit_w) / c_top
        rows.append(
            Row(
                workload=w.name,
                method=method,
                power_limit_w=p.power_limit_w,
                energy_saving=1.0 - p.energy_j / top.energy_j,
                slowdown=p.time_per_epoch_s / top.time_per_epoch_s - 1.0,
                probes=probes,
                oracle_energy_saving=1.0 - oracle.energy_j / top.energy_j,
                oracle_power_limit_w=oracle.power_limit_w,
                within_bound=objective.slowdown is None
                or p.time_per_epoch_s <= (1.0 + objective.slowdown) * top.time_per_epoch_s,
                limits=len(points),
                energy_j=p.energy_j,
                oracle_energy_j=oracle.energy_j,
                max_energy_j=top.energy_j,
                cost_saving=cost_saving,
            )
        )
    return rows


def evaluate_trace(
    path: str | Path,
    objective: Objective | None = None,
    margin: float = DEFAULT_MARGIN,
    progress: Callable[[int, int], None] | None = None,
) -> list[Row]:
    """Rows for every workload of the trace and every method (METHODS order)."""
    objective = objective or Objective()
    trace = read_trace(path)
    rows: list[Row] = []
    for i, (w, points) in enumerate(trace.items(), start=1):
        rows += replay_workload(w, points, objective, margin)
        if progress:
            progress(i, len(trace))
    return rows


def summarise(rows: Sequence[Row]) -> list[Summary]:
    """One summary per method, in METHODS order."""
    out = []
    for method in METHODS:
        mine = [r for r in rows if r.method == method]
        if not mine:
            continue
        saved = sum(r.max_energy_j - r.energy_j for r in mine)
        oracle_saved = sum(r.max_energy_j - r.oracle_energy_j for r in mine)
        mean_saving = sum(r.energy_saving for r in mine) / len(mine)
        oracle_mean = sum(r.oracle_energy_saving for r in mine) / len(mine)
        out.append(
            Summary(
                method=method,
                workloads=len(mine),
                within_bound=sum(r.within_bound for r in mine),
                capture=saved / oracle_saved if oracle_saved > 0 else math.nan,
                mean_capture=mean_saving / oracle_mean if oracle_mean > 0 else math.nan,
                mean_energy_saving=mean_saving,
                mean_probes=sum(r.probes for r in mine) / len(mine),
                max_probes=max(r.probes for r in mine),
                mean_limits=sum(r.limits for r in mine) / len(mine),
            )
        )
    return out
