"""Confidence intervals for the health figures (issue 15, item 4). Pure functions.

Every figure is computed from per-device totals, so that one bootstrap serves them all:
for each history seed, the test split's devices (rows) carry additive columns (failures
and detections per class, alarm episodes, the calibration sums of their windows); the
bootstrap (tasks.remediation.downtime_sim.resample_totals, shared with the downtime study)
draws history seeds with replacement, then devices within each drawn seed with
replacement, and recomputes every figure from the drawn totals. The same draws serve every
model and figure, so differences between models are paired. Intervals: the 2.5 and 97.5
percentiles of the resampled figure.

Figures, per model (at the threshold it is run at, on its horizon):

* ``recall_<class>`` and ``recall``: failures detected (tasks.health.evaluate's rule) /
  failures, per class and over all;
* ``precision``: true alarm episodes / all alarm episodes (background ones by weight);
* ``fa_per_1000_dd``: false alarm episodes (by weight) per 1,000 device-days;
* ``net_saved_gpu_h_per_1000_dd``: **net GPU-hours saved per 1,000 device-days** for the
  reference job of tasks.health.champion (a gang of G = 8 GPUs checkpointing at its
  Young/Daly period T; costs of tasks.health.decision: C checkpoint, M relaunch, R
  unplanned restart)::

      saved = detected failures x G x (T/2 + R)  -  alarm episodes x G x (C + M)

  the lost work (T/2 on average) and unplanned restart that true alarms avoid, minus the
  checkpoint + migration every alarm (true or false) costs; 0 for doing nothing,
  negative when the alarms cost more than they save. It equals champion.decision_cost's
  ``saved`` exactly;
* ``brier`` and ``ece``: Brier score and expected calibration error of the risks against
  "fails within the horizon" on every window, population-weighted, over
  tasks.health.calibration's bins (the same definitions as calibration.py).

Each figure carries ``n``, the count of events it rests on (failures for recall, net
saved, Brier and ECE; the sampled alarm episodes for precision; the sampled false ones
for the false-alarm rate) and ``few`` when n < ``MIN_EVENTS`` (20): printed as "n=7 <20".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gpuflow.tasks.health.calibration import BIN_EDGES
from gpuflow.tasks.health.decision import CostDefaults
from gpuflow.tasks.health.evaluate import CLASSES, AlarmEpisodes
from gpuflow.tasks.remediation.downtime_sim import percentile_interval, resample_totals

MIN_EVENTS = 20
LEVEL = 0.95
_BINS = len(BIN_EDGES) - 1
_PER_MODEL = (
    *(f"detected:{c}" for c in CLASSES),
    "true_alarms",
    "false_alarms",
    "alarms_sampled",
    "false_sampled",
    "w",
    "wse",
    *(f"bin_w:{k}" for k in range(_BINS)),
    *(f"bin_wp:{k}" for k in range(_BINS)),
    *(f"bin_wy:{k}" for k in range(_BINS)),
)
_SHARED = ("device_days", *(f"failures:{c}" for c in CLASSES))


@dataclass(frozen=True)
class ModelRun:
    """What one model did on one split: its alarm episodes and its per-window risks with
    the labels they are judged against."""

    episodes: AlarmEpisodes
    risk: np.ndarray  # per window
    label: np.ndarray  # per window: fails within the model's horizon (0/1)


@dataclass(frozen=True)
class SplitFacts:
    """The split as the bootstrap sees it: its devices, device-days, failures (device
    ordinal and class) and, per window, its device and population weight."""

    devices: np.ndarray
    device_days: float
    fail_ordinal: np.ndarray
    fail_kind: np.ndarray
    window_ordinal: np.ndarray
    window_weight: np.ndarray


@dataclass(frozen=True)
class ActCosts:
    """GPU-seconds per alarm episode (G x (C + M)), per missed failure (G x (T/2 + R)) and
    per false alarm's cordon (K, tasks.health.decision)."""

    per_alarm_gpu_s: float
    per_failure_gpu_s: float
    per_false_alarm_gpu_s: float = 0.0

    @classmethod
    def reference(cls, defaults: CostDefaults | None = None) -> ActCosts:
        """The reference job of tasks.health.champion, priced as decision_cost prices it
        (with the defaults' cordon cost)."""
        from gpuflow.tasks.health.champion import reference_costs

        costs = reference_costs(defaults)
        job = costs.jobs[0]
        return cls(
            job.gang_gpus * (job.checkpoint_save_s + job.relaunch_s),
            job.gang_gpus * ((job.checkpoint_every_s or 0.0) / 2.0 + job.restart_s),
            costs.cordon_gpu_s,
        )


