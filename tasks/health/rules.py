"""The threshold rules as a health model: the operator's thresholds of hardware/health.py
on the newest bucket (tasks.health.baselines explains them beside the learned models).

On their own, apart from the baselines that train (torch, sklearn): the rules are what a
fresh install scores with, and the telemetry exporter, the monitor and `gpuflow up` load
them without paying seconds of imports for models they do not use.
"""

from __future__ import annotations

import numpy as np
from gpuflow.hardware.health import HOT_TEMPERATURE_C
from gpuflow.tasks.health.features import FEATURE_INDEX, FEATURES
from gpuflow.tasks.health.horizons import HORIZONS_S

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

    def __init__(self, window: int, horizons_s: tuple[float, ...] = HORIZONS_S) -> None:
        self.window = window
        self.feature_names = FEATURES
        self.horizons_s = tuple(horizons_s)
        self.horizon_s = self.horizons_s[0]

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        return rule_scores(windows)

    def predict_risks(self, windows: np.ndarray) -> np.ndarray:
        """The same 0/1 at every horizon: a rule has no notion of when."""
        return np.repeat(rule_scores(windows)[:, None], len(self.horizons_s), axis=1)

    def use_horizon(self, horizon_s: float) -> None:
        self.horizon_s = float(horizon_s)

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


__all__ = ["RuleModel", "rule_scores"]
