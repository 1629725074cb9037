"""How much unplanned downtime predictive remediation saves: a discrete-event simulation.

A fleet of ``n_gpus`` runs gang jobs of ``gpus_per_job`` GPUs around the clock for
``horizon_days``. Device failures come from the twin's hazard model
(hardware.sim.hazard.fleet_schedule: the same rates, class mix, lemons and lead times the
twin and the fleet history use), one seed per simulated fleet-year. Every strategy sees
the same failures of a seed (a paired comparison); they differ only in what they know:

* reactive - periodic checkpoints every T (Young/Daly, T = sqrt(2 MTBF C), MTBF of one
  job); a failure costs the work since the last completed checkpoint plus the restart
  overhead R (detection, rescheduling, reload);
* predictors (threshold rules, the LSTM, an oracle) - an alarm before a failure of a class
  with precursors, caught with the predictor's per-class recall, makes the job
  checkpoint-and-stop (cost C) and move (planned cost M) before the device fails; a
  missed failure is handled as reactive; a false alarm (a Poisson rate per device-day)
  costs C + M for nothing. The oracle catches every failure that has a precursor and
  never cries wolf; abrupt failures (XID 79, SRAM) have none, so it cannot catch those.

All strategies checkpoint at the reactive Young/Daly interval, so the comparison isolates
what prediction changes (re-tuning T to the smaller unpredicted rate would trade less
checkpoint overhead for more work lost per miss: a better ETTR, a worse unplanned
downtime). Reported per strategy: effective training time ratio (ETTR = productive time /
wall time) and unplanned downtime (work lost + restart overhead of unpredicted
failures), as means over seeds with 95 % confidence intervals, and the reduction of
unplanned downtime against reactive with a paired bootstrap interval.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from gpuflow.hardware.sim.hazard import (
    ABRUPT_KINDS,
    DAY_S,
    PRECURSOR_KINDS,
    HazardModel,
    fleet_schedule,
    lead_time_s,
)
from gpuflow.tasks.health.decision import (
    DEFAULT_CHECKPOINT_SAVE_S,
    DEFAULT_RELAUNCH_S,
    DEFAULT_RESTART_S,
)

CLASSES = ("hbm", "thermal", "xid79", "ecc-uncorrectable")


@dataclass(frozen=True)
class FleetConfig:
    """The simulated fleet and its costs. Cost defaults are this project's assumptions
    within the published ranges (DESIGN.md section 4: restart 5-20 min per failure)."""

    n_gpus: int = 64
    gpus_per_job: int = 8
    horizon_days: float = 365.0
    # The decision rule's defaults (tasks.health.decision): one set of cost constants.
    checkpoint_cost_s: float = DEFAULT_CHECKPOINT_SAVE_S  # C: one synchronous checkpoint
    restart_overhead_s: float = DEFAULT_RESTART_S  # R: unplanned: detect, reschedule, reload
    migrate_cost_s: float = DEFAULT_RELAUNCH_S  # M: planned: reschedule on a leased device
    lead_min_s: float = 300.0  # an alarm later than this before the failure is too late
    hazard: HazardModel = field(default_factory=HazardModel)
    precursor_share: float | None = None  # None: the hazard model's class mix

    def __post_init__(self) -> None:
        if self.n_gpus < 1 or self.gpus_per_job < 1 or self.n_gpus % self.gpus_per_job:
            raise ValueError(
                f"n_gpus ({self.n_gpus}) must be a positive multiple of gpus_per_job "
                f"({self.gpus_per_job})"
            )
        for name in ("horizon_days", "checkpoint_cost_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("restart_overhead_s", "migrate_cost_s", "lead_min_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.precursor_share is not None and not 0.0 <= self.precursor_share <= 1.0:
            raise ValueError(f"precursor_share must be in [0, 1], got {self.precursor_share}")

    @property
    def jobs(self) -> int:
        return self.n_gpus // self.gpus_per_job

    def class_mix(self) -> dict[str, float]:
        """P(class | device fault), with the precursor share overridden when asked."""
        mix = self.hazard.class_mix()
        if self.precursor_share is None:
            return mix
        pre = sum(mix[k] for k in PRECURSOR_KINDS)
        ab = sum(mix[k] for k in ABRUPT_KINDS)
        p = self.precursor_share
        return {
            k: (p * mix[k] / pre if k in PRECURSOR_KINDS else (1 - p) * mix[k] / ab) for k in mix
        }

    def precursor_fraction(self) -> float:
        mix = self.class_mix()
        return sum(mix[k] for k in PRECURSOR_KINDS)

    def job_mtbf_s(self) -> float:
        rate = self.hazard.mean_device_rate_per_day() * self.gpus_per_job / DAY_S
        return math.inf if rate <= 0 else 1.0 / rate

    def young_daly_s(self) -> float:
        """T = sqrt(2 * MTBF * C) for one job (its MTBF: any of its GPUs failing)."""
        return math.sqrt(2.0 * self.job_mtbf_s() * self.checkpoint_cost_s)


@dataclass(frozen=True)
class Predictor:
    """What a strategy knows ahead of failures: per-class recall (alarms at least
    ``lead_min`` ahead), lead-time quantiles, and false alarms per 1000 device-days."""

    name: str
    recall: dict[str, float]
    false_alarms_per_1000_device_days: float = 0.0
    lead_quantiles_s: tuple[float, float, float] = (600.0, 1200.0, 1800.0)  # p10, p50, p90
    source: str = "assumed"

    def __post_init__(self) -> None:
        for k, v in self.recall.items():
            if k not in CLASSES or not 0.0 <= v <= 1.0:
                raise ValueError(f"{self.name}: recall[{k!r}] = {v} (classes {CLASSES}, [0, 1])")
        if self.false_alarms_per_1000_device_days < 0:
            raise ValueError(f"{self.name}: false alarm rate must be >= 0")

    def lead_s(self, rng: random.Random) -> float:
        """A lead time drawn from the quantiles (linear between p10, p50, p90, clamped)."""
        p10, p50, p90 = self.lead_quantiles_s
        u = rng.random()
        if u <= 0.1:
            return p10
        if u <= 0.5:
            return p10 + (p50 - p10) * (u - 0.1) / 0.4
        if u <= 0.9:
            return p50 + (p90 - p50) * (u - 0.5) / 0.4
        return p90

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


REACTIVE = Predictor("reactive", {}, 0.0, source="no prediction")


def oracle(cfg: FleetConfig | None = None) -> Predictor:
    """Every failure with a precursor, no false alarm (abrupt classes stay unseen)."""
    return Predictor(
        "oracle",
        {k: 1.0 for k in PRECURSOR_KINDS},
        0.0,
        (3600.0, 36 * 3600.0, 5 * DAY_S),
        "perfect on precursor classes",
    )


def false_alarm_rate_for(precision: float, recall: dict[str, float], cfg: FleetConfig) -> float:
    """False alarms per 1000 device-days that give ``precision`` at these recalls."""
    if not 0.0 < precision <= 1.0:
        raise ValueError(f"precision must be in (0, 1], got {precision}")
    mix = cfg.class_mix()
    caught_per_day = cfg.hazard.mean_device_rate_per_day() * sum(
        mix[k] * recall.get(k, 0.0) for k in mix
    )
    return 1000.0 * caught_per_day * (1.0 / precision - 1.0)


# -- one seed ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """One strategy on one simulated fleet (all jobs together)."""

    wall_s: float = 0.0
    productive_s: float = 0.0
    checkpoint_s: float = 0.0
    lost_work_s: float = 0.0
    restart_s: float = 0.0
    planned_s: float = 0.0
    failures: int = 0  # failures that hit a running job
    predicted: int = 0
    false_alarms: int = 0

    @property
    def unplanned_s(self) -> float:
        return self.lost_work_s + self.restart_s

    @property
    def ettr(self) -> float:
        return self.productive_s / self.wall_s if self.wall_s else float("nan")


@dataclass(frozen=True)
class _Failure:
    t_s: float
    kind: str
    lead_s: float  # the fault's own precursor lead (0 for abrupt)


def draw_failures(cfg: FleetConfig, seed: int) -> list[list[_Failure]]:
    """Failures per job (time order) of one simulated fleet."""
    until = cfg.horizon_days * DAY_S
    _lemons, schedule = fleet_schedule(seed, cfg.n_gpus, cfg.hazard, until)
    mix = cfg.class_mix()
    relabel = cfg.precursor_share is not None
    rng = random.Random(f"gpuflow-downtime:{seed}:classes")
    per_job: list[list[_Failure]] = [[] for _ in range(cfg.jobs)]
    for ordinal, draws in schedule.items():
        for d in draws:
            kind, lead = d.kind, d.lead_s
            if relabel:  # the same failure times, classes drawn from the overridden mix
                kind = rng.choices(list(mix), weights=list(mix.values()))[0]
                lead = lead_time_s(kind, rng)
            t = d.failure_s  # when it fails is the hazard model's; only its class changes
            if t < until:
                per_job[ordinal // cfg.gpus_per_job].append(_Failure(t, kind, lead))
    for events in per_job:
        events.sort(key=lambda f: f.t_s)
    return per_job


def _cycles(d: float, cycle: float) -> tuple[int, float]:
    """Whole checkpoint cycles in ``d`` and what is left; no failures: no checkpoints."""
    if not math.isfinite(cycle):
        return 0, d
    k = math.floor(d / cycle)
    return k, d - k * cycle


def _run_job(
    cfg: FleetConfig,
    failures: list[_Failure],
    predictor: Predictor,
    t_ckpt: float,
    rng: random.Random,
    out: Outcome,
) -> None:
    """One job over the horizon: cycles of T work + C checkpoint, interrupted by events."""
    horizon = cfg.horizon_days * DAY_S
    C, R, M = cfg.checkpoint_cost_s, cfg.restart_overhead_s, cfg.migrate_cost_s
    cycle = t_ckpt + C
    events: list[tuple[float, str]] = []
    for f in failures:
        caught = rng.random() < predictor.recall.get(f.kind, 0.0)
        lead = min(predictor.lead_s(rng), f.lead_s) if caught else 0.0
        if caught and lead >= cfg.lead_min_s:
            events.append((f.t_s - lead, "alarm"))  # the failure then hits an idle device
        else:
            events.append((f.t_s, "failure"))
    fa_rate = predictor.false_alarms_per_1000_device_days / 1000.0 * cfg.gpus_per_job / DAY_S
    t = rng.expovariate(fa_rate) if fa_rate > 0 else math.inf
    while t < horizon:
        events.append((t, "false-alarm"))
        t += rng.expovariate(fa_rate)
    events.sort()

    start = 0.0  # the job runs from here, a fresh cycle (it just (re)started)
    for te, kind in events:
        if te < start:
            continue  # the job was restarting: nothing of it ran on that device
        d = te - start
        k, r = _cycles(d, cycle)
        out.productive_s += k * t_ckpt if k else 0.0  # (k = 0 when T is infinite)
        out.checkpoint_s += k * C
        if kind == "failure":
            out.failures += 1
            out.lost_work_s += r  # work (and any half-written checkpoint) since the last one
            out.restart_s += R
            start = te + R
        else:
            if kind == "alarm":
                out.predicted += 1
                out.failures += 1
            else:
                out.false_alarms += 1
            if r < t_ckpt or not math.isfinite(cycle):  # checkpoint-and-stop now: work kept
                out.productive_s += r
                out.checkpoint_s += C
                start = te + C + M
            else:  # a periodic checkpoint is being written: let it finish
                out.productive_s += t_ckpt
                out.checkpoint_s += C
                start = te + (cycle - r) + M
            out.planned_s += M
    if start < horizon:  # the horizon is a cut, not a failure: work done so far counts
        d = horizon - start
        k, r = _cycles(d, cycle)
        out.productive_s += (k * t_ckpt if k else 0.0) + min(r, t_ckpt)
        out.checkpoint_s += k * C + max(r - t_ckpt, 0.0)
    out.wall_s += horizon


def simulate_seed(cfg: FleetConfig, predictors: list[Predictor], seed: int) -> dict[str, Outcome]:
    """Every strategy on the same failures of one simulated fleet."""
    per_job = draw_failures(cfg, seed)
    t_ckpt = cfg.young_daly_s()
    results = {}
    for p in predictors:
        out = Outcome()
        for j, failures in enumerate(per_job):
            rng = random.Random(f"gpuflow-downtime:{seed}:{p.name}:{j}")
            _run_job(cfg, failures, p, t_ckpt, rng, out)
        results[p.name] = out
    return results


# -- many seeds -------------------------------------------------------------------------------


def mean_ci(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, lo, hi): a normal 95 % interval of the mean over seeds."""
    v = np.asarray(values, dtype=float)
    m = float(v.mean())
    if len(v) < 2:
        return m, m, m
    half = 1.96 * float(v.std(ddof=1)) / math.sqrt(len(v))
    return m, m - half, m + half


