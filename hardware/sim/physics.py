"""Power, heat and clock throttling of one device. Pure functions, closed form.

Power: P(f) = P_static + a * C * V(f)^2 * f, with a = IDLE_ACTIVITY + (activity -
IDLE_ACTIVITY) * load: clock trees toggle even with no kernel, and a kernel draws the
workload's ``activity`` (hardware.sim.dvfs_model; 1.0 unless a tenant says otherwise).
V(f) is the SKU's voltage curve (dvfs_model.shape_of: flat below a knee, rising linearly
to f_max; fitted to a power-limit trace for the V100, an estimate elsewhere). Per SKU, C
and P_static are solved from two published points (DESIGN.md section 4): idle at the
minimum clock draws ``power_idle_mw``; full load (activity 1) at the maximum clock draws
``power_max_limit_mw``. IDLE_ACTIVITY is this project's estimate; see docs/hardware.md.

Heat: a first-order RC model. The temperature relaxes toward ambient + R * P with time
constant tau; over a step with constant power the solution is exact
(T = T_ss + (T0 - T_ss) * exp(-dt / tau)), so a month is as cheap as a second: a step only
ends where the clock controller changes its decision (a threshold temperature is
crossed), and the crossing time is solved in closed form too.

Clock controller, in order: demand (idle -> lowest allowed clock, "GpuIdle"; busy ->
locked max, else application clock ("ApplicationsClocksSetting"), else f_max); the power
limit lowers it until the power at the workload's activity fits under the limit times the
SKU's cap headroom ("SwPowerCap"); at or above the software thermal target (slowdown -
SW_THERMAL_MARGIN_C, engaged from ENGAGE_BAND_C below it) it is lowered so the steady
temperature stays at the target ("SwThermalSlowdown"); at or above ``slowdown_temp_c``
hardware slowdown drops it to f_min ("HwSlowdown", "HwThermalSlowdown"). Reaching ``shutdown_temp_c`` is a thermal shutdown (the caller's
business: a failure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuflow.hardware.sim.dvfs_model import (  # noqa: F401 - the estimates, re-exported
    ESTIMATED_SHAPE,
    KNEE_RATIO,
    V_MAX_V,
    V_MIN_V,
    DvfsShape,
    shape_of,
)
from gpuflow.hardware.skus import SkuSpec

IDLE_ACTIVITY = 0.10  # estimate: dynamic activity with no kernel running
SW_THERMAL_MARGIN_C = 5.0  # estimate: software target below the HW slowdown threshold
ENGAGE_BAND_C = 2.0  # the software controller engages this far below its target
_MAX_SEGMENTS = 10_000


@dataclass(frozen=True)
class PowerModel:
    f_min_mhz: int
    f_max_mhz: int
    p_static_mw: float
    c_mw: float  # mW per (V^2 * GHz)
    shape: DvfsShape = ESTIMATED_SHAPE

    @classmethod
    def from_sku(cls, s: SkuSpec, shape: DvfsShape | None = None) -> PowerModel:
        """Calibrated to the SKU's two points; ``shape`` overrides its voltage curve."""
        fmin, fmax = s.sm_clock_min_mhz, s.sm_clock_max_mhz
        shape = shape if shape is not None else shape_of(s.name)
        d_min = shape.switching(fmin, fmax)
        d_max = shape.switching(fmax, fmax)
        c = (s.power_max_limit_mw - s.power_idle_mw) / (d_max - IDLE_ACTIVITY * d_min)
        p_static = s.power_idle_mw - IDLE_ACTIVITY * c * d_min
        return cls(f_min_mhz=fmin, f_max_mhz=fmax, p_static_mw=p_static, c_mw=c, shape=shape)

    @property
    def knee_ratio(self) -> float:
        return self.shape.knee_ratio

    def voltage_v(self, f_mhz: float) -> float:
        return self.shape.voltage_v(f_mhz, self.f_max_mhz)

    def power_mw(self, f_mhz: float, load: float, activity: float = 1.0) -> float:
        """Average power at clock ``f_mhz`` with a kernel running ``load`` of the time,
        drawing ``activity`` (dvfs_model) of the calibration workload's switching power."""
        u = min(max(load, 0.0), 1.0)
        a = IDLE_ACTIVITY + (activity - IDLE_ACTIVITY) * u
        return self.p_static_mw + a * self.c_mw * self.shape.switching(f_mhz, self.f_max_mhz)

    def max_clock_for_power(
        self, limit_mw: float, load: float, f_lo: int, f_hi: int, activity: float = 1.0
    ) -> int:
        """Highest integer clock in [f_lo, f_hi] whose power fits ``limit_mw`` (f_lo if none)."""
        if f_hi <= f_lo or self.power_mw(f_hi, load, activity) <= limit_mw:
            return max(f_hi, f_lo) if f_hi >= f_lo else f_lo
        if self.power_mw(f_lo, load, activity) > limit_mw:
            return f_lo
        lo, hi = f_lo, f_hi  # power(lo) fits, power(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.power_mw(mid, load, activity) <= limit_mw:
                lo = mid
            else:
                hi = mid
        return lo


