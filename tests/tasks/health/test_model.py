from __future__ import annotations

import numpy as np
import pytest
import torch
from gpuflow.tasks.health.baselines import RuleModel, random_scores, rule_scores
from gpuflow.tasks.health.calibration import HorizonCalibrator, brier, ece
from gpuflow.tasks.health.features import FEATURE_INDEX, FEATURES, N_FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.history import History
from gpuflow.tasks.health.horizons import HORIZONS_S, interval_index, multi_labels
from gpuflow.tasks.health.model import (
    HealthLSTM,
    TrainConfig,
    hazard_nll,
    occlusion_top_features,
    train_lstm,
    training_indices,
)

from .conftest import TINY_TRAIN

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
    idx, y = training_indices(sp, TINY_TRAIN)
    near = (sp.ttf_s > 0) & (sp.ttf_s <= TINY_TRAIN.near_negatives_s)
    assert y[:, 1].sum() == multi_labels(sp.ttf_s, HORIZONS_S)[near, 1].sum()  # all 6 h kept
    assert np.all(np.diff(y, axis=1) >= 0)  # nested horizons
    assert len(np.unique(idx)) == len(idx)
    bg = sp.seg_kind[sp.seg[idx]] == 1
    assert bg.sum() <= TINY_TRAIN.max_background


def test_trained_lstm_is_calibrated_monotone_and_checks_shapes(tiny_outcome) -> None:
    m: HealthLSTM = tiny_outcome.lstm
    w = np.random.default_rng(0).normal(size=(7, m.window, N_FEATURES)).astype(np.float32)
    risks = m.predict_risks(w)
    assert risks.shape == (7, len(HORIZONS_S)) and np.all((risks >= 0) & (risks <= 1))
    assert np.all(np.diff(risks, axis=1) >= 0)  # P(T <= h) grows with h
    assert np.array_equal(m.predict_risk(w), risks[:, m.horizon_index()])
    assert m.calibrator.describe() == tiny_outcome.lstm_info["calibration"]
    with pytest.raises(ValueError, match="windows must be"):
        m.predict_risk(w[:, :5])
    with pytest.raises(ValueError, match="not one of"):
        m.use_horizon(1800.0)
    top = m.top_features(w, k=2)
    assert len(top) == 7 and all(len(t) == 2 for t in top)
    # the module carries its own normalization: a copy scores the same
    clone = HealthLSTM(m.hidden, 1, m.window, m.bucket_s, m.horizons_s)
    clone.load_state_dict(m.state_dict())
    assert np.allclose(clone.raw_risks(w), m.raw_risks(w))


def test_hazard_likelihood_prefers_the_right_interval() -> None:
    ttf = np.array([600.0, 3 * 3600.0, np.inf])
    it = torch.from_numpy(interval_index(ttf))
    assert it.tolist() == [0, 1, len(HORIZONS_S)]
    w = torch.ones(3)
    right = torch.full((3, len(HORIZONS_S)), -6.0)
    right[0, 0] = right[1, 1] = 6.0  # fail in its own interval, survive the others
    wrong = -right
    assert hazard_nll(right, it, w) < hazard_nll(wrong, it, w)


def test_calibrator_fits_a_population_and_measures_it() -> None:
    rng = np.random.default_rng(0)
    n = 40_000
    true_p = rng.beta(0.5, 20, n)
    y = (rng.random(n) < true_p).astype(float)
    raw = np.sqrt(true_p)  # a monotone distortion: isotonic undoes it
    cal = HorizonCalibrator().fit(raw[:, None], y[:, None], np.ones(n))
    p = cal(raw[:, None])[:, 0]
    assert cal.describe() == ["isotonic"]
    assert ece(y, p, np.ones(n)) < 0.01 < ece(y, raw, np.ones(n))
    assert brier(y, p, np.ones(n)) < brier(y, raw, np.ones(n))
    few = HorizonCalibrator().fit(raw[:300, None], y[:300, None], np.ones(300))
    assert few.describe() == ["platt"]  # too few failing windows for isotonic
    # weights: a window standing for 9 others counts as 10
    w = np.where(y == 0, 10.0, 1.0)
    p_w = HorizonCalibrator().fit(raw[:, None], y[:, None], w)(raw[:, None])[:, 0]
    assert np.average(p_w, weights=w) == pytest.approx(np.average(y, weights=w), rel=0.05)


def test_no_positive_means_a_clear_error(tiny_history: History) -> None:
    sp = tiny_history.splits["train"]
    saved = sp.ttf_s
    try:
        sp.ttf_s = np.full_like(saved, np.inf)
        with pytest.raises(ValueError, match="no positive"):
            train_lstm(tiny_history, TrainConfig.small(epochs=1))
    finally:
        sp.ttf_s = saved


def test_train_config_validation() -> None:
    with pytest.raises(ValueError, match="epochs"):
        TrainConfig(epochs=0)
    assert torch.get_num_threads() >= 1


def test_occlusion_names_the_features_that_drive_the_risk_newest_value_first() -> None:
    # risk rises with feature 2's newest value and feature 5's window mean; feature 0 is
    # missing (NaN), so it drove nothing and is never named
    def risk(w: np.ndarray) -> np.ndarray:
        return np.nan_to_num(0.5 * w[:, -1, 2] + 0.2 * w[:, :, 5].mean(axis=1))

    w = np.zeros((2, 4, 6))
    w[:, :, 2] = [[0, 0, 0, 1.5], [0, 0, 0, 0.1]]
    w[:, :, 5] = [[1, 1, 1, 1], [2, 2, 2, 2]]
    w[:, :, 0] = np.nan
    names = [f"f{j}" for j in range(6)]
    top = occlusion_top_features(risk, w, np.zeros(6), names, k=2)
    assert top == [{"f2": 1.5, "f5": 1.0}, {"f5": 2.0, "f2": 0.1}]
    assert [list(t) for t in top] == [["f2", "f5"], ["f5", "f2"]]  # the larger drop first
    assert "f0" not in occlusion_top_features(risk, w, np.zeros(6), names, k=6)[0]
    assert occlusion_top_features(risk, w[:0], np.zeros(6), names) == []


def test_trained_trees_explain_their_risk_with_training_medians(tiny_outcome) -> None:
    g = tiny_outcome.gbt
    assert g.fill.shape == (N_FEATURES,) and np.isfinite(g.fill).any()
    w = np.random.default_rng(0).normal(size=(3, g.window, N_FEATURES)).astype(np.float32)
    top = g.top_features(w, k=3)
    assert len(top) == 3 and all(len(t) == 3 and set(t) <= set(FEATURES) for t in top)
    # each named feature's value is the newest bucket's
    j = FEATURES.index(next(iter(top[0])))
    assert next(iter(top[0].values())) == round(float(w[0, -1, j]), 4)
