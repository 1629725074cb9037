"""tasks.health.uncertainty: bootstrap intervals over devices and seeds, net GPU-hours
saved, the few-events flag, the sweep's crossover. Hand-built splits: no training."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gpuflow.tasks.health import uncertainty as u
from gpuflow.tasks.health.calibration import brier, ece
from gpuflow.tasks.health.evaluate import CLASSES, AlarmEpisodes

COSTS = u.ActCosts(per_alarm_gpu_s=100.0, per_failure_gpu_s=1000.0)


def episodes(ordinal, true, weight=None, background=None, detected=()) -> AlarmEpisodes:
    n = len(ordinal)
    return AlarmEpisodes(
        ordinal=np.asarray(ordinal, dtype=np.int64),
        start_s=np.zeros(n),
        weight=np.ones(n) if weight is None else np.asarray(weight, dtype=float),
        true=np.asarray(true, dtype=bool),
        background=np.zeros(n, bool) if background is None else np.asarray(background, bool),
        detected=np.asarray(detected, dtype=bool),
        lead_s=np.zeros(len(detected)),
        acted=np.ones(n, bool),
    )


def tiny() -> tuple[u.SplitFacts, dict[str, u.ModelRun]]:
    """Two devices over 2 device-days: device 10 fails (hbm) and is caught by a true
    alarm; device 11 fails (thermal), missed, and raises a background false alarm that
    stands for 3."""
    facts = u.SplitFacts(
        devices=np.array([10, 11]),
        device_days=2.0,
        fail_ordinal=np.array([10, 11]),
        fail_kind=np.array(["hbm", "thermal"]),
        window_ordinal=np.array([10, 10, 11, 11]),
        window_weight=np.array([1.0, 1.0, 2.0, 4.0]),
    )
    ep = episodes([10, 11], [True, False], [1.0, 3.0], [False, True], [True, False])
    run = u.ModelRun(ep, np.array([0.9, 0.2, 0.05, 0.5]), np.array([1.0, 0.0, 0.0, 1.0]))
    return facts, {"m": run}


def test_tiny_case_figures_are_exact() -> None:
    facts, runs = tiny()
    rows = u.device_rows(facts, runs)
    cols = u.columns(["m"])
    f = {k: float(v) for k, v in u.figures(rows.sum(axis=0), cols, "m", COSTS).items()}
    # saved = 1 detected x 1000 - (1 true + 3 false) alarms x 100 = 600 GPU-s over 2 dd
    assert f["net_saved_gpu_h_per_1000_dd"] == pytest.approx(600.0 / 3600.0 / 2.0 * 1000.0)
    assert f["precision"] == pytest.approx(0.25)
    assert f["fa_per_1000_dd"] == pytest.approx(1500.0)
    assert f["recall_hbm"] == 1.0 and f["recall_thermal"] == 0.0 and f["recall"] == 0.5
    assert math.isnan(f["recall_xid79"])
    p, y, w = runs["m"].risk, runs["m"].label, facts.window_weight
    assert f["brier"] == pytest.approx(brier(y, p, w))
    assert f["ece"] == pytest.approx(ece(y, p, w))


def test_reference_costs_match_the_champion_rule() -> None:
    from gpuflow.tasks.health.champion import reference_costs

    job = reference_costs().jobs[0]
    c = u.ActCosts.reference()
    assert c.per_alarm_gpu_s == job.gang_gpus * (job.checkpoint_save_s + job.relaunch_s)
    assert c.per_failure_gpu_s == pytest.approx(
        job.gang_gpus * (job.checkpoint_every_s / 2.0 + job.restart_s)
    )


def test_unknown_device_is_refused() -> None:
    facts, runs = tiny()
    bad = u.SplitFacts(**{**facts.__dict__, "fail_ordinal": np.array([10, 99])})
    with pytest.raises(ValueError, match="99"):
        u.device_rows(bad, runs)


def synthetic_rows(n_dev: int, seed: int, fail_p: float = 0.5) -> np.ndarray:
    """A split of ``n_dev`` devices: each fails with ``fail_p`` (random class), caught with
    0.6, plus Poisson false alarms; three windows per device."""
    rng = np.random.default_rng(seed)
    devices = np.arange(n_dev)
    fails = devices[rng.random(n_dev) < fail_p]
    kinds = rng.choice(np.array(CLASSES), len(fails))
    detected = rng.random(len(fails)) < 0.6
    n_false = rng.poisson(0.5, n_dev)
    ordinal = np.concatenate([fails[detected], np.repeat(devices, n_false)])
    true = np.concatenate([np.ones(detected.sum(), bool), np.zeros(n_false.sum(), bool)])
    facts = u.SplitFacts(
        devices=devices,
        device_days=float(n_dev),
        fail_ordinal=fails,
        fail_kind=kinds,
        window_ordinal=np.repeat(devices, 3),
        window_weight=np.ones(3 * n_dev),
    )
    p = rng.random(3 * n_dev) * 0.2
    y = (rng.random(3 * n_dev) < p).astype(float)
    run = u.ModelRun(episodes(ordinal, true, detected=detected), p, y)
    return u.device_rows(facts, {"m": run})


FIGS = ("recall", "precision", "fa_per_1000_dd", "net_saved_gpu_h_per_1000_dd", "brier", "ece")


def test_intervals_contain_the_point_and_pool_seeds() -> None:
    s = u.study([synthetic_rows(300, 1), synthetic_rows(300, 2)], ["m"], COSTS, resamples=400)
    assert s.seeds == 2 and s.devices == 600 and s.device_days == 600.0
    for fig in FIGS:
        c = s.table["m"][fig]
        assert c["lo"] <= c["mean"] <= c["hi"], fig
        assert c["hi"] > c["lo"], fig


def test_intervals_widen_with_fewer_devices() -> None:
    big = u.study([synthetic_rows(1000, 3)], ["m"], COSTS, resamples=400)
    small = u.study([synthetic_rows(60, 3)], ["m"], COSTS, resamples=400)
    for fig in ("recall", "precision", "fa_per_1000_dd", "net_saved_gpu_h_per_1000_dd"):
        width = {
            k: s.table["m"][fig]["hi"] - s.table["m"][fig]["lo"]
            for k, s in (("b", big), ("s", small))
        }
        assert width["s"] > 2 * width["b"], fig


def test_few_events_are_flagged_and_printed() -> None:
    s = u.study([synthetic_rows(30, 4, fail_p=0.3)], ["m"], COSTS, resamples=100)
    rec = s.table["m"]["recall_hbm"]
    assert rec["n"] < u.MIN_EVENTS and rec["few"]
    assert f"n={rec['n']} <20" in u.fmt(rec)
    many = u.study([synthetic_rows(400, 4)], ["m"], COSTS, resamples=100).table["m"]["recall"]
    assert many["n"] >= u.MIN_EVENTS and not many["few"]
    assert "<20" not in u.fmt(many)


def test_bootstrap_is_deterministic() -> None:
    rows = [synthetic_rows(100, 5)]
    a = u.study(rows, ["m"], COSTS, resamples=200, boot_seed=7)
    b = u.study(rows, ["m"], COSTS, resamples=200, boot_seed=7)
    assert a.table == b.table


def d(mean: float, lo: float, hi: float) -> dict[str, float]:
    return {"mean": mean, "lo": lo, "hi": hi}


def test_verdict_and_crossover() -> None:
    assert u.verdict(d(5, 1, 9)) == "better"
    assert u.verdict(d(-5, -9, -1)) == "worse"
    assert u.verdict(d(1, -1, 3)) == "no difference"
    settings = [
        ("quiet", {"gbt": d(-4, -6, -2), "lstm": d(3, 1, 5)}),
        ("default", {"gbt": d(0, -1, 1), "lstm": d(4, 2, 6)}),
        ("noisy", {"gbt": d(5, 2, 8), "lstm": d(5, 3, 7)}),
    ]
    text = u.crossover(settings)
    assert "gbt vs rules: crossover worse at quiet -> no difference at default" in text
    assert "lstm vs rules: no crossover, better at every setting" in text


def test_paired_difference_of_a_model_with_itself_is_zero() -> None:
    rows = synthetic_rows(200, 6)
    both = np.concatenate([rows, rows[:, len(u.columns([])) :]], axis=1)
    s = u.study([both], ["a", "b"], COSTS, resamples=200)
    diff = u.difference(s, "a", "b", "net_saved_gpu_h_per_1000_dd")
    assert diff == {"mean": 0.0, "lo": 0.0, "hi": 0.0}


def test_bench_rows_agree_with_evaluate_and_the_cost_rule(tiny_history, tiny_outcome) -> None:
    """On a trained tiny fleet, the bootstrap's point figures are evaluate.py's and
    champion.decision_cost's, model by model at the same operating point."""
    from gpuflow.tasks.health.champion import decision_cost, decision_threshold
    from gpuflow.tasks.health.evaluate import evaluate_scores
    from gpuflow.tasks.health.pipeline import score_split

    from gpuflow.bench.health_bench import MODELS, seed_rows

    s = u.study([seed_rows(tiny_history, tiny_outcome)], MODELS, resamples=50)
    test = tiny_history.splits["test"]
    for m in ("rules", "gbt", "lstm"):
        h = tiny_outcome.horizons[m]
        t = 0.5 if m == "rules" else decision_threshold(h)
        r = score_split(tiny_outcome.model(m), test)
        e = evaluate_scores(m, test, r, t, h).metrics
        row = s.table[m]
        cost = decision_cost(m, test, r, h, threshold=t)
        assert row["net_saved_gpu_h_per_1000_dd"]["mean"] == pytest.approx(
            cost.saved_gpu_h_per_1000_dd
        )
        assert row["recall"]["mean"] == pytest.approx(e["recall"])
        assert row["fa_per_1000_dd"]["mean"] == pytest.approx(e["fa_per_1000_device_days"])
        if not math.isnan(e["precision"]):
            assert row["precision"]["mean"] == pytest.approx(e["precision"])
    assert s.table["oracle"]["recall"]["mean"] >= s.table["rules"]["recall"]["mean"]
    assert s.table["oracle"]["brier"]["mean"] == 0.0