@dataclass(frozen=True)
class Controls:
    """Everything that sets a device's clock and power for a stretch of time."""

    load: float  # 0..1, share of time a kernel runs
    power_limit_mw: int
    ambient_c: float
    thermal_resistance_c_per_w: float  # including any degradation
    locked_min_mhz: int | None = None
    locked_max_mhz: int | None = None
    applications_sm_mhz: int | None = None
    powered: bool = True  # False once the device fell off the bus
    activity: float = 1.0  # what the running kernels draw (dvfs_model); 1: calibration


@dataclass(frozen=True)
class Operating:
    clock_mhz: int
    power_mw: float
    reasons: tuple[str, ...]


def thresholds_c(s: SkuSpec) -> tuple[float, float, float]:
    """(software-controller engage temperature, HW slowdown, shutdown)."""
    target = s.slowdown_temp_c - SW_THERMAL_MARGIN_C
    return target - ENGAGE_BAND_C, s.slowdown_temp_c, s.shutdown_temp_c


def decide(s: SkuSpec, pm: PowerModel, c: Controls, temperature_c: float) -> Operating:
    """The clock the controller picks at this temperature, the power it draws, and why."""
    if not c.powered:
        return Operating(0, 0.0, ())
    fmin, fmax = s.sm_clock_min_mhz, s.sm_clock_max_mhz
    reasons: list[str] = []
    lo = c.locked_min_mhz if c.locked_min_mhz is not None else fmin
    if c.load <= 0.0:
        f = lo
        reasons.append("GpuIdle")
    elif c.locked_max_mhz is not None:
        f = c.locked_max_mhz  # locked clocks take precedence over application clocks
    elif c.applications_sm_mhz is not None and c.applications_sm_mhz < fmax:
        f = c.applications_sm_mhz
        reasons.append("ApplicationsClocksSetting")
    else:
        f = fmax
    cap_mw = c.power_limit_mw * pm.shape.cap_headroom
    f_p = pm.max_clock_for_power(cap_mw, c.load, fmin, f, c.activity)
    if f_p < f:
        f = f_p
        reasons.append("SwPowerCap")
    engage, slowdown, _ = thresholds_c(s)
    if temperature_c >= engage:
        target = engage + ENGAGE_BAND_C
        allowed_mw = (target - c.ambient_c) / c.thermal_resistance_c_per_w * 1000.0
        f_t = pm.max_clock_for_power(allowed_mw, c.load, fmin, f, c.activity)
        if f_t < f:
            f = f_t
            reasons.append("SwThermalSlowdown")
    if temperature_c >= slowdown and f > fmin:
        f = fmin
    if temperature_c >= slowdown:
        reasons += ["HwSlowdown", "HwThermalSlowdown"]
    return Operating(f, pm.power_mw(f, c.load, c.activity), tuple(reasons))


def steady_temperature_c(c: Controls, power_mw: float) -> float:
    return c.ambient_c + c.thermal_resistance_c_per_w * power_mw / 1000.0


@dataclass(frozen=True)
class StepResult:
    temperature_c: float
    energy_mj: float
    shutdown_after_s: float | None  # set when the shutdown temperature was reached


def advance(
    s: SkuSpec,
    pm: PowerModel,
    c: Controls,
    temperature_c: float,
    energy_mj: float,
    dt_s: float,
) -> StepResult:
    """Run the device for ``dt_s`` seconds under constant controls, exactly.

    Stops early (``shutdown_after_s``) if the temperature reaches the shutdown threshold.
    """
    tau = s.thermal_time_constant_s
    engage, slowdown, shutdown = thresholds_c(s)
    t = 0.0
    temp = temperature_c
    energy = energy_mj
    for _ in range(_MAX_SEGMENTS):
        remaining = dt_s - t
        if remaining <= 0:
            break
        op = decide(s, pm, c, temp)
        t_ss = steady_temperature_c(c, op.power_mw)
        h = remaining
        landing: float | None = None
        if t_ss > temp:  # warming: the next threshold above is where the decision changes
            for thr in (engage, slowdown, shutdown):
                if temp < thr < t_ss:
                    tc = tau * math.log((t_ss - temp) / (t_ss - thr))
                    if tc < h:
                        h, landing = tc, thr
                    break
        elif t_ss < temp:  # cooling: the decision changes once below a threshold
            for thr in (shutdown, slowdown, engage):
                if t_ss < thr <= temp:
                    tc = tau * math.log((temp - t_ss) / (thr - t_ss))
                    if tc < h:
                        h, landing = tc, math.nextafter(thr, -math.inf)
                    break
        energy += op.power_mw * h
        t += h
        if landing is not None:
            temp = landing
        else:
            temp = t_ss + (temp - t_ss) * math.exp(-h / tau)
        if temp >= shutdown:
            return StepResult(temp, energy, t)
    else:
        # Never expected (the controller has no limit cycle), but a bound beats a hang.
        op = decide(s, pm, c, temp)
        h = dt_s - t
        energy += op.power_mw * h
        temp = steady_temperature_c(c, op.power_mw) + (
            temp - steady_temperature_c(c, op.power_mw)
        ) * math.exp(-h / tau)
    return StepResult(temp, energy, None)
