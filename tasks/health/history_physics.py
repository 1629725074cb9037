"""Per-bucket physics of the fleet history: the workload a device runs and what the twin's
physics makes of it.

Between failures a device runs jobs: busy stretches (utilization 0.55..1) and idle ones
(estimates, lognormal durations). With a 60 s thermal time constant a 5-minute bucket is
near steady state, so healthy buckets take the steady state of their load (memoized per
SKU, ambient and load step); a thermal degradation is integrated bucket by bucket with
the exact RC solution (``thermal_run``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import physics
from gpuflow.hardware.sim.hazard import DAY_S
from gpuflow.hardware.skus import SkuSpec
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.tasks.health.features import BUCKET_S
from gpuflow.tasks.health.history_config import (
    PRECURSOR_MARGIN_S,
    U_STEP,
    HistoryConfig,
    align_down,
    history_rng,
)
from gpuflow.tasks.health.history_fleet import Device


@functools.cache
def _power_model(sku_name: str) -> physics.PowerModel:
    return physics.PowerModel.from_sku(lookup_sku(sku_name))


@functools.cache
def steady_state(
    sku_name: str, ambient_c: float, u_idx: int
) -> tuple[float, float, float, int, int]:
    """(temperature_c, power_mw, clock_mhz, thermal throttle 0/1, power cap 0/1) of a healthy
    device held at load ``u_idx * U_STEP`` long enough to settle (the twin's physics)."""
    s = lookup_sku(sku_name)
    pm = _power_model(sku_name)
    c = _controls(s, ambient_c, u_idx * U_STEP, 1.0)
    t0 = ambient_c + s.thermal_resistance_c_per_w * s.power_idle_mw / 1000.0
    r = physics.advance(s, pm, c, t0, 0.0, 20 * s.thermal_time_constant_s)
    op = physics.decide(s, pm, c, r.temperature_c)
    return (
        r.temperature_c,
        op.power_mw,
        float(op.clock_mhz),
        int(bool(set(op.reasons) & _THERMAL)),
        int("SwPowerCap" in op.reasons),
    )


_THERMAL = {"SwThermalSlowdown", "HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}


def _controls(s: SkuSpec, ambient_c: float, load: float, multiplier: float) -> physics.Controls:
    return physics.Controls(
        load=load,
        power_limit_mw=s.power_default_limit_mw,
        ambient_c=ambient_c,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w * multiplier,
    )


def workload(cfg: HistoryConfig, ordinal: int, t0: float, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(utilization, memory share) of ``n`` buckets from ``t0``: alternating busy and idle
    stretches. A function of absolute time (drawn per device and day), so every segment
    that covers a bucket sees the same load there."""
    first = int(t0 // DAY_S)
    last = int((t0 + n * BUCKET_S - 1e-6) // DAY_S)
    days = [_workload_day(cfg, ordinal, d) for d in range(first, last + 1)]
    util = np.concatenate([u for u, _ in days])
    mem = np.concatenate([m for _, m in days])
    k0 = int(round((t0 - first * DAY_S) / BUCKET_S))
    return util[k0 : k0 + n], mem[k0 : k0 + n]


_PER_DAY = int(round(DAY_S / BUCKET_S))


def _workload_day(cfg: HistoryConfig, ordinal: int, day: int) -> tuple[np.ndarray, np.ndarray]:
    rng = history_rng(cfg.seed, "work", ordinal, day)
    util = np.zeros(_PER_DAY)
    mem = np.zeros(_PER_DAY)
    i = 0
    busy = rng.random() < cfg.busy_median_s / (cfg.busy_median_s + cfg.idle_median_s)
    while i < _PER_DAY:
        median = cfg.busy_median_s if busy else cfg.idle_median_s
        length = max(1, int(rng.lognormvariate(math.log(median), 1.0) / BUCKET_S))
        if busy:
            util[i : i + length] = round(rng.uniform(0.55, 1.0) / U_STEP) * U_STEP
            mem[i : i + length] = rng.uniform(0.3, 0.95)
        i += length
        busy = not busy
    return util, mem


def thermal_start_s(onset_s: float) -> float:
    """Where a thermal degradation's physics is integrated from: the same point for the
    failure time and for every segment, so both see the same temperatures."""
    return align_down(onset_s - PRECURSOR_MARGIN_S)


def thermal_run(
    dev: Device, fault: dict[str, Any], t0: float, util: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float | None]:
    """Per bucket: (temperature max, mean power, clock, thermal flag, power flag) and the
    shutdown time if one happened (arrays stop there)."""
    s = lookup_sku(dev.sku)
    pm = _power_model(dev.sku)
    n = len(util)
    temp = np.empty(n)
    power = np.empty(n)
    clock = np.empty(n)
    thr = np.zeros(n)
    cap = np.zeros(n)
    u0 = int(round(util[0] / U_STEP)) if n else 0
    t_c = steady_state(dev.sku, dev.ambient_c, u0)[0]
    for k in range(n):
        a = t0 + k * BUCKET_S
        m = F.thermal_multiplier(fault, a + BUCKET_S / 2, s, dev.ambient_c)
        c = _controls(s, dev.ambient_c, float(util[k]), m)
        r = physics.advance(s, pm, c, t_c, 0.0, BUCKET_S)
        if r.shutdown_after_s is not None:
            return temp[:k], power[:k], clock[:k], thr[:k], cap[:k], a + r.shutdown_after_s
        op = physics.decide(s, pm, c, r.temperature_c)
        temp[k] = max(t_c, r.temperature_c)
        power[k] = r.energy_mj / BUCKET_S
        clock[k] = op.clock_mhz
        thr[k] = 1.0 if set(op.reasons) & _THERMAL else 0.0
        cap[k] = 1.0 if "SwPowerCap" in op.reasons else 0.0
        t_c = r.temperature_c
    return temp, power, clock, thr, cap, None