def reduction_ci(
    base: np.ndarray, other: np.ndarray, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """1 - mean(other) / mean(base) with a paired bootstrap 95 % interval over seeds."""
    base, other = np.asarray(base, float), np.asarray(other, float)
    if base.sum() <= 0:
        return float("nan"), float("nan"), float("nan")
    point = 1.0 - other.mean() / base.mean()
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(base), size=(resamples, len(base)))
    b, o = base[idx].mean(axis=1), other[idx].mean(axis=1)
    ok = b > 0
    ratios = 1.0 - o[ok] / b[ok]
    return float(point), float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def simulate(
    cfg: FleetConfig, predictors: list[Predictor], seeds: int, first_seed: int = 1
) -> dict[str, dict[str, np.ndarray]]:
    """Per strategy, per metric, one value per seed."""
    names = [p.name for p in predictors]
    if len(set(names)) != len(names):
        raise ValueError(f"strategy names must be unique, got {names}")
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    keys = (
        "ettr",
        "unplanned_h",
        "lost_work_h",
        "restart_h",
        "planned_h",
        "checkpoint_h",
        "failures",
        "predicted",
        "false_alarms",
    )
    out = {n: {k: np.zeros(seeds) for k in keys} for n in names}
    for i in range(seeds):
        for name, o in simulate_seed(cfg, predictors, first_seed + i).items():
            row = out[name]
            row["ettr"][i] = o.ettr
            row["unplanned_h"][i] = o.unplanned_s / 3600.0
            row["lost_work_h"][i] = o.lost_work_s / 3600.0
            row["restart_h"][i] = o.restart_s / 3600.0
            row["planned_h"][i] = o.planned_s / 3600.0
            row["checkpoint_h"][i] = o.checkpoint_s / 3600.0
            row["failures"][i] = o.failures
            row["predicted"][i] = o.predicted
            row["false_alarms"][i] = o.false_alarms
    return out


def summarize(
    per_seed: dict[str, dict[str, np.ndarray]], baseline: str = "reactive"
) -> dict[str, dict[str, float]]:
    """Means with 95 % intervals, and the reduction of unplanned downtime vs ``baseline``."""
    base = per_seed[baseline]["unplanned_h"]
    table: dict[str, dict[str, float]] = {}
    for name, m in per_seed.items():
        row: dict[str, float] = {}
        for key in ("ettr", "unplanned_h", "planned_h", "checkpoint_h"):
            row[key], row[f"{key}_lo"], row[f"{key}_hi"] = mean_ci(m[key])
        for key in ("failures", "predicted", "false_alarms"):
            row[key] = float(np.mean(m[key]))
        if name != baseline:
            row["reduction"], row["reduction_lo"], row["reduction_hi"] = reduction_ci(
                base, m["unplanned_h"]
            )
            # What one fleet-year alone would show: the spread of per-seed reductions.
            ok = base > 0
            single = 1.0 - m["unplanned_h"][ok] / base[ok]
            if len(single):
                row["single_year_p2_5"] = float(np.percentile(single, 2.5))
                row["single_year_p97_5"] = float(np.percentile(single, 97.5))
        table[name] = row
    return table
