"""The downtime study driven by each health model's actual alarm stream on held-out
histories (issue 15, item 5).

For each history seed, the models are trained on the twin's fleet history
(tasks.health.pipeline) and score its test split: nodes they never saw, later than
anything they saw. Their risks become alarm episodes per device with start times, exactly
as the monitor raises them and tasks.health.evaluate counts them (``alarm_stream``: the one
adapter between "a model's per-window risks" and this study). Each test device carries
one GPU of a gang job (``DowntimeCosts.gang_gpus``), and what the stream and the split's
actual failures do to it is accounted by tasks.remediation.downtime_sim:

* an alarm episode (true or false) makes the job checkpoint and move: C + M of the gang;
* a failure detected (the device in alarm between ``lead_min`` and the horizon before it,
  evaluate.py's rule) costs nothing more: the job had left. The horizon is each model's
  own: the one its risk is P(fail within) of, chosen on validation by cost
  (tasks.health.champion) and used by the monitor; not the history's label horizon;
* a failure not detected costs the work since the last Young/Daly checkpoint plus R.

Background episodes stand for the healthy device-time their segment samples (their
window weight, as in evaluate.py), so a device's false-alarm cost is a weighted count;
the split's device-days are shared evenly among its devices (repair downtime differs a
little per device; the split's total is exact). T (Young/Daly) comes from the failure rate
pooled over the seeds' test splits. Strategies: reactive (no alarms), rules, GBT, LSTM at
their validation-tuned thresholds (and at the decision rule's break-even risk for their
horizon), random at the LSTM's alert rate and horizon, oracle (alarms in exactly the
champion's horizon before every failure, abrupt ones included: a bound, not a model).
Intervals: bootstrap over history seeds and, within each, over devices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from gpuflow.tasks.health.evaluate import (
    ABRUPT_CLASSES,
    DEFAULT_LEAD_MIN_S,
    AlarmEpisodes,
    alarm_episodes,
)
from gpuflow.tasks.health.history import History, HistoryConfig, SplitData
from gpuflow.tasks.health.history_splits import split_of_nodes
from gpuflow.tasks.health.horizons import horizon_label
from gpuflow.tasks.remediation.downtime_sim import (
    DowntimeCosts,
    fleet_figures,
    resample_totals,
    summarize,
)

REACTIVE = "reactive"
# Per device, per strategy: unplanned and planned GPU-s, failures detected by class group,
# false alarms (weighted). Shared: device-days and failures by class group.
_PER_STRATEGY = ("unplanned", "planned", "detected_pre", "detected_abrupt", "false_alarms")
_SHARED = ("device_days", "failures_pre", "failures_abrupt")


class StrategyRisk(NamedTuple):
    """A strategy's per-window risks on a split, the threshold it acts at, and the horizon
    the risk is P(fail within) of (alarms count as detections within that horizon)."""

    risks: np.ndarray
    threshold: float
    horizon_s: float


Risks = Mapping[str, StrategyRisk]


def alarm_stream(
    split: SplitData,
    risks: np.ndarray,
    threshold: float,
    horizon_s: float,
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
) -> AlarmEpisodes:
    """A model's alarm episodes on ``split`` (device, start time, weight, true or false)
    and the failures they caught, from its per-window risks at ``threshold``."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    return alarm_episodes(split, np.asarray(risks), threshold, horizon_s, lead_min_s)


def split_devices(cfg: HistoryConfig, split: str = "test") -> np.ndarray:
    """Ordinals of the devices in ``split``'s node group (those with no event included)."""
    index = {"train": 0, "val": 1, "test": 2}
    if split not in index:
        raise ValueError(f"split must be one of {list(index)}, got {split!r}")
    nodes = np.flatnonzero(split_of_nodes(cfg) == index[split])
    return (nodes[:, None] * cfg.gpus_per_node + np.arange(cfg.gpus_per_node)).ravel()


@dataclass
class SeedStreams:
    """One history seed's test split: its devices, failures and each strategy's alarms."""

    devices: np.ndarray
    device_days: float
    fail_ordinal: np.ndarray
    fail_abrupt: np.ndarray
    streams: dict[str, AlarmEpisodes | None]  # None: reactive (no alarms)
    horizons_s: dict[str, float] = field(default_factory=dict)  # each stream's horizon

    @property
    def failures_per_gpu_day(self) -> float:
        return len(self.fail_ordinal) / self.device_days


def seed_streams(
    history: History, risks: Risks, lead_min_s: float = DEFAULT_LEAD_MIN_S
) -> SeedStreams:
    """Alarm streams of every strategy on ``history``'s test split."""
    split = history.splits["test"]
    streams: dict[str, AlarmEpisodes | None] = {REACTIVE: None}
    horizons: dict[str, float] = {}
    for name, (r, threshold, horizon_s) in risks.items():
        if name == REACTIVE:
            raise ValueError(f"{REACTIVE!r} is the no-alarm strategy: it takes no risks")
        streams[name] = alarm_stream(split, r, threshold, horizon_s, lead_min_s)
        horizons[name] = float(horizon_s)
    return SeedStreams(
        devices=split_devices(history.config),
        device_days=split.device_days,
        fail_ordinal=split.fail_ordinal,
        fail_abrupt=np.isin(split.fail_kind, ABRUPT_CLASSES),
        streams=streams,
        horizons_s=horizons,
    )


