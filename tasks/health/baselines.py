"""What the LSTM is compared with, on the same windows (DESIGN.md section 6).

* rules: the operator's thresholds of hardware/health.py on the newest bucket: hotter
  than HOT_TEMPERATURE_C (85 C), any critical XID (hardware.health.CRITICAL_XIDS), a row
  remap / page retirement pending. A 0/1 score. A rule whose input is missing (NaN: the
  device's backend cannot read it) does not fire: there is no evidence either way.
* gbt: gradient-boosted trees (sklearn HistGradientBoostingClassifier) on flat summaries
  of the same windows (last, mean, max, last - first of every feature), trained on the
  same sample and calibrated the same way as the LSTM. Missing inputs stay NaN: the trees
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
from gpuflow.hardware.health import HOT_TEMPERATURE_C
from gpuflow.tasks.health.features import FEATURE_INDEX, FEATURES, summary_features
from gpuflow.tasks.health.history import History, SplitData
from gpuflow.tasks.health.model import TrainConfig, fit_calibration, training_indices, weighted_ap
from sklearn.ensemble import HistGradientBoostingClassifier

_TEMP = FEATURE_INDEX["temperature_c"]
_PENDING = FEATURE_INDEX["remap_pending"]
_XID_CRITICAL = [FEATURE_INDEX["xid_memory_log"], FEATURE_INDEX["xid_bus_log"]]


def rule_scores(windows: np.ndarray) -> np.ndarray:
    """1.0 where a threshold rule fires on the newest bucket, else 0.0."""
    last = windows[:, -1, :]
    fired = (
        (last[:, _TEMP] > HOT_TEMPERATURE_C)
        | (np.nansum(last[:, _XID_CRITICAL], axis=1) > 0)
        | (last[:, _PENDING] > 0.5)
    )
    return fired.astype(np.float32)


class RuleModel:
    """The threshold rules behind the HealthModel interface (risk 0 or 1)."""

    name = "rules"

    def __init__(self, window: int) -> None:
        self.window = window
        self.feature_names = FEATURES

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        return rule_scores(windows)

    def top_features(self, windows: np.ndarray, k: int = 3) -> list[dict[str, float]]:
        """The rules that fired, with the newest bucket's value."""
        out = []
        for w in windows:
            last = w[-1]
            fired = {}
            if last[_TEMP] > HOT_TEMPERATURE_C:
                fired["temperature_c"] = float(last[_TEMP])
            for j in _XID_CRITICAL:
                if last[j] > 0:
                    fired[FEATURES[j]] = float(last[j])
            if last[_PENDING] > 0.5:
                fired["remap_pending"] = 1.0
            out.append(dict(list(fired.items())[:k]))
        return out


@dataclass(frozen=True)
class GbtConfig:
    max_iter: int = 150
    learning_rate: float = 0.1
    max_leaf_nodes: int = 31
    l2_regularization: float = 1.0
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class GbtHealthModel:
    """Gradient-boosted trees on summary features, Platt-calibrated like the LSTM."""

    name = "gbt"

    def __init__(
        self,
        clf: HistGradientBoostingClassifier,
        window: int,
        calibration: tuple[float, float] = (1.0, 0.0),
    ) -> None:
        self.clf = clf
        self.window = window
        self.feature_names = FEATURES
        self.calibration = calibration

    def raw_logits(self, windows: np.ndarray, batch: int = 200_000) -> np.ndarray:
        out = np.empty(len(windows), dtype=np.float64)
        for i in range(0, len(windows), batch):
            out[i : i + batch] = self.clf.decision_function(
                summary_features(windows[i : i + batch])
            )
        return out

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        a, b = self.calibration
        return (1.0 / (1.0 + np.exp(-(a * self.raw_logits(windows) + b)))).astype(np.float32)


def train_gbt(
    history: History, train_cfg: TrainConfig | None = None, cfg: GbtConfig | None = None
) -> tuple[GbtHealthModel, dict[str, Any]]:
    """Fit on the LSTM's training sample, calibrate on the val split."""
    train_cfg = train_cfg or TrainConfig()
    cfg = cfg or GbtConfig()
    horizon_s = history.config.horizon_s
    train, val = history.splits["train"], history.splits["val"]
    idx, y = training_indices(train, horizon_s, train_cfg)
    n_pos = float(y.sum())
    if n_pos == 0:
        raise ValueError("the train split holds no positive window")
    pos_weight = min((len(y) - n_pos) / n_pos, train_cfg.pos_weight_max)
    started = time.perf_counter()
    clf = HistGradientBoostingClassifier(
        max_iter=cfg.max_iter,
        learning_rate=cfg.learning_rate,
        max_leaf_nodes=cfg.max_leaf_nodes,
        l2_regularization=cfg.l2_regularization,
        early_stopping=False,
        random_state=cfg.seed,
    )
    clf.fit(
        summary_features(train.windows(idx)), y, sample_weight=np.where(y == 1, pos_weight, 1.0)
    )
    model = GbtHealthModel(clf, history.config.window)
    val_y = val.labels(horizon_s)
    val_logits = model.raw_logits(val.windows())
    model.calibration = fit_calibration(val_logits, val_y, val.weight)
    return model, {
        "train_windows": len(y),
        "val_pr_auc": weighted_ap(val_y, val_logits, val.weight),
        "calibration": list(model.calibration),
        "train_s": time.perf_counter() - started,
    }


def random_scores(n: int, seed: int = 0) -> np.ndarray:
    """Uniform scores in [0, 1): with threshold 1 - r they alarm on a share r of windows."""
    return np.random.default_rng(seed).random(n).astype(np.float32)


def oracle_scores(split: SplitData, horizon_s: float) -> np.ndarray:
    """1.0 on exactly the windows followed by a failure within the horizon."""
    return split.labels(horizon_s)
