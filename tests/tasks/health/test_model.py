from __future__ import annotations

import numpy as np
import pytest
import torch
from gpuflow.tasks.health.baselines import RuleModel, random_scores, rule_scores
from gpuflow.tasks.health.features import FEATURE_INDEX, N_FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.history import History
from gpuflow.tasks.health.model import (
    HealthLSTM,
    TrainConfig,
    fit_calibration,
    train_lstm,
    training_indices,
)

from .conftest import TINY_HISTORY, TINY_TRAIN

FI = FEATURE_INDEX


def windows(n: int = 4) -> np.ndarray:
    return np.zeros((n, WINDOW_BUCKETS, N_FEATURES), dtype=np.float32)


def test_rules() -> None:
    w = windows(5)
    w[1, -1, FI["temperature_c"]] = 86.0
    w[2, -1, FI["xid_memory_log"]] = np.log1p(1)
    w[3, -1, FI["remap_pending"]] = 1.0
    w[4, -2, FI["xid_bus_log"]] = np.log1p(1)  # an older bucket: not the newest
    assert rule_scores(w).tolist() == [0, 1, 1, 1, 0]
    why = RuleModel(WINDOW_BUCKETS).top_features(w)
    assert why[1] == {"temperature_c": 86.0} and why[3] == {"remap_pending": 1.0}


def test_random_scores_alarm_at_the_asked_rate() -> None:
    s = random_scores(100_000, seed=3)
    assert (s >= 0.99).mean() == pytest.approx(0.01, abs=0.002)


def test_training_sample(tiny_history: History) -> None:
    sp = tiny_history.splits["train"]
    idx, y = training_indices(sp, TINY_HISTORY.horizon_s, TINY_TRAIN)
    assert y.sum() == sp.labels(TINY_HISTORY.horizon_s).sum()  # every positive is kept
    assert len(np.unique(idx)) == len(idx)
    bg = sp.seg_kind[sp.seg[idx]] == 1
    assert bg.sum() <= TINY_TRAIN.max_background


def test_trained_lstm_is_calibrated_and_checks_shapes(tiny_outcome) -> None:
    m: HealthLSTM = tiny_outcome.lstm
    w = np.random.default_rng(0).normal(size=(7, m.window, N_FEATURES)).astype(np.float32)
    r = m.predict_risk(w)
    assert r.shape == (7,) and np.all((r >= 0) & (r <= 1))
    assert m.calibration.tolist() == pytest.approx(tiny_outcome.lstm_info["calibration"])
    with pytest.raises(ValueError, match="windows must be"):
        m.predict_risk(w[:, :5])
    top = m.top_features(w, k=2)
    assert len(top) == 7 and all(len(t) == 2 for t in top)
    # the module carries its own normalization: a copy scores the same
    clone = HealthLSTM(m.hidden, 1, m.window, m.bucket_s, m.horizon_s)
    clone.load_state_dict(m.state_dict())
    assert np.allclose(clone.predict_risk(w), r)


def test_no_positive_means_a_clear_error(tiny_history: History) -> None:
    sp = tiny_history.splits["train"]
    saved = sp.ttf_s
    try:
        sp.ttf_s = np.full_like(saved, np.inf)
        with pytest.raises(ValueError, match="no positive"):
            train_lstm(tiny_history, TrainConfig.small(epochs=1))
    finally:
        sp.ttf_s = saved


def test_fit_calibration_recovers_a_logistic() -> None:
    rng = np.random.default_rng(0)
    z = rng.normal(size=20_000) * 3
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(0.5 * z - 2)))).astype(float)
    a, b = fit_calibration(z, y, np.ones_like(z))
    assert a == pytest.approx(0.5, abs=0.05) and b == pytest.approx(-2, abs=0.1)
    assert fit_calibration(z, np.zeros_like(z), np.ones_like(z)) == (1.0, 0.0)


def test_train_config_validation() -> None:
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    assert torch.get_num_threads() >= 1