def columns(models: Sequence[str]) -> list[str]:
    return [*_SHARED, *(f"{m}:{k}" for m in models for k in _PER_MODEL)]


def device_rows(facts: SplitFacts, runs: Mapping[str, ModelRun]) -> np.ndarray:
    """Per device of the split (rows, ``facts.devices`` order) the additive columns of
    ``columns(list(runs))``. Device-days are shared evenly among the devices."""
    cols = columns(list(runs))
    at = {c: i for i, c in enumerate(cols)}
    row_of = {int(o): i for i, o in enumerate(facts.devices)}

    def rows(ordinals: np.ndarray) -> np.ndarray:
        try:
            return np.array([row_of[int(o)] for o in ordinals], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"device {exc.args[0]} is not in the split's devices") from None

    out = np.zeros((len(facts.devices), len(cols)))
    out[:, at["device_days"]] = facts.device_days / max(len(facts.devices), 1)
    f_rows = rows(facts.fail_ordinal)
    w_rows = rows(facts.window_ordinal)
    w = np.asarray(facts.window_weight, dtype=np.float64)
    for c in CLASSES:
        np.add.at(out[:, at[f"failures:{c}"]], f_rows[facts.fail_kind == c], 1.0)
    for m, run in runs.items():
        ep = run.episodes
        for c in CLASSES:
            hit = ep.detected & (facts.fail_kind == c)
            np.add.at(out[:, at[f"{m}:detected:{c}"]], f_rows[hit], 1.0)
        e_rows = rows(ep.ordinal)
        true_fg, false = ep.true_moves, ep.false_moves  # acted on (evaluate.py)
        np.add.at(out[:, at[f"{m}:true_alarms"]], e_rows[true_fg], 1.0)
        np.add.at(out[:, at[f"{m}:false_alarms"]], e_rows[false], ep.weight[false])
        np.add.at(out[:, at[f"{m}:alarms_sampled"]], e_rows[true_fg | false], 1.0)
        np.add.at(out[:, at[f"{m}:false_sampled"]], e_rows[false], 1.0)
        p = np.asarray(run.risk, dtype=np.float64)
        y = np.asarray(run.label, dtype=np.float64)
        np.add.at(out[:, at[f"{m}:w"]], w_rows, w)
        np.add.at(out[:, at[f"{m}:wse"]], w_rows, w * (p - y) ** 2)
        b = np.clip(np.searchsorted(np.asarray(BIN_EDGES), p, side="right") - 1, 0, _BINS - 1)
        for k in range(_BINS):
            s = b == k
            np.add.at(out[:, at[f"{m}:bin_w:{k}"]], w_rows[s], w[s])
            np.add.at(out[:, at[f"{m}:bin_wp:{k}"]], w_rows[s], w[s] * p[s])
            np.add.at(out[:, at[f"{m}:bin_wy:{k}"]], w_rows[s], w[s] * y[s])
    return out


