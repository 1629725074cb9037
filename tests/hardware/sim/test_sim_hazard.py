from __future__ import annotations

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
    years = 40
    a = H.fleet_schedule(5, 100, model, years * 365 * DAY)
    b = H.fleet_schedule(5, 100, model, years * 365 * DAY)
    assert a == b
    assert H.fleet_schedule(6, 100, model, 365 * DAY) != H.fleet_schedule(5, 100, model, 365 * DAY)
    lemons, sched = a
    n = sum(len(v) for v in sched.values())
    expected = model.mean_device_rate_per_day() * 100 * years * 365
    assert n == pytest.approx(expected, rel=0.2)
    kinds = Counter(d.kind for v in sched.values() for d in v)
    assert kinds["xid79"] + kinds["ecc-uncorrectable"] == pytest.approx(0.4 * n, rel=0.25)
    for v in sched.values():
        assert all(x.onset_s < y.onset_s for x, y in zip(v, v[1:], strict=False))
        for d in v:
            assert (d.lead_s == 0) == d.abrupt
            if d.kind == "hbm":
                assert 2 * 3600 <= d.lead_s <= 14 * DAY and d.final_xid in H.HBM_FINAL_XIDS


def test_lemons_fail_much_more() -> None:
    model = H.HazardModel()
    lemons, sched = H.fleet_schedule(11, 200, model, 30 * 365 * DAY)
    assert len(lemons) == 10
    per_lemon = sum(len(sched[i]) for i in lemons) / len(lemons)
    per_other = sum(len(v) for i, v in sched.items() if i not in lemons) / (200 - len(lemons))
    assert per_lemon > 8 * per_other
    # Lemons carry a large share of all failures although they are 5 % of devices.
    total = sum(len(v) for v in sched.values())
    assert sum(len(sched[i]) for i in lemons) > 0.35 * total


def test_no_rate_no_faults() -> None:
    model = H.HazardModel(rate_per_node_day=0.0)
    _, sched = H.fleet_schedule(1, 5, model, 1e9)
    assert all(v == [] for v in sched.values())
