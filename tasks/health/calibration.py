"""Calibration of multi-horizon risks and how well it holds on the test split.

A model trains on a sample (every failure, few healthy windows, positives up-weighted), so
its raw scores are not probabilities for the fleet. They become ones on a split of their
own (the calibration split: nodes carved out of validation, which keeps early stopping and
the champion's choice), every window weighted by the population it stands for
(background windows stand for many): per horizon isotonic regression where the split
holds enough failing windows to shape it (``ISOTONIC_MIN_POSITIVES``), Platt scaling of
the logit otherwise; then the running maximum across horizons keeps P(T <= h) monotone.

On test: Brier score, expected calibration error (ECE) and a reliability table over fixed
risk bins (log-spaced: the risks that matter are around 1 %, the cost rule's break-even),
all population-weighted; ``plot_reliability`` draws the diagram.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gpuflow.tasks.health.horizons import horizon_label, monotone
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

ISOTONIC_MIN_POSITIVES = 50  # failing windows (unweighted) for an isotonic fit
BIN_EDGES = (0.0, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 0.6, 1.0)
_EPS = 1e-7


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    return np.log(p / (1.0 - p))


@dataclass
class HorizonCalibrator:
    """Per horizon: ("isotonic", IsotonicRegression) or ("platt", (a, b)) or ("none", None)."""

    methods: list[tuple[str, Any]] = field(default_factory=list)

    def fit(self, raw: np.ndarray, y: np.ndarray, weight: np.ndarray) -> HorizonCalibrator:
        self.methods = []
        for j in range(raw.shape[1]):
            yj, pj = y[:, j], raw[:, j]
            if yj.min() == yj.max():
                self.methods.append(("none", None))
            elif yj.sum() >= ISOTONIC_MIN_POSITIVES:
                iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
                iso.fit(pj.astype(np.float64), yj, sample_weight=weight)
                self.methods.append(("isotonic", iso))
            else:
                lr = LogisticRegression(C=1e6, max_iter=1000)
                lr.fit(_logit(pj).reshape(-1, 1), yj, sample_weight=weight)
                self.methods.append(("platt", (float(lr.coef_[0, 0]), float(lr.intercept_[0]))))
        return self

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        if not self.methods:
            return monotone(raw)
        out = np.empty(raw.shape, dtype=np.float64)
        for j, (kind, m) in enumerate(self.methods):
            if kind == "isotonic":
                out[:, j] = m.predict(raw[:, j].astype(np.float64))
            elif kind == "platt":
                a, b = m
                out[:, j] = 1.0 / (1.0 + np.exp(-(a * _logit(raw[:, j]) + b)))
            else:
                out[:, j] = raw[:, j]
        return monotone(out).astype(np.float32)

    def describe(self) -> list[str]:
        return [kind for kind, _ in self.methods]


def brier(y: np.ndarray, p: np.ndarray, weight: np.ndarray) -> float:
    return float(np.sum(weight * (p - y) ** 2) / np.sum(weight))


def reliability(
    y: np.ndarray, p: np.ndarray, weight: np.ndarray, edges: tuple[float, ...] = BIN_EDGES
) -> list[dict[str, float]]:
    """Per risk bin with windows in it: mean predicted risk, observed failure share (both
    population-weighted), the bin's population share and its failing windows."""
    b = np.clip(np.searchsorted(np.asarray(edges), p, side="right") - 1, 0, len(edges) - 2)
    total = float(weight.sum())
    out = []
    for k in range(len(edges) - 1):
        m = b == k
        w = float(weight[m].sum())
        if w <= 0:
            continue
        out.append(
            {
                "lo": edges[k],
                "hi": edges[k + 1],
                "predicted": float(np.sum(weight[m] * p[m]) / w),
                "observed": float(np.sum(weight[m] * y[m]) / w),
                "share": w / total,
                "positives": float(y[m].sum()),
            }
        )
    return out


def ece(y: np.ndarray, p: np.ndarray, weight: np.ndarray) -> float:
    """Expected calibration error: bins' |predicted - observed| weighted by population."""
    return float(
        sum(r["share"] * abs(r["predicted"] - r["observed"]) for r in reliability(y, p, weight))
    )


def calibration_report(
    y: np.ndarray, p: np.ndarray, weight: np.ndarray, horizons_s: tuple[float, ...]
) -> dict[str, dict[str, Any]]:
    """Per horizon label: Brier, ECE, the base rate and the reliability table."""
    out = {}
    for j, h in enumerate(horizons_s):
        out[horizon_label(h)] = {
            "brier": brier(y[:, j], p[:, j], weight),
            "ece": ece(y[:, j], p[:, j], weight),
            "base_rate": float(np.sum(weight * y[:, j]) / np.sum(weight)),
            "positives": float(y[:, j].sum()),
            "reliability": reliability(y[:, j], p[:, j], weight),
        }
    return out


def plot_reliability(reports: dict[str, dict[str, dict[str, Any]]], path: str) -> None:
    """Reliability diagrams, one panel per horizon, one line per model (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    horizons = list(next(iter(reports.values())).keys()) if reports else []
    fig, axes = plt.subplots(1, max(len(horizons), 1), figsize=(4 * max(len(horizons), 1), 4))
    axes = np.atleast_1d(axes)
    for ax, h in zip(axes, horizons, strict=False):
        ax.plot([1e-5, 1], [1e-5, 1], color="grey", lw=0.8, ls="--")
        for name, rep in reports.items():
            rows = rep[h]["reliability"]
            xs = [max(r["predicted"], 1e-5) for r in rows]
            ys = [max(r["observed"], 1e-5) for r in rows]
            ax.plot(xs, ys, marker="o", label=f"{name} (ECE {rep[h]['ece']:.2g})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"within {h} (test)")
        ax.set_xlabel("predicted risk")
        ax.set_ylabel("observed failure share")
        ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.15, wspace=0.3)  # tight_layout: seconds
    fig.savefig(path, dpi=100)
    plt.close(fig)
