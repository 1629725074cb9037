"""Measure a setting on a device, and the in-training tuner built on it.

A probe measures time and energy per unit of work (a training step, a tune work unit) at
one setting: energy from the device's own counter (NVML's total energy consumption, the
twin's integral; Backend.energy_mj), time from the host's clock between the same two
points, both divided by the units done in between. The twin slows work the way a real
clock would (Backend.device_delay_s, which the training loop sleeps), so the same probe
reads the same kind of curve on the twin and on a GPU.

InTrainingTuner is a step hook (tasks.training.loop hooks): after a warmup it runs the
SettingSearch (tasks.energy.optimizer) one probe at a time - set the limit, let it settle
(the power-capping loop and the clock settle; the twin learns the job's load from its first
utilization report), measure - then applies the choice. The highest limit, the reference,
is measured in ``reference_windows`` windows back to back: their spread is the noise of one
window, and a lower limit counts within the bound only if it clears it by that noise
(optimizer.GUARD_Z) - a near-bound limit read fast by one lucky window is not chosen.

It then keeps watching: one window of a probe's length at a time at the chosen limit, and
when ``drift_windows`` windows in a row differ from the choice's measurement by more than
``drift_tolerance`` or three standard deviations of the measured noise, whichever is
larger (time or power per step: the workload changed, say AutoPrecision switched to bf16),
it searches again from the top. One odd window is noise, not a change: that is the
hysteresis. Each phase lasts at least so many steps AND so many seconds: a probe shorter
than a second reads NVML's energy counter over too few of its updates and one step's
jitter. Every change goes through DeviceSettings under the job's id, so it is put back when
the job ends, and by restore_stale once the job's lease is gone if the process dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import Backend, InvalidRequestError, PowerLimits
from gpuflow.tasks.energy.optimizer import Choice, Measurement, Objective, SettingSearch
from gpuflow.tasks.energy.settings import DeviceSettings

DEFAULT_GRID_STEP_W = 25.0  # Zeus's traces step power limits by 25 W
# Windows measured at the highest limit before the first lower one: their mean is the
# reference and their spread the noise the search guards its comparisons by
# (optimizer.GUARD_Z, DRIFT_Z). They cost no time against the bound: the job runs at full
# speed meanwhile.
DEFAULT_REFERENCE_WINDOWS = 3


def power_limit_grid(limits: PowerLimits, step_w: float = DEFAULT_GRID_STEP_W) -> list[float]:
    """Power limits in W from the device's maximum down to its minimum, ``step_w`` apart
    (the minimum always included), ascending."""
    if not step_w > 0:
        raise InvalidRequestError(f"step_w must be > 0 W, got {step_w!r}")
    lo, hi = limits.min_limit_mw / 1000.0, limits.max_limit_mw / 1000.0
    grid, p = [], hi
    while p > lo + 1e-9:
        grid.append(p)
        p -= step_w
    grid.append(lo)
    return sorted(grid)


class EnergyMeter:
    """Energy (device counter) and host time between start() and stop(units)."""

    def __init__(
        self,
        backend: Backend,
        node: str,
        index: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.backend, self.node, self.index, self.clock = backend, node, index, clock
        self._start: tuple[float, int] | None = None

    def start(self) -> None:
        self._start = (self.clock(), self.backend.energy_mj(self.node, self.index))

    @property
    def running(self) -> bool:
        return self._start is not None

    def stop(self, setting: float, units: float) -> Measurement:
        """Time and energy per unit since start(), at ``setting``."""
        if self._start is None:
            raise RuntimeError("stop() before start()")
        t0, e0 = self._start
        self._start = None
        dt = self.clock() - t0
        de_j = (self.backend.energy_mj(self.node, self.index) - e0) / 1000.0
        if units <= 0 or dt <= 0 or de_j <= 0:
            raise InvalidRequestError(
                f"{self.node}:{self.index}: nothing measured at {setting:g} "
                f"({units} units, {dt:.3f} s, {de_j:.3f} J)"
            )
        return Measurement(setting, dt / units, de_j / units)


@dataclass
class TunerEvent:
    """One thing the tuner did, for the run's record."""

    step: int
    action: str  # "probe" (a setting measured), "chose" or "drift" (searching again)
    setting_w: float
    time_s: float | None = None  # per step
    energy_j: float | None = None  # per step
    extra: dict[str, Any] = field(default_factory=dict)


