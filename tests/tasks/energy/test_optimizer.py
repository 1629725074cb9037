"""SettingSearch: what it probes and what it chooses, on curves whose optimum is known."""

from __future__ import annotations

import math

import pytest
from gpuflow.tasks.energy.optimizer import (
    Measurement,
    Objective,
    SettingSearch,
    search,
    window_noise,
)

LIMITS = [100.0, 125.0, 150.0, 175.0, 200.0, 225.0, 250.0]


def capped_workload(draw_w: float, k: float, t0: float = 10.0):
    """A workload drawing ``draw_w`` unconstrained; under a lower limit p it runs at p and
    takes (draw/p)^k longer: the optimizer's own model family, so the optimum is known."""

    def measure(p: float) -> Measurement:
        power = min(draw_w, p)
        t = t0 * max(1.0, draw_w / p) ** k
        return Measurement(p, t, t * power)

    return measure


def best_within(measure, limits, slowdown):
    points = [measure(p) for p in limits]
    t0 = points[-1].time_s
    return min((p for p in points if p.time_s <= (1 + slowdown) * t0), key=lambda p: p.energy_j)


@pytest.mark.parametrize(("draw", "k"), [(240.0, 0.3), (200.0, 0.6), (160.0, 0.9), (120.0, 0.1)])
def test_finds_the_best_limit_within_the_bound_with_fewer_probes(draw: float, k: float) -> None:
    measure = capped_workload(draw, k)
    c = search(LIMITS, measure, Objective(slowdown=0.10))
    best = best_within(measure, LIMITS, 0.10)
    assert c.chosen.setting == best.setting
    assert c.slowdown <= 0.10 + 1e-12
    assert len(c.probes) < len(LIMITS)
    assert c.probes[0].setting == max(LIMITS)  # the reference comes first
    assert len({p.setting for p in c.probes}) == len(c.probes)  # nothing measured twice


def test_fitted_exponent_recovers_the_curve() -> None:
    s = SettingSearch(LIMITS, Objective(slowdown=0.5))
    measure = capped_workload(200.0, 0.7)
    while (p := s.next_probe()) is not None:
        s.tell(measure(p))
    assert s.exponent() == pytest.approx(0.7, abs=1e-9)
    assert s.predicted_time_ratio(100.0) == pytest.approx(2.0**0.7)


def test_a_choice_never_breaks_the_bound_on_what_was_measured() -> None:
    # Noisy, non-monotone times: the model is wrong here; the choice still holds.
    times = {
        100.0: 14.0,
        125.0: 10.5,
        150.0: 12.0,
        175.0: 10.2,
        200.0: 9.8,
        225.0: 10.0,
        250.0: 10.0,
    }

    def measure(p: float) -> Measurement:
        return Measurement(p, times[p], times[p] * min(p, 210.0))

    c = search(LIMITS, measure, Objective(slowdown=0.05))
    assert c.chosen.time_s <= 1.05 * 10.0
    measured = {p.setting for p in c.probes}
    assert c.chosen.setting in measured


def test_the_bound_of_zero_keeps_the_reference_when_everything_slows() -> None:
    c = search(LIMITS, capped_workload(260.0, 1.0), Objective(slowdown=0.0))
    assert c.chosen.setting == 250.0
    assert c.energy_saving == 0.0


def test_eta_zero_is_the_fastest_and_eta_one_descends_for_energy() -> None:
    measure = capped_workload(230.0, 0.5)
    fastest = search(LIMITS, measure, Objective(slowdown=None, eta=0.0))
    assert fastest.chosen.time_s == min(p.time_s for p in fastest.probes)
    assert fastest.chosen.time_s == pytest.approx(10.0)
    energy = search(LIMITS, measure, Objective(slowdown=None, eta=1.0))
    # E ~ p^(1-k) falls all the way down: it descends until its budget (fewer probes
    # than limits) ends, one step short of the lowest limit.
    assert len(energy.probes) == len(LIMITS) - 1
    assert energy.chosen.setting == 125.0
    assert energy.energy_saving == pytest.approx(1 - (125 / 230) ** 0.5)


def test_ask_tell_refuses_what_it_did_not_ask_for() -> None:
    s = SettingSearch(LIMITS)
    with pytest.raises(ValueError, match="highest setting 250 first"):
        s.tell(Measurement(100.0, 1.0, 1.0))
    s.tell(Measurement(250.0, 1.0, 200.0))
    with pytest.raises(ValueError, match="measured already"):
        s.tell(Measurement(250.0, 1.0, 200.0))
    with pytest.raises(ValueError, match="not one of the settings"):
        s.tell(Measurement(130.0, 1.0, 1.0))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"settings": []}, "settings must be positive"),
        ({"settings": [100.0, -5.0]}, "settings must be positive"),
        ({"settings": LIMITS, "knob": "volts"}, "knob must be"),
        ({"settings": LIMITS, "margin": 2.0}, "margin must be"),
    ],
)
def test_bad_search_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SettingSearch(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slowdown": None, "eta": None}, "exactly one"),
        ({"slowdown": 0.1, "eta": 0.5}, "exactly one"),
        ({"slowdown": -0.1}, "slowdown must be"),
        ({"slowdown": None, "eta": 1.5}, "eta must be"),
    ],
)
def test_bad_objectives_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Objective(**kwargs)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf])
def test_measurements_must_be_positive_numbers(bad: float) -> None:
    with pytest.raises(ValueError, match="time_s must be a positive number"):
        Measurement(100.0, bad, 1.0)