def test_a_priced_cordon_charges_acted_false_alarms_only() -> None:
    """tiny(): the background false alarm (standing for 3) costs its cordon K each; an
    episode under an earlier one's cordon (not acted) is neither an alarm nor a cost."""
    facts, runs = tiny()
    cols = u.columns(["m"])
    priced = u.ActCosts(per_alarm_gpu_s=100.0, per_failure_gpu_s=1000.0, per_false_alarm_gpu_s=50)
    f = u.figures(u.device_rows(facts, runs).sum(axis=0), cols, "m", priced)
    # 1 x 1000 - 4 x 100 - 3 x 50 = 450 GPU-s over 2 device-days
    assert float(f["net_saved_gpu_h_per_1000_dd"]) == pytest.approx(450.0 / 3600.0 / 2.0 * 1000.0)
    ep = runs["m"].episodes
    joined = AlarmEpisodes(**{**ep.__dict__, "acted": np.array([True, False])})
    rows = u.device_rows(facts, {"m": u.ModelRun(joined, runs["m"].risk, runs["m"].label)})
    g = u.figures(rows.sum(axis=0), cols, "m", priced)
    assert float(g["fa_per_1000_dd"]) == 0.0 and float(g["precision"]) == 1.0
    assert float(g["net_saved_gpu_h_per_1000_dd"]) == pytest.approx(900.0 / 3600.0 / 2.0 * 1000.0)


