"""Event-level evaluation of risk scores on a split (DESIGN.md section 6).

Alarms: a window whose risk is at or above the threshold is "in alarm"; consecutive
windows in alarm on one device form an *episode*, and the monitor emits one event per
episode. Definitions:

* a failure is **detected** when its device is in alarm at some window ending between
  ``horizon_s`` and ``lead_min_s`` before it (later than lead_min there is no time to
  checkpoint and move the job);
* an episode is a **true alarm** when it covers such a window of a failure of its device,
  else a **false alarm**; an episode that began earlier and lasts into that window is
  true (the remediation it triggered was early, not wrong); its **lead time** is the
  failure time minus the episode's start;
* **precision** = true alarms / all alarms, **recall** = detected / failures, per failure
  class too (an alarm has no class until matched, so precision is one figure over all);
* **false alarms per 1000 device-days**: incident segments count theirs directly,
  background segments stand for the split's healthy device-time by their weight;
* a **cordon hold** (``hold_s``, 0 by default): the monitor's action cordons the device and
  empties it, so an episode that begins while an earlier acted-on episode's cordon still
  stands (within ``hold_s`` of its start, same segment) moves nothing: it joins that
  incident (tasks.remediation.steps.open_incident) and is not ``acted``;
* **PR-AUC**: average precision of the per-window risk against "fails within the
  horizon", windows weighted by the population they stand for;
* **alert rate**: the population share of windows in alarm (what the random baseline
  is matched to).

The abrupt classes (xid79, ecc-uncorrectable) have no precursor in the twin, as on real
fleets: their recall is what alarms at random would catch, and the figures say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gpuflow.tasks.health.history import SplitData
from gpuflow.tasks.health.horizons import DEFAULT_LEAD_MIN_S as DEFAULT_LEAD_MIN_S
from gpuflow.tasks.health.model import weighted_ap
from sklearn.metrics import precision_recall_curve

ABRUPT_CLASSES = ("xid79", "ecc-uncorrectable")
CLASSES = ("hbm", "thermal", "xid79", "ecc-uncorrectable")
DEFAULT_THRESHOLD = 0.85


@dataclass
class EvalResult:
    name: str
    threshold: float
    metrics: dict[str, float]
    by_class: dict[str, dict[str, float]]
    lead_times_s: np.ndarray
    lead_classes: list[str]
    pr_precision: np.ndarray = field(default_factory=lambda: np.zeros(0))
    pr_recall: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def flat_metrics(self) -> dict[str, float]:
        """MLflow-ready: ``<name>_<metric>`` and ``<name>_recall_<class>``."""
        out = {f"{self.name}_{k}": v for k, v in self.metrics.items()}
        for cls, m in self.by_class.items():
            key = cls.replace("-", "_")
            out[f"{self.name}_recall_{key}"] = m["recall"]
            out[f"{self.name}_failures_{key}"] = m["failures"]
        return {k: float(v) for k, v in out.items() if v is not None and not _isnan(v)}

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "threshold": self.threshold,
            **{k: _round(v) for k, v in self.metrics.items()},
            "by_class": {c: {k: _round(v) for k, v in m.items()} for c, m in self.by_class.items()},
        }


def _isnan(v: float) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _round(v: float) -> float:
    return round(float(v), 6) if v is not None and not _isnan(float(v)) else float("nan")


def episodes(alarm: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) window index of each run of alarms within a segment.

    Windows of a segment are contiguous and in time order (as the history lays them out).
    """
    a = alarm.astype(bool)
    if not a.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new_seg = np.ones(len(a), bool)
    new_seg[1:] = seg[1:] != seg[:-1]
    prev = np.zeros(len(a), bool)
    prev[1:] = a[:-1]
    starts = np.flatnonzero(a & (~prev | new_seg))
    nxt = np.zeros(len(a), bool)
    nxt[:-1] = a[1:]
    last_of_seg = np.ones(len(a), bool)
    last_of_seg[:-1] = seg[:-1] != seg[1:]
    ends = np.flatnonzero(a & (~nxt | last_of_seg))
    return starts, ends