def figures(
    totals: np.ndarray, cols: Sequence[str], model: str, costs: ActCosts
) -> dict[str, np.ndarray]:
    """A model's figures from column totals: one row (the point) or one per resample."""
    at = {c: i for i, c in enumerate(cols)}

    def col(name: str) -> np.ndarray:
        return totals[..., at[name]]

    dd = col("device_days")
    out: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for c in CLASSES:
            out[f"recall_{c}"] = col(f"{model}:detected:{c}") / col(f"failures:{c}")
        detected = sum(col(f"{model}:detected:{c}") for c in CLASSES)
        failures = sum(col(f"failures:{c}") for c in CLASSES)
        out["recall"] = detected / failures
        alarms = col(f"{model}:true_alarms") + col(f"{model}:false_alarms")
        out["precision"] = col(f"{model}:true_alarms") / alarms
        out["fa_per_1000_dd"] = col(f"{model}:false_alarms") / dd * 1000.0
        saved_s = (
            detected * costs.per_failure_gpu_s
            - alarms * costs.per_alarm_gpu_s
            - col(f"{model}:false_alarms") * costs.per_false_alarm_gpu_s
        )
        out["net_saved_gpu_h_per_1000_dd"] = saved_s / 3600.0 / dd * 1000.0
        w = col(f"{model}:w")
        out["brier"] = col(f"{model}:wse") / w
        out["ece"] = (
            sum(
                np.abs(col(f"{model}:bin_wp:{k}") - col(f"{model}:bin_wy:{k}"))
                for k in range(_BINS)
            )
            / w
        )
    return out


def event_counts(point: np.ndarray, cols: Sequence[str], model: str) -> dict[str, int]:
    """The events each figure rests on (see the module doc)."""
    at = {c: i for i, c in enumerate(cols)}
    fails = {c: int(round(point[at[f"failures:{c}"]])) for c in CLASSES}
    total = sum(fails.values())
    return {
        **{f"recall_{c}": n for c, n in fails.items()},
        "recall": total,
        "precision": int(round(point[at[f"{model}:alarms_sampled"]])),
        "fa_per_1000_dd": int(round(point[at[f"{model}:false_sampled"]])),
        "net_saved_gpu_h_per_1000_dd": total,
        "brier": total,
        "ece": total,
    }


