"""Event-level figures on a hand-made split where every number is known."""

from __future__ import annotations

import numpy as np
import pytest
from gpuflow.tasks.health.evaluate import episodes, evaluate_scores, random_threshold_for
from gpuflow.tasks.health.history import SplitData

B = 300.0
W = 2


def make_split() -> SplitData:
    """Segment 0: an hbm incident failing at t=3000 (windows end 300..3000 step 300);
    segment 1: an xid79 incident failing at t=13000 (windows end 10300..13000);
    segment 2: a background segment of 10 windows, each standing for 100."""
    t0 = np.arange(1, 11) * B
    t1 = 10_000 + np.arange(1, 11) * B
    t2 = 50_000 + np.arange(1, 11) * B
    t_end = np.concatenate([t0, t1, t2])
    ttf = np.concatenate([3000 - t0, 13_000 - t1, np.full(10, np.inf)])
    seg = np.repeat([0, 1, 2], 10)
    weight = np.concatenate([np.ones(20), np.full(10, 100.0)])
    n = 30
    return SplitData(
        name="t",
        buckets=np.zeros((n + W, 20), np.float32),
        end_row=np.arange(n) + W - 1,
        t_end_s=t_end,
        ttf_s=ttf,
        seg=seg,
        weight=weight,
        seg_ordinal=np.array([0, 1, 2]),
        seg_kind=np.array([0, 0, 1]),
        seg_fault=np.array([0, 1, -1]),
        fail_ordinal=np.array([0, 1]),
        fail_kind=np.array(["hbm", "xid79"]),
        fail_s=np.array([3000.0, 13_000.0]),
        fail_onset_s=np.array([0.0, 13_000.0]),
        fail_lemon=np.array([False, False]),
        device_days=10.0,
        background_device_days=9.0,
        sampled_background_device_days=0.1,
        window=W,
    )


def test_episodes_split_at_segment_borders() -> None:
    alarm = np.array([1, 1, 0, 1, 1, 1, 0, 0], bool)
    seg = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    s, e = episodes(alarm, seg)
    assert s.tolist() == [0, 3, 4] and e.tolist() == [1, 3, 5]


def test_known_figures() -> None:
    sp = make_split()
    scores = np.zeros(30)
    # hbm: in alarm from t=1500 (ttf 1500) to the end: detected, lead 1500 s
    scores[4:10] = 0.9
    # xid79: an early alarm at t=10600 that stops (false), nothing in its window
    scores[11] = 0.9
    # background: one episode of two windows -> 1 sampled false alarm standing for 100
    scores[25:27] = 0.9
    r = evaluate_scores("m", sp, scores, 0.85, horizon_s=1800.0, lead_min_s=300.0)
    m = r.metrics
    assert m["detected"] == 1 and m["recall"] == 0.5
    assert m["true_alarms"] == 1
    assert m["false_alarms"] == pytest.approx(1 + 100)
    assert m["precision"] == pytest.approx(1 / 102)
    assert m["fa_per_1000_device_days"] == pytest.approx(101 / 10.0 * 1000)
    assert r.lead_times_s.tolist() == [1500.0]
    assert r.by_class["hbm"]["recall"] == 1.0 and r.by_class["xid79"]["recall"] == 0.0
    assert r.by_class["xid79"]["abrupt"] == 1.0
    assert m["recall_precursor_classes"] == 1.0 and m["recall_abrupt_classes"] == 0.0
    # alert rate: population-weighted share of windows in alarm
    assert m["alert_rate"] == pytest.approx((6 + 1 + 200) / (20 + 1000))


def test_an_early_alarm_that_lasts_counts_with_its_lead() -> None:
    sp = make_split()
    scores = np.zeros(30)
    scores[0:10] = 1.0  # on from the first window (ttf 2700) to the failure
    r = evaluate_scores("m", sp, scores, 0.5, horizon_s=1800.0, lead_min_s=300.0)
    assert r.metrics["true_alarms"] == 1 and r.metrics["false_alarms"] == 0
    assert r.lead_times_s.tolist() == [2700.0]


def test_alarm_too_late_is_a_miss() -> None:
    sp = make_split()
    scores = np.zeros(30)
    scores[9] = 1.0  # ttf 0 < lead_min
    r = evaluate_scores("m", sp, scores, 0.5, horizon_s=1800.0, lead_min_s=300.0)
    assert r.metrics["detected"] == 0 and r.metrics["false_alarms"] == 1


def test_perfect_scores_and_flat_metrics() -> None:
    sp = make_split()
    y = sp.labels(1800.0)
    r = evaluate_scores("oracle", sp, y, 0.5, horizon_s=1800.0, lead_min_s=300.0)
    assert r.metrics["precision"] == 1.0 and r.metrics["recall"] == 1.0
    assert r.metrics["pr_auc"] == pytest.approx(1.0)
    flat = r.flat_metrics()
    assert flat["oracle_recall_xid79"] == 1.0 and "oracle_pr_auc" in flat


def test_bad_input() -> None:
    sp = make_split()
    with pytest.raises(ValueError, match="30 windows"):
        evaluate_scores("m", sp, np.zeros(3), 0.5, 1800.0)
    with pytest.raises(ValueError, match="lead_min_s"):
        evaluate_scores("m", sp, np.zeros(30), 0.5, 1800.0, lead_min_s=1800.0)
    with pytest.raises(ValueError):
        random_threshold_for(1.5)
    assert random_threshold_for(0.25) == 0.75


def test_a_cordon_hold_acts_once_per_device_until_it_lapses() -> None:
    """Background segment 2 flickers: episodes start at t=50300, 50900, 51500 and 52700.
    A 1,000-s cordon from the first covers the second; the third starts after it lapsed
    and is acted on; the fourth starts 1,200 s after the third, past its cordon too."""
    from gpuflow.tasks.health.champion import decision_cost
    from gpuflow.tasks.health.evaluate import alarm_episodes

    sp = make_split()
    scores = np.zeros(30)
    scores[[20, 22, 24, 28]] = 0.9  # background windows ending 50300, 50900, 51500, 52700
    scores[0] = 0.9  # segment 0: its own device, its own cordon
    ep = alarm_episodes(sp, scores, 0.5, 3600.0, hold_s=1000.0)
    assert ep.start_s.tolist() == [300.0, 50_300.0, 50_900.0, 51_500.0, 52_700.0]
    assert ep.acted.tolist() == [True, True, False, True, True]
    assert alarm_episodes(sp, scores, 0.5, 3600.0).acted.all()  # no hold: every one moves
    # A hold that covers the whole segment: one move in it (each standing for 100).
    one = alarm_episodes(sp, scores, 0.5, 3600.0, hold_s=10_000.0)
    assert one.acted.tolist() == [True, True, False, False, False]
    # The cost counts acted episodes only: 4 x 100 background moves without a hold, 1 x 100.
    free = decision_cost("m", sp, scores, 3600.0, threshold=0.5)
    held = decision_cost("m", sp, scores, 3600.0, threshold=0.5, hold_s=10_000.0)
    assert free.alarms == pytest.approx(401.0) and held.alarms == pytest.approx(101.0)
    with pytest.raises(ValueError, match="hold_s"):
        alarm_episodes(sp, scores, 0.5, 3600.0, hold_s=-1.0)
