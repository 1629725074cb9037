"""The decision by cost (tasks.health.decision): plain functions, no Prefect, no inventory."""

from __future__ import annotations

import math

import pytest
from gpuflow.tasks.health.decision import (
    ACT,
    DRAIN,
    DRAIN_RISK,
    WATCH,
    CostDefaults,
    DeviceCosts,
    JobCosts,
    decide,
    most_urgent,
)

HOUR = 3600.0


def job(
    since_s: float = HOUR,
    gang: int = 8,
    save_s: float = 120.0,
    restart_s: float = 600.0,
    relaunch_s: float = 300.0,
    every_s: float | None = None,
    job_id: str = "j",
) -> JobCosts:
    return JobCosts(job_id, gang, since_s, save_s, restart_s, relaunch_s, every_s)


def on(*jobs: JobCosts, room: bool | None = True) -> DeviceCosts:
    return DeviceCosts(jobs=jobs, room_elsewhere=room)


def break_even(costs: DeviceCosts, horizon_s: float = 1800.0) -> float:
    d = decide(0.0, horizon_s, costs)
    assert d.break_even_risk is not None
    return d.break_even_risk


def test_break_even_falls_as_lost_work_grows_and_rises_with_checkpoint_cost() -> None:
    by_since = [break_even(on(job(since_s=s))) for s in (0.0, 600.0, HOUR, 6 * HOUR, 24 * HOUR)]
    assert by_since == sorted(by_since, reverse=True) and len(set(by_since)) == len(by_since)
    by_save = [break_even(on(job(save_s=c))) for c in (10.0, 120.0, 600.0, 1800.0)]
    assert by_save == sorted(by_save) and len(set(by_save)) == len(by_save)
    # A longer horizon: more work done before the failure, so a lower break-even.
    assert break_even(on(job()), 4 * HOUR) < break_even(on(job()), 1800.0)
    # The numbers: (C + M) / (since + h/2 + R) for one job.
    assert break_even(on(job(since_s=HOUR))) == pytest.approx(420.0 / (3600 + 900 + 600), 1e-5)


def test_a_big_gang_an_hour_after_its_checkpoint_is_acted_on_far_below_the_drain_level() -> None:
    costs = on(job(since_s=HOUR, gang=64))
    d = decide(0.12, 1800.0, costs, model="lstm@champion")
    assert d.action == ACT and d.decided_by == "cost rule" and d.remediates
    assert d.break_even_risk == pytest.approx(0.0824, abs=1e-3) and d.level < DRAIN_RISK / 10
    # GPU-seconds: 64 GPUs x (lost work + restart), 64 x (checkpoint + relaunch).
    assert d.failure_cost_gpu_s == pytest.approx(64 * (3600 + 900 + 600))
    assert d.act_cost_gpu_s == pytest.approx(64 * 420)
    assert d.expected_loss_gpu_s == pytest.approx(0.12 * 64 * 5100)
    assert d.model == "lstm@champion" and d.horizon_s == 1800.0
    assert "lstm@champion" in d.summary() and "30 min" in d.summary()
    # Below its break-even: watched, with the same numbers.
    low = decide(0.05, 1800.0, costs)
    assert low.action == WATCH and low.decided_by == "cost rule" and not low.remediates


def test_with_the_projects_constants_acting_pays_from_about_one_percent() -> None:
    """The issue's figure: an 8-GPU job at the middle of its Young/Daly period (DESIGN.md 4
    rates, C = 2 min, R = 10 min, M = 5 min) breaks even near 1 %."""
    defaults = CostDefaults()
    t = defaults.young_daly_s(8)
    assert 15 * HOUR < t < 25 * HOUR
    typical = on(job(since_s=t / 2))
    assert 0.005 < break_even(typical) < 0.02


def test_an_idle_device_is_not_migrated_and_is_drained_at_the_drain_level_only() -> None:
    idle = DeviceCosts()
    watch = decide(0.6, 1800.0, idle)
    assert watch.action == WATCH and watch.break_even_risk is None
    assert watch.expected_loss_gpu_s == 0 and watch.act_cost_gpu_s == 0
    assert "idle" in watch.why and watch.level == DRAIN_RISK
    assert decide(0.9, 1800.0, idle).action == DRAIN
    # Jobs not known (no inventory): the same levels, and the decision says why.
    unknown = decide(0.6, 1800.0, None)
    assert unknown.action == WATCH and "not looked up" in unknown.why


def test_the_drain_level_drains_whatever_the_costs() -> None:
    dear = on(job(since_s=0.0, save_s=10 * 24 * HOUR))  # acting would cost ten days
    assert decide(0.84, 1800.0, dear).action == WATCH
    d = decide(DRAIN_RISK, 1800.0, dear)
    assert d.action == DRAIN and d.decided_by == "drain level"
    lost = decide(0.0, 1800.0, dear, forced="device lost")
    assert lost.action == DRAIN and lost.decided_by == "device lost"
    # The drain level is a parameter (the CLI's --threshold).
    assert decide(0.5, 1800.0, dear, drain_risk=0.5).action == DRAIN


