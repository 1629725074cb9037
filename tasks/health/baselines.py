"""What the LSTM is compared with, on the same windows (DESIGN.md section 6).

* rules: the operator's thresholds of hardware/health.py on the newest bucket: hotter
  than HOT_TEMPERATURE_C (85 C), any critical XID (hardware.health.CRITICAL_XIDS), a row
  remap / page retirement pending. A 0/1 score. A rule whose input is missing (NaN: the
  device's backend cannot read it) does not fire: there is no evidence either way.
* gbt: gradient-boosted trees (sklearn HistGradientBoostingClassifier) on flat summaries
  of the same windows (last, mean, max, last - first of every feature, the device's
  multi-day record included), one per horizon, trained on the same sample and calibrated
  the same way as the LSTM. Missing inputs stay NaN: the trees
  learn a branch for them (HistGradientBoosting's native missing-value support).
* random: uniform scores; evaluation picks the threshold that gives the LSTM's alert
  rate, so it is "as many alarms, placed by chance".
* oracle: 1 exactly when a failure follows within the horizon (the labels): the ceiling.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from gpuflow.tasks.health.calibration import HorizonCalibrator
from gpuflow.tasks.health.features import FEATURES, summary_features
from gpuflow.tasks.health.history import History, SplitData
from gpuflow.tasks.health.horizons import HORIZONS_S, interval_index, monotone, multi_labels
from gpuflow.tasks.health.model import (
    MultiHorizon,
    TrainConfig,
    mean_ap,
    occlusion_top_features,
    positive_weight,
    training_indices,
)

# The rules live in a module of their own (light to import); still named here beside the others.
from gpuflow.tasks.health.rules import RuleModel as RuleModel
from gpuflow.tasks.health.rules import rule_scores as rule_scores
from sklearn.ensemble import HistGradientBoostingClassifier


@dataclass(frozen=True)
class GbtConfig:
    max_iter: int = 150
    learning_rate: float = 0.1
    max_leaf_nodes: int = 31
    l2_regularization: float = 1.0
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GbtHealthModel(MultiHorizon):
    """Gradient-boosted trees on summary features: one multi-class model of the interval
    the failure falls in ([0, 1 h), [1 h, 6 h), ..., none within 72 h), so P(T <= H_j) is
    the sum of the classes up to j (monotone by construction); calibrated like the LSTM."""

    name = "gbt"

    def __init__(
        self,
        clf: HistGradientBoostingClassifier,
        window: int,
        horizons_s: tuple[float, ...] = HORIZONS_S,
    ) -> None:
        self.clf = clf
        self.window = window
        self.feature_names = FEATURES
        self.horizons_s = tuple(horizons_s)
        self.horizon_s = self.horizons_s[0]
        self.calibrator = HorizonCalibrator()
        # Per feature, its median in the training sample: what top_features puts in its place.
        self.fill = np.full(len(FEATURES), np.nan)

    def raw_risks(self, windows: np.ndarray, batch: int = 200_000) -> np.ndarray:
        h = len(self.horizons_s)
        classes = np.asarray(self.clf.classes_, dtype=np.int64)
        out = np.empty((len(windows), h), dtype=np.float64)
        for i in range(0, len(windows), batch):
            proba = self.clf.predict_proba(summary_features(windows[i : i + batch]))
            per = np.zeros((len(proba), h + 1))
            per[:, classes] = proba
            out[i : i + batch] = np.cumsum(per[:, :h], axis=1)
        return monotone(out)

    def predict_risks(self, windows: np.ndarray) -> np.ndarray:
        return self.calibrator(self.raw_risks(windows))

    def top_features(self, windows: np.ndarray, k: int = 3) -> list[dict[str, float]]:
        """Per window, the ``k`` features whose occlusion (replaced by their training median
        over the whole window) lowers the risk most, as the LSTM explains itself. A model
        pickled before the medians were kept occludes with NaN: the trees' missing branch."""
        fill = getattr(self, "fill", np.full(len(FEATURES), np.nan))
        return occlusion_top_features(self.predict_risk, windows, fill, self.feature_names, k)


def train_gbt(
    history: History,
    train_cfg: TrainConfig | None = None,
    cfg: GbtConfig | None = None,
    val: SplitData | None = None,
    cal: SplitData | None = None,
    horizons_s: tuple[float, ...] = HORIZONS_S,
) -> tuple[GbtHealthModel, dict[str, Any]]:
    """Fit on the LSTM's training sample, calibrate on ``cal`` (default: the val split).
    Unweighted: the calibration sets the base rate, and sample weights made sklearn's
    binning ten times slower."""
    train_cfg = train_cfg or TrainConfig()
    cfg = cfg or GbtConfig()
    val = val if val is not None else history.splits["val"]
    cal = cal if cal is not None else val
    train = history.splits["train"]
    idx, y = training_indices(train, train_cfg, horizons_s)
    positive_weight(y, train_cfg)  # refuses a sample without failures
    started = time.perf_counter()
    clf = HistGradientBoostingClassifier(
        max_iter=cfg.max_iter,
        learning_rate=cfg.learning_rate,
        max_leaf_nodes=cfg.max_leaf_nodes,
        l2_regularization=cfg.l2_regularization,
        early_stopping=False,
        random_state=cfg.seed,
    )
    windows = train.windows(idx)
    clf.fit(summary_features(windows), interval_index(train.ttf_s[idx], horizons_s))
    model = GbtHealthModel(clf, history.config.window, horizons_s)
    flat = windows.reshape(-1, windows.shape[-1])
    seen = ~np.isnan(flat).all(axis=0)  # a feature no training device reads stays NaN
    model.fill[seen] = np.nanmedian(flat[:, seen], axis=0)
    val_raw = model.raw_risks(val.windows())
    model.calibrator.fit(
        model.raw_risks(cal.windows()), multi_labels(cal.ttf_s, horizons_s), cal.weight
    )
    return model, {
        "train_windows": len(y),
        "val_pr_auc": mean_ap(multi_labels(val.ttf_s, horizons_s), val_raw, val.weight),
        "calibration": model.calibrator.describe(),
        "train_s": time.perf_counter() - started,
    }


def random_scores(n: int, seed: int = 0) -> np.ndarray:
    """Uniform scores in [0, 1): with threshold 1 - r they alarm on a share r of windows."""
    return np.random.default_rng(seed).random(n).astype(np.float32)


def oracle_scores(split: SplitData, horizon_s: float) -> np.ndarray:
    """1.0 on exactly the windows followed by a failure within the horizon."""
    return split.labels(horizon_s)