def device_rows(
    seed: SeedStreams, costs: DowntimeCosts, checkpoint_every_s: float
) -> tuple[np.ndarray, list[str]]:
    """Per device (rows) the costs and counts of every strategy (columns, named)."""
    names = list(seed.streams)
    cols = list(_SHARED) + [f"{n}:{k}" for n in names for k in _PER_STRATEGY]
    at = {c: i for i, c in enumerate(cols)}
    row_of = {int(o): i for i, o in enumerate(seed.devices)}
    unknown = set(seed.fail_ordinal.tolist()) - set(row_of)
    if unknown:
        raise ValueError(f"failures on devices outside the split: {sorted(unknown)[:5]}")
    out = np.zeros((len(seed.devices), len(cols)))
    out[:, at["device_days"]] = seed.device_days / len(seed.devices)
    fail_rows = np.array([row_of[int(o)] for o in seed.fail_ordinal], dtype=np.int64)
    np.add.at(out[:, at["failures_pre"]], fail_rows[~seed.fail_abrupt], 1.0)
    np.add.at(out[:, at["failures_abrupt"]], fail_rows[seed.fail_abrupt], 1.0)
    per_miss = costs.unplanned_gpu_s(checkpoint_every_s)
    per_alarm = costs.planned_gpu_s()
    for name, ep in seed.streams.items():
        detected = np.zeros(len(fail_rows), bool) if ep is None else ep.detected
        np.add.at(out[:, at[f"{name}:unplanned"]], fail_rows[~detected], per_miss)
        np.add.at(out[:, at[f"{name}:detected_pre"]], fail_rows[detected & ~seed.fail_abrupt], 1)
        np.add.at(out[:, at[f"{name}:detected_abrupt"]], fail_rows[detected & seed.fail_abrupt], 1)
        if ep is None or not len(ep.ordinal):
            continue
        ep_rows = np.array([row_of[int(o)] for o in ep.ordinal], dtype=np.int64)
        np.add.at(out[:, at[f"{name}:planned"]], ep_rows, ep.weight * per_alarm)
        false = ep.false_moves
        np.add.at(out[:, at[f"{name}:false_alarms"]], ep_rows[false], ep.weight[false])
    return out, cols