class InTrainingTuner:
    """Step hook: probe power limits in the first steps, keep the best for the rest."""

    def __init__(
        self,
        backend: Backend,
        settings: DeviceSettings,
        node: str,
        index: int,
        objective: Objective | None = None,
        *,
        on_setting_change: Callable[[], None] | None = None,
        warmup: tuple[int, float] = (5, 2.0),
        settle: tuple[int, float] = (2, 0.5),
        probe: tuple[int, float] = (5, 2.0),
        grid_step_w: float = DEFAULT_GRID_STEP_W,
        drift_tolerance: float = 0.25,
        drift_windows: int = 3,
        reference_windows: int = DEFAULT_REFERENCE_WINDOWS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0 < drift_tolerance or isinstance(drift_windows, bool) or drift_windows < 1:
            raise InvalidRequestError(
                f"drift_tolerance must be > 0 and drift_windows >= 1, got {drift_tolerance!r}, "
                f"{drift_windows!r}"
            )
        if (
            isinstance(reference_windows, bool)
            or not isinstance(reference_windows, int)
            or reference_windows < 1
        ):
            raise InvalidRequestError(
                f"reference_windows must be an integer >= 1, got {reference_windows!r}"
            )
        for name, (steps, seconds) in (("warmup", warmup), ("settle", settle), ("probe", probe)):
            least = 1 if name == "probe" else 0
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < least:
                raise InvalidRequestError(
                    f"{name} steps must be an integer >= {least}, got {steps!r}"
                )
            if not isinstance(seconds, int | float) or not seconds >= 0:
                raise InvalidRequestError(f"{name} seconds must be >= 0, got {seconds!r}")
        self.backend, self.settings, self.node, self.index = backend, settings, node, index
        self.grid = power_limit_grid(backend.power_limits(node, index), grid_step_w)
        self.objective = objective
        self.search = SettingSearch(self.grid, objective)
        self.drift_tolerance, self.drift_windows = drift_tolerance, drift_windows
        self.reference_windows = reference_windows
        self._reference: list[Measurement] = []  # the highest limit's windows so far
        self._drifted = 0  # windows in a row that disagree with the choice
        self.decisions: list[Choice] = []  # every choice, the re-decisions included
        self.on_setting_change = on_setting_change or (lambda: None)
        self.warmup, self.settle, self.probe = warmup, settle, probe
        self.clock = clock
        self.meter = EnergyMeter(backend, node, index, clock)
        self.events: list[TunerEvent] = []
        self.choice: Choice | None = None
        self._setting: float | None = None  # the limit being probed
        self._phase: tuple[int, float] | None = None  # (step, time) the phase began
        self._measured_from = 0  # the step the running probe's measurement began

    @property
    def done(self) -> bool:
        return self.choice is not None

    def _over(self, step: int, need: tuple[int, float]) -> bool:
        if self._phase is None:
            self._phase = (step, self.clock())
            return False
        s0, t0 = self._phase
        return step - s0 >= need[0] and self.clock() - t0 >= need[1]

    def __call__(self, info: Any) -> None:
        step = info.step
        if self.done:
            self._watch(step)
            return
        if self._setting is None:  # warming up (the first probe starts after it)
            if self._over(step, self.warmup):
                self._next(step)
        elif not self.meter.running:  # settling
            if self._over(step, self.settle):
                self._start_measuring(step)
        elif self._over(step, self.probe):
            m = self.meter.stop(self._setting, step - self._measured_from)
            self.events.append(TunerEvent(step, "probe", m.setting, m.time_s, m.energy_j))
            if self.search.probes:
                self.search.tell(m)
            else:  # the reference: several windows back to back, for its noise too
                self._reference.append(m)
                if len(self._reference) < self.reference_windows:
                    self._start_measuring(step)  # the same limit: nothing to settle
                    return
                self.search.tell_reference(self._reference)
                self._reference = []
            self._next(step)

    def _watch(self, step: int) -> None:
        """At the chosen limit: measure window after window; search again on a drift."""
        if not self.meter.running:
            self._start_measuring(step)
            return
        if not self._over(step, self.probe):
            return
        assert self.choice is not None
        m = self.meter.stop(self.choice.chosen.setting, step - self._measured_from)
        self._drifted = self._drifted + 1 if self.choice.drifted(m, self.drift_tolerance) else 0
        if self._drifted < self.drift_windows:
            self._start_measuring(step)
            return
        self.events.append(
            TunerEvent(step, "drift", m.setting, m.time_s, m.energy_j, {"windows": self._drifted})
        )
        self._drifted = 0
        self.choice = None
        self.search = SettingSearch(self.grid, self.objective)
        self._next(step)

    def _start_measuring(self, step: int) -> None:
        self.meter.start()
        self._measured_from = step
        self._phase = (step, self.clock())

    def _set(self, setting_w: float) -> None:
        self.settings.apply_power_limit(self.node, self.index, round(setting_w * 1000))
        self.on_setting_change()

    def _next(self, step: int) -> None:
        setting = self.search.next_probe()
        if setting is None:
            self.choice = self.search.choice()
            self.decisions.append(self.choice)
            self._set(self.choice.chosen.setting)
            self._phase = None  # the watch's first window starts at the next step
            self.events.append(
                TunerEvent(
                    step,
                    "chose",
                    self.choice.chosen.setting,
                    self.choice.chosen.time_s,
                    self.choice.chosen.energy_j,
                    {"energy_saving": self.choice.energy_saving, "slowdown": self.choice.slowdown},
                )
            )
            return
        self._setting = setting
        self._set(setting)
        self._phase = (step, self.clock())
        if self.settle == (0, 0.0):
            self._start_measuring(step)
