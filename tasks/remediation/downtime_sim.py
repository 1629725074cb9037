"""What the two downtime studies share: the cost of one interruption, fleet figures, and the
bootstrap behind their confidence intervals.

The studies (tasks.remediation.alarm_stream: the health models' actual alarms on held-out
twin histories; tasks.remediation.trace_replay: the InfiniteHBD fault sequence) account a
gang job's time the same way:

* every job checkpoints every T = sqrt(2 MTBF C) (Young/Daly, MTBF of the whole gang), so
  a share C / (T + C) of its time goes to checkpoints whatever happens;
* an unpredicted failure costs the work since the last checkpoint, (T + C) / 2 on average
  (the failure falls at a uniform phase of the cycle), plus the restart R (and any wait
  for a node, in the replay): **unplanned** time;
* an alarm acted on (true or false) costs an on-demand checkpoint C plus a planned move M:
  **planned** time; the failure it foresaw then hits an idle device.

All in seconds of the gang (every GPU of the job waits); fleet figures are GPU-hours per
1,000 device-days (a device is one GPU) and ETTR = (1 - C / (T + C)) (1 - lost / GPU-time).
The cost constants are the decision rule's (tasks.health.decision, DESIGN.md section 4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from gpuflow.tasks.health.decision import (
    DAY_S,
    DEFAULT_CHECKPOINT_SAVE_S,
    DEFAULT_RELAUNCH_S,
    DEFAULT_RESTART_S,
    CostDefaults,
    check_seconds,
)

SEED_CLAIM = 0.67  # "the health system cut unplanned downtime by 67 %" (DESIGN.md section 10)


@dataclass(frozen=True)
class DowntimeCosts:
    """One gang job's costs, seconds of the gang's time (defaults: tasks.health.decision)."""

    gang_gpus: int = 8
    checkpoint_s: float = DEFAULT_CHECKPOINT_SAVE_S  # C
    restart_s: float = DEFAULT_RESTART_S  # R: detect, reschedule, reload
    migrate_s: float = DEFAULT_RELAUNCH_S  # M: a planned move

    def __post_init__(self) -> None:
        g = self.gang_gpus
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise ValueError(f"gang_gpus must be an integer >= 1, got {g!r}")
        for name in ("checkpoint_s", "restart_s", "migrate_s"):
            check_seconds(name, getattr(self, name))
        if self.checkpoint_s <= 0:
            raise ValueError(f"checkpoint_s must be > 0, got {self.checkpoint_s}")

    def checkpoint_every_s(self, failures_per_gpu_day: float) -> float:
        """Young/Daly T for this gang at this failure rate (no failures: never)."""
        if not failures_per_gpu_day >= 0:
            raise ValueError(f"failures_per_gpu_day must be >= 0, got {failures_per_gpu_day}")
        if failures_per_gpu_day == 0:
            return math.inf
        rule = CostDefaults(
            checkpoint_save_s=self.checkpoint_s,
            restart_s=self.restart_s,
            relaunch_s=self.migrate_s,
            gpu_failures_per_day=failures_per_gpu_day,
        )
        return rule.young_daly_s(self.gang_gpus)

    def checkpoint_share(self, every_s: float) -> float:
        return 0.0 if math.isinf(every_s) else self.checkpoint_s / (every_s + self.checkpoint_s)

    def lost_work_s(self, every_s: float) -> float:
        """Mean work lost at a failure: since the last checkpoint, a uniform phase."""
        return (every_s + self.checkpoint_s) / 2.0

    def unplanned_gpu_s(self, every_s: float, wait_s: float = 0.0) -> float:
        """One unpredicted failure of a running job: lost work + wait + R, whole gang."""
        return self.gang_gpus * (self.lost_work_s(every_s) + wait_s + self.restart_s)

    def planned_gpu_s(self) -> float:
        """One alarm acted on: checkpoint now and move, whole gang."""
        return self.gang_gpus * (self.checkpoint_s + self.migrate_s)


def fleet_figures(
    unplanned_gpu_s: np.ndarray | float,
    planned_gpu_s: np.ndarray | float,
    device_days: np.ndarray | float,
    checkpoint_share: float,
) -> dict[str, np.ndarray]:
    """Unplanned and planned GPU-h per 1,000 device-days and ETTR (arrays broadcast)."""
    u, p, dd = (np.asarray(x, dtype=float) for x in (unplanned_gpu_s, planned_gpu_s, device_days))
    return {
        "unplanned_gpu_h_per_1000_dd": u / 3600.0 / dd * 1000.0,
        "planned_gpu_h_per_1000_dd": p / 3600.0 / dd * 1000.0,
        "ettr": (1.0 - checkpoint_share) * (1.0 - (u + p) / (dd * DAY_S)),
    }


def resample_totals(
    groups: Sequence[np.ndarray], resamples: int = 2000, seed: int = 0
) -> np.ndarray:
    """Bootstrap totals (resamples x columns) of per-unit rows (units x columns), grouped
    (one group per history seed): groups drawn with replacement, then units within each
    drawn group with replacement; one group: units only. The same draws serve every
    column, so figures computed from them are paired."""
    if not groups or any(g.ndim != 2 or len(g) == 0 for g in groups):
        raise ValueError("resample_totals needs >= 1 group of >= 1 unit rows (2-D arrays)")
    rng = np.random.default_rng(seed)
    per_group = []
    for g in groups:
        n = len(g)
        counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)
        per_group.append(counts @ g)  # (resamples, columns)
    s = len(groups)
    picks = (
        np.ones((resamples, 1), dtype=np.int64)
        if s == 1
        else rng.multinomial(s, np.full(s, 1.0 / s), size=resamples)
    )
    return sum(picks[:, i : i + 1] * per_group[i] for i in range(s))


def summarize(
    point: Mapping[str, Mapping[str, float]],
    samples: Mapping[str, Mapping[str, np.ndarray]],
    baseline: str = "reactive",
    key: str = "unplanned_gpu_h_per_1000_dd",
    level: float = 0.95,
) -> dict[str, dict[str, float]]:
    """Per strategy: each figure with its percentile interval, and the reduction of ``key``
    against ``baseline`` with a paired interval (the same resample for both)."""
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    base_pt, base_s = point[baseline][key], samples[baseline][key]
    table: dict[str, dict[str, float]] = {}
    for name, figs in point.items():
        row: dict[str, float] = {}
        for fig, value in figs.items():
            row[fig] = float(value)
            lo, hi = percentile_interval(samples[name].get(fig), q)
            row[f"{fig}_lo"], row[f"{fig}_hi"] = float(lo), float(hi)
        if name != baseline:
            row["reduction"] = 1.0 - figs[key] / base_pt if base_pt > 0 else math.nan
            with np.errstate(divide="ignore", invalid="ignore"):
                red = 1.0 - samples[name][key] / base_s
            lo, hi = percentile_interval(red, q)
            row["reduction_lo"], row["reduction_hi"] = float(lo), float(hi)
        table[name] = row
    return table


def percentile_interval(values: np.ndarray | None, q: tuple[float, float]) -> tuple[float, float]:
    """Percentiles of the finite values (NaN when none: e.g. a recall with no failures)."""
    v = np.asarray(values if values is not None else [], dtype=float)
    v = v[np.isfinite(v)]
    return (
        (float(np.percentile(v, q[0])), float(np.percentile(v, q[1])))
        if len(v)
        else (math.nan, math.nan)
    )


def claim_verdict(
    table: Mapping[str, Mapping[str, float]],
    names: Sequence[str] | None = None,
    claim: float = SEED_CLAIM,
) -> str:
    """Each strategy's reduction against the claimed one: reached or not, and whether its
    interval holds the claim."""
    parts = []
    for n in names if names is not None else list(table):
        r = table.get(n, {})
        if "reduction" not in r or math.isnan(r["reduction"]):
            continue
        v, lo, hi = r["reduction"], r["reduction_lo"], r["reduction_hi"]
        reach = "reaches" if v >= claim else "short of"
        held = "CI holds it" if lo <= claim <= hi else "CI excludes it"
        parts.append(f"{n} {v:.1%} [{lo:.1%}, {hi:.1%}]: {reach} {claim:.0%}, {held}")
    return "; ".join(parts) or "no strategy to compare"