@dataclass(frozen=True)
class AlarmEpisodes:
    """The alarms of a model on a split as the monitor raises them (one per episode), and
    which failures they caught. Per episode: its device, when it was raised (the end of
    its first window), how many population episodes it stands for (a background episode:
    its window's weight; else 1), whether it is true, whether it is background, whether it
    was acted on (not under the cordon of an earlier one). Per failure of the split (its
    order): detected, and the lead time (NaN when missed)."""

    ordinal: np.ndarray
    start_s: np.ndarray
    weight: np.ndarray
    true: np.ndarray
    background: np.ndarray
    detected: np.ndarray
    lead_s: np.ndarray
    acted: np.ndarray

    @property
    def true_moves(self) -> np.ndarray:
        """Acted-on episodes that caught a failure. A true episode in a background segment
        (a failure days after the sampled stretch) counts as neither true nor false."""
        return self.acted & self.true & ~self.background

    @property
    def false_moves(self) -> np.ndarray:
        """Acted-on episodes that caught none (each standing for its weight)."""
        return self.acted & ~self.true


def held(seg: np.ndarray, start_s: np.ndarray, hold_s: float) -> np.ndarray:
    """Per episode (in time order within each segment): acted on, i.e. not starting within
    ``hold_s`` of the last acted-on episode of its segment (whose cordon still stands)."""
    acted = np.ones(len(seg), bool)
    if hold_s <= 0:
        return acted
    last_seg, last_s = -1, -math.inf
    for i in range(len(seg)):
        if seg[i] == last_seg and start_s[i] - last_s < hold_s:
            acted[i] = False
        else:
            last_seg, last_s = seg[i], start_s[i]
    return acted


def alarm_episodes(
    split: SplitData,
    scores: np.ndarray,
    threshold: float,
    horizon_s: float,
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
    hold_s: float = 0.0,
) -> AlarmEpisodes:
    """The episodes of ``scores >= threshold`` with their times (see the module doc)."""
    if len(scores) != split.n_windows:
        raise ValueError(f"{len(scores)} scores for {split.n_windows} windows")
    if not lead_min_s < horizon_s:
        raise ValueError(f"lead_min_s ({lead_min_s}) must be below horizon_s ({horizon_s})")
    if not (isinstance(hold_s, int | float) and 0 <= hold_s < math.inf):
        raise ValueError(f"hold_s must be a finite number of seconds >= 0, got {hold_s!r}")
    alarm = np.asarray(scores, dtype=np.float64) >= threshold
    is_bg = split.seg_kind[split.seg] == 1
    in_window = (split.ttf_s >= lead_min_s) & (split.ttf_s <= horizon_s)
    starts, ends = episodes(alarm, split.seg)
    # An episode is true when it covers an in-window alarm: prefix sums over windows.
    cum = np.concatenate([[0], np.cumsum(alarm & in_window)])
    covers = cum[ends + 1] - cum[starts] > 0
    ep_bg = is_bg[starts]
    n_fail = len(split.fail_s)
    detected = np.zeros(n_fail, bool)
    lead = np.full(n_fail, np.nan)
    hits = np.flatnonzero(in_window & alarm)  # in time order within each segment
    if len(hits):
        seg_ids, first = np.unique(split.seg[hits], return_index=True)
        first_hit = hits[first]
        fi = split.seg_fault[seg_ids]
        keep = fi >= 0
        fi, first_hit = fi[keep], first_hit[keep]
        # The episode holding the first in-window alarm began at the last start before it.
        ep = np.searchsorted(starts, first_hit, side="right") - 1
        detected[fi] = True
        lead[fi] = split.fail_s[fi] - split.t_end_s[starts[ep]]
    return AlarmEpisodes(
        ordinal=split.seg_ordinal[split.seg[starts]],
        start_s=split.t_end_s[starts],
        weight=np.where(ep_bg, split.weight[starts], 1.0),
        true=covers,
        background=ep_bg,
        detected=detected,
        lead_s=lead,
        acted=held(split.seg[starts], split.t_end_s[starts], hold_s),
    )