def _figures(totals: np.ndarray, at: dict[str, int], name: str, share: float) -> dict[str, Any]:
    """A strategy's fleet figures from column totals (one row, or one per resample)."""
    dd = totals[..., at["device_days"]]
    figs = fleet_figures(
        totals[..., at[f"{name}:unplanned"]], totals[..., at[f"{name}:planned"]], dd, share
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        figs["recall_precursor_classes"] = (
            totals[..., at[f"{name}:detected_pre"]] / totals[..., at["failures_pre"]]
        )
        figs["recall_abrupt_classes"] = (
            totals[..., at[f"{name}:detected_abrupt"]] / totals[..., at["failures_abrupt"]]
        )
    figs["false_alarms_per_1000_dd"] = totals[..., at[f"{name}:false_alarms"]] / dd * 1000.0
    return figs


@dataclass
class StreamStudy:
    """The study's result: per strategy its figures with intervals, and what it rests on."""

    table: dict[str, dict[str, float]]
    checkpoint_every_s: float
    checkpoint_share: float
    seeds: int
    devices: int
    device_days: float
    failures: int
    failures_abrupt: int
    horizons_s: dict[str, list[float]] = field(default_factory=dict)  # per seed, per strategy

    def horizon_summary(self) -> dict[str, str]:
        """Per strategy, the horizons its alarms were counted at and in how many seeds."""
        return {
            name: ", ".join(f"{horizon_label(h)} x{n}" for h, n in sorted(Counter(hs).items()))
            for name, hs in self.horizons_s.items()
        }


def study(
    seeds: Sequence[SeedStreams],
    costs: DowntimeCosts | None = None,
    resamples: int = 2000,
    boot_seed: int = 0,
) -> StreamStudy:
    """Fleet figures of every strategy over the seeds, bootstrap intervals, reductions."""
    if not seeds:
        raise ValueError("the study needs at least one history seed")
    names = list(seeds[0].streams)
    if any(list(s.streams) != names for s in seeds):
        raise ValueError("every seed needs the same strategies, in the same order")
    costs = costs or DowntimeCosts()
    failures = sum(len(s.fail_ordinal) for s in seeds)
    rate = failures / sum(s.device_days for s in seeds)
    every = costs.checkpoint_every_s(rate)
    share = costs.checkpoint_share(every)
    rows = []
    cols: list[str] = []
    for s in seeds:
        r, cols = device_rows(s, costs, every)
        rows.append(r)
    at = {c: i for i, c in enumerate(cols)}
    point_totals = sum(r.sum(axis=0) for r in rows)
    boot = resample_totals(rows, resamples, boot_seed)
    point = {
        n: {k: float(v) for k, v in _figures(point_totals, at, n, share).items()} for n in names
    }
    samples = {n: _figures(boot, at, n, share) for n in names}
    return StreamStudy(
        table=summarize(point, samples),
        checkpoint_every_s=every,
        checkpoint_share=share,
        seeds=len(seeds),
        devices=sum(len(s.devices) for s in seeds),
        device_days=float(point_totals[at["device_days"]]),
        failures=failures,
        failures_abrupt=int(sum(s.fail_abrupt.sum() for s in seeds)),
        horizons_s={
            n: [s.horizons_s[n] for s in seeds if n in s.horizons_s]
            for n in names
            if any(n in s.horizons_s for s in seeds)
        },
    )


# -- the models' risks on a history -----------------------------------------------------------


def break_even_risk(costs: DowntimeCosts, every_s: float, horizon_s: float) -> float:
    """The risk above which the decision rule (tasks.health.decision) acts on a device of
    a ``costs.gang_gpus`` job checkpointing every ``every_s``, its phase unknown (the
    middle of its period)."""
    from gpuflow.tasks.health.decision import DeviceCosts, JobCosts, decide

    job = JobCosts(
        job_id="study",
        gang_gpus=costs.gang_gpus,
        since_checkpoint_s=every_s / 2.0,
        checkpoint_save_s=costs.checkpoint_s,
        restart_s=costs.restart_s,
        relaunch_s=costs.migrate_s,
        checkpoint_every_s=every_s,
    )
    level = decide(0.0, horizon_s, DeviceCosts(jobs=(job,), room_elsewhere=True)).break_even_risk
    if level is None:
        raise ValueError("no break-even risk: the job has nothing to lose")
    return level


def trained_risks(
    history: History,
    train_config: Any = None,
    costs: DowntimeCosts | None = None,
    progress: Callable[[str, float], None] | None = None,
) -> dict[str, StrategyRisk]:
    """Train the pipeline's models on ``history`` and return every strategy's per-window
    risks on its test split with the threshold and horizon each is run at. Each model runs
    at the horizon the pipeline chose for it on validation by cost (its risk is P(fail
    within that horizon), the monitor's too): rules at 0.5 (its score is 0 or 1), GBT and
    LSTM at their validation-tuned thresholds (best event F1, tuned at that horizon) and,
    as ``<model>@cost``, at the decision rule's break-even risk for that horizon (T from
    the validation split's failure rate: known before the test period); random at the
    LSTM's alert rate (population-weighted) and horizon; the oracle at 0.5 within the
    champion's horizon. The pipeline's public API is used as it stands; this is the only
    place that knows it."""
    from gpuflow.tasks.health.baselines import RuleModel, oracle_scores, random_scores
    from gpuflow.tasks.health.evaluate import random_threshold_for
    from gpuflow.tasks.health.pipeline import score_split, train_and_evaluate

    costs = costs or DowntimeCosts()
    outcome = train_and_evaluate(
        history.config, train_config, history=history, cache=False, progress=progress
    )
    test, val = history.splits["test"], history.splits["val"]
    every = costs.checkpoint_every_s(len(val.fail_s) / val.device_days)
    horizon = model_horizons(outcome, history.config.horizon_s)
    rules = RuleModel(test.window)
    out = {"rules": StrategyRisk(score_split(rules, test), 0.5, horizon["rules"])}
    for name, model in (("gbt", outcome.gbt), ("lstm", outcome.lstm)):
        h = horizon[name]
        r = score_split(model, test)  # at its chosen horizon (the pipeline set it)
        out[name] = StrategyRisk(r, float(outcome.thresholds[name]), h)
        out[f"{name}@cost"] = StrategyRisk(r, break_even_risk(costs, every, h), h)
    lstm = out["lstm"]
    rate = float(np.average(lstm.risks >= lstm.threshold, weights=test.weight))
    out["random"] = StrategyRisk(
        random_scores(test.n_windows, seed=history.config.seed),
        random_threshold_for(rate),
        lstm.horizon_s,
    )
    h = horizon.get(outcome.champion, lstm.horizon_s)
    out["oracle"] = StrategyRisk(oracle_scores(test, h), 0.5, h)
    return out


def model_horizons(outcome: Any, default_s: float) -> dict[str, float]:
    """Each model's horizon as the pipeline chose it on validation (``outcome.horizons``);
    ``default_s`` for a model it chose none for."""
    chosen = getattr(outcome, "horizons", None) or {}
    return {name: float(chosen.get(name, default_s)) for name in ("rules", "gbt", "lstm")}
