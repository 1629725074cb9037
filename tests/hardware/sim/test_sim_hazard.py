from __future__ import annotations

import math
import statistics
from collections import Counter

import pytest
from gpuflow.hardware.sim import hazard as H

DAY = H.DAY_S


def test_class_mix_keeps_llama3_ratios_and_the_abrupt_share() -> None:
    model = H.HazardModel()
    mix = model.class_mix()
    assert sum(mix.values()) == pytest.approx(1.0)
    assert sum(mix[k] for k in H.ABRUPT_KINDS) == pytest.approx(0.40)
    assert mix["ecc-uncorrectable"] == pytest.approx(0.045 / 0.573)
    assert mix["thermal"] == pytest.approx(0.014 / 0.573)
    assert H.LLAMA3_PER_NODE_DAY == pytest.approx(3.79e-3, rel=1e-2)
    with pytest.raises(ValueError, match="abrupt_share"):
        H.HazardModel(abrupt_share=0.05)


def test_schedule_is_deterministic_and_calibrated() -> None:
    model = H.HazardModel()
    a = H.fleet_schedule(5, 100, model, 40 * 365 * DAY)
    assert a == H.fleet_schedule(5, 100, model, 40 * 365 * DAY)
    assert H.fleet_schedule(6, 100, model, 365 * DAY) != H.fleet_schedule(5, 100, model, 365 * DAY)
    # rate_per_node_day is a fresh fleet's: the first faults come at it (repeats add more).
    n_dev, years = 4000, 1
    lemons, sched = H.fleet_schedule(5, n_dev, model, years * 365 * DAY)
    rates = model.device_rates_per_day(n_dev, lemons)
    first = sum(1 for v in sched.values() if v)
    expected = sum(1 - math.exp(-r * 365 * years) for r in rates)
    assert first == pytest.approx(expected, rel=0.1)
    assert sum(rates) / n_dev == pytest.approx(model.mean_device_rate_per_day())
    all_draws = [d for v in a[1].values() for d in v]
    n = len(all_draws)
    kinds = Counter(d.kind for d in all_draws)
    assert kinds["xid79"] + kinds["ecc-uncorrectable"] == pytest.approx(0.4 * n, rel=0.25)
    for v in a[1].values():
        assert all(x.onset_s < y.onset_s for x, y in zip(v, v[1:], strict=False))
        for d in v:
            assert (d.lead_s == 0) == d.abrupt
            if d.kind == "hbm" and not d.abrupt:
                assert 2 * 3600 <= d.lead_s - d.stall_s <= 14 * DAY
                assert d.final_xid in H.HBM_FINAL_XIDS and d.errors_at_failure >= 5


def test_lemons_fail_much_more() -> None:
    model = H.HazardModel(lemon_fraction=0.05, lemon_factor=20.0, repeat_factor=1.0)
    lemons, sched = H.fleet_schedule(11, 200, model, 30 * 365 * DAY)
    assert len(lemons) == 10
    per_lemon = sum(len(sched[i]) for i in lemons) / len(lemons)
    per_other = sum(len(v) for i, v in sched.items() if i not in lemons) / (200 - len(lemons))
    assert per_lemon > 8 * per_other
    # Lemons carry a large share of all failures although they are 5 % of devices.
    total = sum(len(v) for v in sched.values())
    assert sum(len(sched[i]) for i in lemons) > 0.35 * total


def test_each_fault_raises_the_hazard_and_lemons_stay_lemons() -> None:
    """Lemon status survives repair (its multiplier holds at every k) and every fault
    raises the device's hazard by repeat_factor, up to repeat_cap."""
    model = H.HazardModel(repeat_factor=3.0, repeat_cap=20.0)
    assert [model.repeat_multiplier(k) for k in range(5)] == [1.0, 3.0, 9.0, 20.0, 20.0]
    assert model.repeat_multiplier(10_000) == 20.0  # no overflow for a long-lived lemon
    rate = 1e-3  # per day: the k-th gap is exponential at rate * multiplier(k)
    gaps: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for o in range(3000):
        prev = 0.0
        for k in range(3):
            d = H.draw_fault(7, o, k, prev, rate, model)
            assert d is not None
            gaps[k].append((d.onset_s - prev) / DAY)
            prev = d.onset_s
    for k, g in gaps.items():
        assert statistics.mean(g) == pytest.approx(1 / (rate * model.repeat_multiplier(k)), rel=0.1)
    lemons = frozenset({0})
    rates = model.device_rates_per_day(20, lemons)
    assert rates[0] == pytest.approx(model.lemon_factor * rates[1])


def test_a_share_of_hbm_failures_has_no_precursor_and_levels_vary() -> None:
    model = H.HazardModel(rate_per_node_day=0.5)
    _, sched = H.fleet_schedule(3, 400, model, 365 * DAY)
    hbm = [d for v in sched.values() for d in v if d.kind == "hbm"]
    silent = [d for d in hbm if d.lead_s == 0]
    assert len(silent) / len(hbm) == pytest.approx(model.hbm_silent_share, abs=0.04)
    levels = sorted(d.errors_at_failure for d in hbm if d.lead_s > 0)
    q = statistics.quantiles(levels, n=10)
    assert q[4] == pytest.approx(model.hbm_errors_median, rel=0.15)
    assert q[8] / q[4] > 3 and q[4] / q[0] > 3  # heavy-tailed both ways: no telltale count
    stalled = [d for d in hbm if d.stall_s > 0]
    assert len(stalled) / (len(hbm) - len(silent)) == pytest.approx(model.hbm_stall_share, abs=0.05)


def test_some_degradations_heal() -> None:
    model = H.HazardModel()
    heals = [h for o in range(3000) for h in H.healed_schedule(1, o, 0.05, model, 365 * DAY)]
    expected = 3000 * 0.05 * 365 * model.class_mix()["hbm"] * (1 - model.hbm_silent_share)
    assert len(heals) == pytest.approx(expected * model.hbm_heal_ratio, rel=0.1)
    assert all(0 < h.stop_at < 1 and h.lead_s > 0 for h in heals)


def test_no_rate_no_faults() -> None:
    model = H.HazardModel(rate_per_node_day=0.0)
    _, sched = H.fleet_schedule(1, 5, model, 1e9)
    assert all(v == [] for v in sched.values())