def interval(values: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """Central ``level`` percentile interval of the finite values (NaN, NaN when none)."""
    q = 100 * (1 - level) / 2
    return percentile_interval(values, (q, 100 - q))


@dataclass
class Study:
    """Per model, per figure: {mean, lo, hi, n, few}; ``boot`` keeps the resampled figures
    (paired across models) for differences."""

    table: dict[str, dict[str, dict[str, Any]]]
    boot: dict[str, dict[str, np.ndarray]]
    seeds: int
    devices: int
    device_days: float
    failures: int
    resamples: int


def study(
    seed_rows: Sequence[np.ndarray],
    models: Sequence[str],
    costs: ActCosts | None = None,
    resamples: int = 1000,
    boot_seed: int = 0,
) -> Study:
    """Every model's figures pooled over the seeds' rows (``device_rows`` of each seed,
    the same models in the same order), with bootstrap intervals."""
    if not seed_rows:
        raise ValueError("the study needs at least one history seed")
    costs = costs or ActCosts.reference()
    cols = columns(models)
    if any(r.ndim != 2 or r.shape[1] != len(cols) for r in seed_rows):
        raise ValueError(f"every seed's rows need {len(cols)} columns ({models})")
    point = sum(r.sum(axis=0) for r in seed_rows)
    boot = resample_totals(list(seed_rows), resamples, boot_seed)
    table: dict[str, dict[str, dict[str, Any]]] = {}
    samples: dict[str, dict[str, np.ndarray]] = {}
    for m in models:
        pt = figures(point, cols, m, costs)
        samples[m] = figures(boot, cols, m, costs)
        n = event_counts(point, cols, m)
        table[m] = {}
        for fig, value in pt.items():
            lo, hi = interval(samples[m][fig])
            table[m][fig] = {
                "mean": float(value),
                "lo": lo,
                "hi": hi,
                "n": n[fig],
                "few": n[fig] < MIN_EVENTS,
            }
    at = {c: i for i, c in enumerate(cols)}
    return Study(
        table=table,
        boot=samples,
        seeds=len(seed_rows),
        devices=sum(len(r) for r in seed_rows),
        device_days=float(point[at["device_days"]]),
        failures=int(round(sum(point[at[f"failures:{c}"]] for c in CLASSES))),
        resamples=resamples,
    )


def fmt(cell: Mapping[str, Any], spec: str = "{:.2f}") -> str:
    """'0.61 [0.52, 0.70]', with ' n=7 <20' when it rests on fewer than 20 events."""
    if not math.isfinite(cell["mean"]):
        text = "n/a"
    else:
        lo, hi = (spec.format(cell[k]) if math.isfinite(cell[k]) else "n/a" for k in ("lo", "hi"))
        text = f"{spec.format(cell['mean'])} [{lo}, {hi}]"
    return f"{text} n={cell['n']} <{MIN_EVENTS}" if cell["few"] else text


def difference(s: Study, a: str, b: str, fig: str) -> dict[str, float]:
    """``a`` minus ``b`` on ``fig``: point and paired bootstrap interval."""
    lo, hi = interval(s.boot[a][fig] - s.boot[b][fig])
    return {"mean": s.table[a][fig]["mean"] - s.table[b][fig]["mean"], "lo": lo, "hi": hi}


def verdict(diff: Mapping[str, float]) -> str:
    """'better' when the interval of (learned - rules) is above 0, 'worse' when below,
    else 'no difference'."""
    if diff["lo"] > 0:
        return "better"
    if diff["hi"] < 0:
        return "worse"
    return "no difference"


def crossover(settings: Sequence[tuple[str, Mapping[str, Mapping[str, float]]]]) -> str:
    """The sweep's finding from ``[(setting label, {learned model: difference vs rules})]``
    in order quiet -> noisy: per model, where it beats the rules and where not, and the
    first setting at which its verdict changes (the crossover), if any."""
    if not settings:
        return "no setting"
    models = list(settings[0][1])
    parts = []
    for m in models:
        v = [(label, verdict(d[m])) for label, d in settings if m in d]
        changes = [
            f"{v[i - 1][1]} at {v[i - 1][0]} -> {v[i][1]} at {v[i][0]}"
            for i in range(1, len(v))
            if v[i][1] != v[i - 1][1]
        ]
        by = "; ".join(f"{label}: {x}" for label, x in v)
        if changes:
            parts.append(f"{m} vs rules: crossover {changes[0]} ({by})")
        else:
            parts.append(f"{m} vs rules: no crossover, {v[0][1]} at every setting ({by})")
    return ". ".join(parts)


def split_facts(split: Any, devices: np.ndarray) -> SplitFacts:
    """A SplitData (tasks.health.history) as the bootstrap sees it; ``devices``: the
    split's device ordinals (tasks.remediation.alarm_stream.split_devices)."""
    return SplitFacts(
        devices=np.asarray(devices),
        device_days=float(split.device_days),
        fail_ordinal=np.asarray(split.fail_ordinal),
        fail_kind=np.asarray(split.fail_kind),
        window_ordinal=np.asarray(split.seg_ordinal)[split.seg],
        window_weight=np.asarray(split.weight, dtype=np.float64),
    )


def model_run(
    split: Any, risk: np.ndarray, threshold: float, horizon_s: float, hold_s: float = 0.0
) -> ModelRun:
    """A model's episodes at ``threshold`` (cordons standing ``hold_s``) and its risks
    judged at ``horizon_s``."""
    from gpuflow.tasks.health.evaluate import DEFAULT_LEAD_MIN_S, alarm_episodes

    ep = alarm_episodes(split, risk, threshold, horizon_s, DEFAULT_LEAD_MIN_S, hold_s)
    return ModelRun(ep, np.asarray(risk), split.labels(horizon_s))