def evaluate_scores(
    name: str,
    split: SplitData,
    scores: np.ndarray,
    threshold: float,
    horizon_s: float,
    lead_min_s: float = DEFAULT_LEAD_MIN_S,
    pr_curve: bool = True,
) -> EvalResult:
    """Event- and window-level figures of ``scores`` (one per window of ``split``)."""
    if len(scores) != split.n_windows:
        raise ValueError(f"{name}: {len(scores)} scores for {split.n_windows} windows")
    scores = np.asarray(scores, dtype=np.float64)
    y = split.labels(horizon_s)
    alarm = scores >= threshold
    ep = alarm_episodes(split, scores, threshold, horizon_s, lead_min_s)
    true_alarms = int(ep.true_moves.sum())
    false_alarms = float(ep.weight[ep.false_moves].sum())
    false_alarms_sampled = int(ep.false_moves.sum())
    detected, lead = ep.detected, ep.lead_s
    n_fail = len(split.fail_s)

    all_alarms = true_alarms + false_alarms
    metrics: dict[str, float] = {
        "precision": true_alarms / all_alarms if all_alarms > 0 else float("nan"),
        "recall": float(detected.mean()) if n_fail else float("nan"),
        "failures": float(n_fail),
        "detected": float(detected.sum()),
        "true_alarms": float(true_alarms),
        "false_alarms": false_alarms,
        "false_alarms_sampled": float(false_alarms_sampled),
        "fa_per_1000_device_days": false_alarms / split.device_days * 1000.0
        if split.device_days > 0
        else float("nan"),
        "pr_auc": weighted_ap(y, scores, split.weight),
        "alert_rate": float((split.weight * alarm).sum() / split.weight.sum())
        if len(alarm)
        else float("nan"),
    }
    precursor = np.isin(split.fail_kind, ABRUPT_CLASSES, invert=True)
    metrics["recall_precursor_classes"] = (
        float(detected[precursor].mean()) if precursor.any() else float("nan")
    )
    metrics["recall_abrupt_classes"] = (
        float(detected[~precursor].mean()) if (~precursor).any() else float("nan")
    )
    ok = ~np.isnan(lead)
    for q in (10, 50, 90):
        metrics[f"lead_p{q}_s"] = float(np.percentile(lead[ok], q)) if ok.any() else float("nan")
    by_class = {}
    for cls in CLASSES:
        m = split.fail_kind == cls
        by_class[cls] = {
            "failures": float(m.sum()),
            "detected": float(detected[m].sum()),
            "recall": float(detected[m].mean()) if m.any() else float("nan"),
            "abrupt": 1.0 if cls in ABRUPT_CLASSES else 0.0,
        }
    prec = rec = np.zeros(0)
    if pr_curve and y.sum() > 0 and len(np.unique(scores)) > 1:
        prec, rec, _ = precision_recall_curve(y, scores, sample_weight=split.weight)
    return EvalResult(
        name=name,
        threshold=threshold,
        metrics=metrics,
        by_class=by_class,
        lead_times_s=lead[ok],
        lead_classes=[str(k) for k in split.fail_kind[ok]],
        pr_precision=prec,
        pr_recall=rec,
    )


def random_threshold_for(alert_rate: float) -> float:
    """The threshold at which uniform random scores alarm on ``alert_rate`` of windows."""
    if not 0.0 <= alert_rate <= 1.0:
        raise ValueError(f"alert_rate must be in [0, 1], got {alert_rate}")
    return 1.0 - alert_rate


# -- plots -------------------------------------------------------------------------------------


def plot_pr_curves(results: list[EvalResult], path: str) -> str:
    """Window-level PR curves (population-weighted) with each model's event-level operating
    point (event precision, event recall) marked; written as a PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for r in results:
        if len(r.pr_recall):
            ax.step(
                r.pr_recall,
                r.pr_precision,
                where="post",
                label=f"{r.name} (PR-AUC {r.metrics['pr_auc']:.3f})",
            )
    for r in results:
        p, rc = r.metrics["precision"], r.metrics["recall"]
        if not (_isnan(p) or _isnan(rc)):
            ax.scatter([rc], [p], marker="o", zorder=3)
            ax.annotate(
                f"{r.name} events @ {r.threshold:g}",
                (rc, p),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_title("Failure within the horizon: windows (curves) and events (points)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_lead_times(results: list[EvalResult], path: str) -> str:
    """Histogram of alarm lead times (minutes, log scale) of detected failures per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    all_leads = np.concatenate([r.lead_times_s for r in results if len(r.lead_times_s)] or [[]])
    if len(all_leads):
        lo = max(all_leads.min() / 60.0, 1.0)
        hi = max(all_leads.max() / 60.0, lo * 2)
        bins = np.logspace(np.log10(lo), np.log10(hi), 30)
        for r in results:
            if len(r.lead_times_s):
                ax.hist(r.lead_times_s / 60.0, bins=bins, alpha=0.5, label=r.name)
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no failure detected", ha="center", transform=ax.transAxes)
    ax.set_xlabel("lead time (minutes before the failure)")
    ax.set_ylabel("detected failures")
    ax.set_title("Alarm lead time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