def test_drift_is_judged_at_the_chosen_setting() -> None:
    c = search(LIMITS, capped_workload(200.0, 0.5), Objective(slowdown=0.10))
    same = Measurement(c.chosen.setting, c.chosen.time_s * 1.05, c.chosen.energy_j * 1.05)
    moved = Measurement(c.chosen.setting, c.chosen.time_s * 1.3, c.chosen.energy_j * 1.3)
    assert not c.drifted(same)
    assert c.drifted(moved)
    other = next(s for s in LIMITS if s != c.chosen.setting)
    with pytest.raises(ValueError, match="not the chosen setting"):
        c.drifted(Measurement(other, 1.0, 1.0))


def _noisy_reference(spread: float, t0: float = 10.0) -> list[Measurement]:
    """Three windows at the highest limit whose log times are 0, +spread, -spread."""
    return [Measurement(250.0, t0 * math.exp(x), 2500.0) for x in (0.0, spread, -spread)]


def test_a_noisy_reference_makes_a_near_bound_point_not_count() -> None:
    near = Measurement(225.0, 10.8, 2000.0)  # +8 %: within 10 % on a single reading
    quiet = SettingSearch(LIMITS, Objective(slowdown=0.10))
    quiet.tell_reference(_noisy_reference(0.0))
    quiet.tell(near)
    assert quiet.noise == 0.0 and quiet.choice().chosen.setting == 225.0
    noisy = SettingSearch(LIMITS, Objective(slowdown=0.10))
    noisy.tell_reference(_noisy_reference(0.03))  # one window's spread: 3 %
    noisy.tell(near)
    c = noisy.choice()
    assert c.noise == pytest.approx(0.03) and c.chosen.setting == 250.0
    assert noisy.bound_ratio() == pytest.approx(1.10 * math.exp(-math.sqrt(2) * 0.03))
    assert c.reference.time_s == pytest.approx(sum(m.time_s for m in _noisy_reference(0.03)) / 3)


def test_noise_larger_than_the_bound_keeps_the_highest_setting_without_probing() -> None:
    s = SettingSearch(LIMITS, Objective(slowdown=0.10))
    s.tell_reference(_noisy_reference(0.10))  # a 10 % slowdown cannot be told from noise
    assert s.next_probe() is None and s.choice().chosen.setting == 250.0


def test_drift_is_judged_against_the_noise_measured() -> None:
    s = SettingSearch(LIMITS, Objective(slowdown=0.10))
    s.tell_reference(_noisy_reference(0.10))
    c = s.choice()
    assert c.drift_tolerance(0.10) == pytest.approx(3 * math.sqrt(2) * 0.10)
    assert not c.drifted(Measurement(250.0, c.chosen.time_s * 1.3, c.chosen.energy_j * 1.3))
    assert c.drifted(Measurement(250.0, c.chosen.time_s * 1.6, c.chosen.energy_j * 1.6))
    assert window_noise(_noisy_reference(0.0)[:1]) == 0.0  # one window: nothing to tell


def test_a_faster_closing_reference_makes_the_bound_stricter_and_a_slower_one_does_not() -> None:
    # The reference read 5 % slow (a warm-up); 175 W is 8 % slower than the real pace.
    times = {250.0: 10.5, 200.0: 10.4, 175.0: 10.8}

    def searched(closing_s: float | None) -> SettingSearch:
        s = SettingSearch(LIMITS, Objective(slowdown=0.05), max_probes=3)
        for p in (250.0, 175.0, 200.0):
            s.tell(Measurement(p, times[p], times[p] * min(p, 240.0)))
        if closing_s is not None:
            s.tell_closing_reference(Measurement(250.0, closing_s, closing_s * 240.0))
        return s

    assert searched(None).choice().chosen.setting == 175.0  # within 5 % of 10.5
    faster = searched(10.0).choice()
    assert faster.reference == faster.closing and faster.chosen.setting == 200.0
    assert faster.slowdown == pytest.approx(0.04)
    slower = searched(11.0).choice()  # the opening reference stays the stricter one
    assert slower.reference.time_s == 10.5 and slower.chosen.setting == 175.0


def test_the_closing_reference_is_the_highest_setting_once_after_the_reference() -> None:
    s = SettingSearch(LIMITS)
    with pytest.raises(ValueError, match="measure the reference first"):
        s.tell_closing_reference(Measurement(250.0, 1.0, 200.0))
    s.tell(Measurement(250.0, 1.0, 200.0))
    with pytest.raises(ValueError, match="the highest setting 250"):
        s.tell_closing_reference(Measurement(200.0, 1.0, 200.0))
    s.tell_closing_reference(Measurement(250.0, 1.0, 200.0))
    with pytest.raises(ValueError, match="measured already"):
        s.tell_closing_reference(Measurement(250.0, 1.0, 200.0))