def test_reference_costs_carry_the_cordon_price() -> None:
    from gpuflow.tasks.health.decision import CostDefaults

    c = u.ActCosts.reference(CostDefaults(cordon_hold_s=7200.0, cordon_price=0.25))
    assert c.per_false_alarm_gpu_s == 1800.0
    assert u.ActCosts.reference().per_false_alarm_gpu_s == 0.0


def test_bench_rows_under_a_priced_cordon_agree_with_the_cost_rule(
    tiny_history, tiny_outcome
) -> None:
    """The cordon sweep's rows: thresholds at (A + K) / (F + K), episodes under a standing
    cordon not acted on, K per false alarm - as champion.decision_cost prices them."""
    from gpuflow.tasks.health.champion import decision_cost, decision_threshold, reference_costs
    from gpuflow.tasks.health.decision import CostDefaults
    from gpuflow.tasks.health.pipeline import score_split

    from gpuflow.bench.health_bench import MODELS, seed_rows

    d = CostDefaults(cordon_hold_s=4 * 3600.0, cordon_price=0.5)
    costs = reference_costs(d)
    s = u.study([seed_rows(tiny_history, tiny_outcome, d)], MODELS, u.ActCosts.reference(d), 50)
    free = u.study([seed_rows(tiny_history, tiny_outcome)], MODELS, resamples=50)
    test = tiny_history.splits["test"]
    for m in ("rules", "gbt", "lstm"):
        h = tiny_outcome.horizons[m]
        t = 0.5 if m == "rules" else decision_threshold(h, costs)
        if m != "rules":
            assert t > decision_threshold(h)
        r = score_split(tiny_outcome.model(m), test)
        cost = decision_cost(m, test, r, h, costs=costs, threshold=t, hold_s=d.cordon_hold_s)
        assert s.table[m]["net_saved_gpu_h_per_1000_dd"]["mean"] == pytest.approx(
            cost.saved_gpu_h_per_1000_dd
        )
    # The rules alarm the same; held, they move no more often than unheld.
    assert (
        s.table["rules"]["fa_per_1000_dd"]["mean"] <= free.table["rules"]["fa_per_1000_dd"]["mean"]
    )