def test_no_room_elsewhere_makes_the_move_cost_a_restart() -> None:
    with_room = decide(0.1, 1800.0, on(job(), room=True))
    without = decide(0.1, 1800.0, on(job(), room=False))
    assert without.act_cost_gpu_s == pytest.approx(8 * (120 + 600))
    assert without.break_even_risk > with_room.break_even_risk
    assert "no free or spare unit" in without.jobs[0]["sources"]["relaunch_s"]


def test_several_jobs_on_one_device_add_up() -> None:
    a, b = job(job_id="a", gang=1, since_s=0.0), job(job_id="b", gang=7, since_s=2 * HOUR)
    d = decide(0.05, 1800.0, on(a, b))
    assert d.act_cost_gpu_s == pytest.approx(8 * 420)
    assert d.failure_cost_gpu_s == pytest.approx(1 * 1500 + 7 * (7200 + 1500))
    assert [j["job_id"] for j in d.jobs] == ["a", "b"]


def test_a_known_checkpoint_period_bounds_the_lost_work() -> None:
    periodic = job(since_s=100.0, every_s=300.0)
    lost = periodic.lost_work_s(1800.0)
    assert lost <= 300.0 and lost == pytest.approx(150.0, abs=5.0)  # wraps every period
    assert job(since_s=100.0).lost_work_s(1800.0) == pytest.approx(100.0 + 900.0)


@pytest.mark.parametrize(
    "field",
    ["since_checkpoint_s", "checkpoint_save_s", "restart_s", "relaunch_s", "checkpoint_every_s"],
)
@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "5", True])
def test_bad_cost_input_is_refused_naming_the_field(field: str, bad: object) -> None:
    values = {
        "since_checkpoint_s": 1.0,
        "checkpoint_save_s": 1.0,
        "restart_s": 1.0,
        "relaunch_s": 1.0,
        "checkpoint_every_s": 60.0,
    }
    with pytest.raises(ValueError, match=field):
        JobCosts("j", 8, **{**values, field: bad})  # type: ignore[arg-type]


def test_bad_decision_input_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="gang_gpus"):
        JobCosts("j", 0, 1.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="risk"):
        decide(math.nan, 1800.0)
    with pytest.raises(ValueError, match="risk"):
        decide(1.5, 1800.0)
    with pytest.raises(ValueError, match="horizon_s"):
        decide(0.1, 0.0)
    with pytest.raises(ValueError, match="drain_risk"):
        decide(0.1, 1800.0, drain_risk=0.0)
    with pytest.raises(ValueError, match="restart_s"):
        CostDefaults.of({"restart_s": -5})
    with pytest.raises(ValueError, match="checkpoint_save_s"):
        CostDefaults.of({"checkpoint_save_s": math.nan})
    with pytest.raises(ValueError, match="unknown cost field"):
        CostDefaults.of({"restart_minutes": 5})
    assert CostDefaults.of({"restart_s": 900}).restart_s == 900.0


def test_most_urgent_of_several_horizons() -> None:
    costs = on(job())
    short = decide(0.02, 1800.0, costs)  # watch: below its break-even
    long = decide(0.40, 6 * HOUR, costs)  # act
    assert (short.action, long.action) == (WATCH, ACT)
    assert most_urgent([short, long]) is long
    assert most_urgent([long, decide(0.9, 1800.0, costs)]).action == DRAIN
    with pytest.raises(ValueError):
        most_urgent([])


def test_a_priced_cordon_raises_the_break_even_to_a_plus_k_over_f_plus_k() -> None:
    base = on(job(since_s=HOUR))
    d0 = decide(0.0, 1800.0, base)
    a, f = d0.act_cost_gpu_s, d0.failure_cost_gpu_s
    k = CostDefaults(cordon_hold_s=4 * HOUR, cordon_price=0.5).cordon_gpu_s()
    assert k == 2 * HOUR
    priced = DeviceCosts(jobs=base.jobs, room_elsewhere=True, cordon_gpu_s=k)
    assert break_even(priced) == pytest.approx((a + k) / (f + k), 1e-5)
    assert break_even(priced) > break_even(base)
    # Between the two break-evens the priced cordon turns an action into watching.
    risk = (break_even(base) + break_even(priced)) / 2
    assert decide(risk, 1800.0, base).action == ACT
    watched = decide(risk, 1800.0, priced)
    assert watched.action == WATCH and "the cordon's" in watched.why
    assert watched.cordon_gpu_s == k
    # An idle device has nothing to save: its cordon is not weighed.
    idle = decide(0.5, 1800.0, DeviceCosts(jobs=(), room_elsewhere=True, cordon_gpu_s=k))
    assert idle.action == WATCH and idle.break_even_risk is None and idle.cordon_gpu_s == 0


def test_cordon_costs_are_checked_and_name_the_field() -> None:
    assert CostDefaults.of({"cordon_hold_s": 600, "cordon_price": 1}).cordon_gpu_s() == 600.0
    with pytest.raises(ValueError, match="cordon_price"):
        CostDefaults(cordon_price=1.5)
    with pytest.raises(ValueError, match="cordon_hold_s"):
        CostDefaults.of({"cordon_hold_s": -1})
    with pytest.raises(ValueError, match="cordon_gpu_s"):
        DeviceCosts(cordon_gpu_s=float("nan"))
