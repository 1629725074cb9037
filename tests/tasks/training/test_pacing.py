"""Pacing a step to the device's time on the twin (tasks.training.pacing, and
DeviceUtilization.pace over a backend): max(host busy, pad x a running quantile of host busy x
T(f)/T(f_max)), kept per precision; real devices are not paced. No sleeping: time.sleep is
recorded, and the ratio comes from a backend the test sets."""

from __future__ import annotations

import random
import statistics

import pytest
from gpuflow.hardware.backend import Backend
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.training import utilization
from gpuflow.tasks.training.pacing import StepPacer
from gpuflow.tasks.training.utilization import DeviceUtilization


def test_a_step_shorter_than_the_devices_time_is_paced_to_reference_times_ratio() -> None:
    pacer = StepPacer(pad=1.5, quantile=0.5)
    for busy in (0.010, 0.012, 0.008, 0.010, 0.011):
        pacer.observe(busy)
    assert pacer.level_s() == pytest.approx(0.010)
    # median of the six: 0.010; reference 0.015; at T(f)/T(f_max) = 1.2 the device takes 18 ms
    assert pacer.step_s(0.009, 1.2) == pytest.approx(1.5 * 0.010 * 1.2)
    assert pacer.step_s(0.010, 1.0) == pytest.approx(0.015)  # at f_max: the reference


def test_a_step_longer_than_the_devices_time_is_not_padded() -> None:
    pacer = StepPacer(pad=1.5, quantile=0.5)
    for _ in range(9):
        pacer.observe(0.010)
    assert pacer.step_s(0.040, 1.1) == 0.040  # a host hiccup takes what it took
    assert pacer.level_s() == pytest.approx(0.010)  # and barely moves the median


def test_host_jitter_vanishes_under_the_padding() -> None:
    rng = random.Random(7)  # host busy ~ 6 ms +- 10 %, a few slow outliers
    jittery = [max(0.003, rng.gauss(0.006, 0.0006)) for _ in range(1000)]
    jittery[500:1000:50] = [0.012] * 10
    pacer = StepPacer(pad=1.5, quantile=0.5)
    steps = [pacer.step_s(b, 1.05) for b in jittery]
    device_s = 1.5 * 0.006 * 1.05
    for busy, step in list(zip(jittery, steps, strict=True))[300:]:
        if busy < 0.9 * device_s:  # nearly every step: the device's time, whatever the host's
            assert step == pytest.approx(device_s, rel=0.03)
        elif busy > 1.1 * device_s:  # a hiccup longer than the device's time: as it was
            assert step == busy
    assert statistics.pstdev(jittery) / statistics.mean(jittery) > 0.1  # the host's spread


def test_the_default_reference_does_not_follow_the_hosts_load() -> None:
    rng = random.Random(3)
    quiet = [rng.gauss(0.006, 0.0003) for _ in range(3000)]
    # Then other processes share the core: every other step loses a time slice of 4 ms.
    loaded = [b + (0.004 if i % 2 else 0.0) for i, b in enumerate(quiet[:1000])]
    default, median = StepPacer(), StepPacer(pad=1.5, window=255, quantile=0.5)
    for b in quiet:
        default.observe(b)
        median.observe(b)
    before = (default.reference_s(), median.reference_s())
    for b in loaded:
        default.observe(b)
        median.observe(b)
    assert default.reference_s() == pytest.approx(before[0], rel=0.02)  # the fast steps'
    assert median.reference_s() > 1.1 * before[1]  # a median follows the load


def test_the_reference_is_kept_per_precision_so_a_speedup_shows() -> None:
    pacer = StepPacer(pad=1.5, quantile=0.5)
    for _ in range(10):  # interleaved, as AutoPrecision's A/B blocks run them
        pacer.observe(0.010, "fp32")
        pacer.observe(0.006, "bf16")
    fp32 = pacer.step_s(0.010, 1.0, "fp32")
    bf16 = pacer.step_s(0.006, 1.0, "bf16")
    assert fp32 == pytest.approx(0.015) and bf16 == pytest.approx(0.009)
    assert 1 - bf16 / fp32 == pytest.approx(1 - 0.006 / 0.010)  # bf16's 40 % kept


def test_the_median_runs_over_the_last_window_steps() -> None:
    pacer = StepPacer(pad=1.0, window=5, quantile=0.5)
    for busy in (0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.2, 0.2):
        pacer.observe(busy)
    assert pacer.level_s() == pytest.approx(0.2)  # window: 0.1, 0.1, 0.2, 0.2, 0.2
    assert pacer.level_s("other") is None and pacer.reference_s("other") is None


def test_bad_pacer_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        StepPacer(pad=0.9)
    with pytest.raises(ValueError):
        StepPacer(window=0)
    with pytest.raises(ValueError):
        StepPacer(quantile=1.5)


class _Slept(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> _Slept:
    record = _Slept()
    monkeypatch.setattr(utilization.time, "sleep", record)
    return record


class _RealDevice:
    """A real device as the pacing sees it: Backend's defaults (no ratio, no delay)."""

    device_time_ratio = Backend.device_time_ratio
    device_delay_s = Backend.device_delay_s


def test_a_real_device_is_not_paced(slept: _Slept) -> None:
    probe = DeviceUtilization(_RealDevice(), "n", 0, "job")  # type: ignore[arg-type]
    for busy in (0.004, 0.009, 0.005):
        assert probe.pace(busy, "fp32") == 0.0
    assert slept == []


def test_the_twin_paces_a_step_to_its_clock(slept: _Slept) -> None:
    twin = SimBackend()
    node, index = "v100-0", 0
    twin.report_workload(node, index, "job", 1.0)
    probe = DeviceUtilization(twin, node, index, "job", pad=1.5)
    r0 = twin.device_time_ratio(node, index, "job")
    for _ in range(5):
        probe.pace(0.010, "fp32")
    assert sum(slept) == pytest.approx(5 * (0.015 * r0 - 0.010), rel=1e-6)
    limits = twin.power_limits(node, index)
    twin.set_power_limit_mw(node, index, limits.min_limit_mw)
    probe.refresh_pace()
    ratio = twin.device_time_ratio(node, index, "job")
    assert ratio > 1.2 * r0  # the lowest limit slows a default-character job on the V100
    slept.clear()
    assert probe.pace(0.010, "fp32") == pytest.approx(0.015 * ratio - 0.010)
    assert twin.device_delay_s(node, index, "job", 2.0) == pytest.approx(2.0 * (ratio - 1))


def test_the_twins_step_padding_comes_from_the_environment(monkeypatch) -> None:
    from gpuflow.tasks.training.pacing import PAD_ENV, step_pad

    monkeypatch.delenv(PAD_ENV, raising=False)
    assert step_pad() == 1.0  # a twin job at full clock runs at the host's speed
    monkeypatch.setenv(PAD_ENV, "2")
    assert step_pad() == 2.0
    for bad in ("0.5", "two", "nan"):
        monkeypatch.setenv(PAD_ENV, bad)
        with pytest.raises(ValueError, match=PAD_ENV):
            step_pad()
