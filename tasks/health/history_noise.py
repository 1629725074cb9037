"""Noise in the fleet history: what healthy devices show that looks like a precursor.

Each device gets the twin's noise draws (hardware.sim.noise: benign pending remaps,
corrected-error bursts, telemetry dropouts) and its healed HBM degradations
(hardware.sim.hazard.healed_schedule); this module draws them and evaluates them per
bucket, vectorized: the counters and pending flag they add, their XID 63s, the buckets
whose optional telemetry is unreadable. A repair resets all of it, as it resets the
counters: only events after the device's last repair count.

``noise_intervals`` gives the stretches around the precursor-like events (benign remaps,
healed degradations) that the background sample draws from as a stratum of its own
(history_splits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim import noise as N
from gpuflow.hardware.sim.hazard import HealDraw, healed_schedule
from gpuflow.tasks.health.features import BUCKET_S, FEATURE_INDEX, FEATURE_INPUTS
from gpuflow.tasks.health.history_config import PRECURSOR_MARGIN_S, HistoryConfig
from gpuflow.tasks.health.history_fleet import Device

REMAP_PROGRESS = tuple(f for f, name in F.HBM_STAGES if name == "remap")  # 0.6, 0.8
# A dropout blanks every feature read from an optional telemetry field (ECC, remaps,
# throttle reasons, XIDs): what a failed NVML query leaves (None -> NaN, never 0).
DROPOUT_COLUMNS = sorted(FEATURE_INDEX[f] for f in FEATURE_INPUTS)


def draw_noise(cfg: HistoryConfig, dev: Device) -> None:
    """The device's noise events over the whole history (stored on ``dev``)."""
    until = cfg.days * N.DAY_S
    model, hazard = cfg.noise_model(), cfg.hazard()
    mult = hazard.lemon_factor if dev.lemon else 1.0  # lemons carry most errors (Titan)
    dev.remaps = N.benign_remaps(cfg.seed, dev.ordinal, mult, model, until)
    dev.burst_t, dev.burst_n = N.error_bursts(cfg.seed, dev.ordinal, mult, model, until)
    dev.dropouts = N.dropouts(cfg.seed, dev.ordinal, model, until)
    dev.heals = healed_schedule(cfg.seed, dev.ordinal, dev.rate_per_day, hazard, until)


def heal_fault(h: HealDraw) -> dict[str, Any]:
    """A healed degradation as the twin's fault record (its course had it not stopped)."""
    fault = F.new_fault("hbm", "natural", h.onset_s, h.lead_s, 48)
    fault.update(errors_at_failure=h.errors_at_failure, stall_at=h.stall_at, stall_s=h.stall_s)
    return fault


def heal_stop_s(h: HealDraw) -> float:
    return F.time_at_progress(heal_fault(h), h.stop_at)


def heal_remap_times(h: HealDraw) -> list[float]:
    """XID 63 remaps of a healed degradation: the stages it reached before stopping."""
    f = heal_fault(h)
    return [F.time_at_progress(f, p) for p in REMAP_PROGRESS if p < h.stop_at]


def progress_vec(fault: dict[str, Any], t: np.ndarray) -> np.ndarray:
    """hardware.sim.faults' progress of an HBM fault at times ``t`` (stall included)."""
    active = max(fault["lead_s"] - fault.get("stall_s", 0.0), 1.0)
    elapsed = t - fault["onset_s"]
    stall_at = fault.get("stall_at", 0.0)
    if stall_at > 0:
        cut = stall_at * active
        elapsed = np.where(elapsed > cut, np.maximum(cut, elapsed - fault["stall_s"]), elapsed)
    return np.clip(elapsed / active, 0.0, 1.0)


def noise_counters(
    cfg: HistoryConfig, dev: Device, t: np.ndarray, base: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(corrected errors, remapped rows, remap pending 0/1) the noise adds at times ``t``
    (all after the device's last repair ``base``)."""
    corrected = np.zeros(len(t))
    remaps = np.zeros(len(t))
    pending = np.zeros(len(t), dtype=bool)
    if dev.burst_t:
        bt = np.asarray(dev.burst_t)
        cum = np.concatenate([[0.0], np.cumsum(dev.burst_n)])
        corrected += (
            cum[np.searchsorted(bt, t, side="right")] - cum[np.searchsorted(bt, base, side="right")]
        )
    for r in dev.remaps:
        if r.t_s > base:
            remaps += t >= r.t_s
            pending |= (t >= r.t_s) & (t < r.cleared_s)
    reset_s = cfg.noise_model().reset_median_s
    for h in dev.heals:
        if h.onset_s <= base:
            continue
        f = heal_fault(h)
        p = np.minimum(progress_vec(f, t), h.stop_at)
        corrected += np.floor(h.errors_at_failure * p**2)
        cleared = heal_stop_s(h) + reset_s  # the next reset applies its remaps
        for rt in heal_remap_times(h):
            remaps += t >= rt
            pending |= (t >= rt) & (t < cleared)
    return corrected, remaps, pending


def noise_xids(dev: Device, t0: float, n: int, base: float) -> np.ndarray:
    """XID 63 count per bucket of [t0, t0 + n buckets) from benign and healed remaps."""
    out = np.zeros(n)
    times = [r.t_s for r in dev.remaps if r.t_s > base]
    times += [rt for h in dev.heals if h.onset_s > base for rt in heal_remap_times(h)]
    for rt in times:
        k = int(math.ceil((rt - t0) / BUCKET_S)) - 1
        if 0 <= k < n:
            out[k] += 1
    return out


def dropout_buckets(dev: Device, t0: float, n: int) -> np.ndarray:
    """Per bucket of [t0, t0 + n buckets): does a dropout overlap it?"""
    a = t0 + BUCKET_S * np.arange(n)
    out = np.zeros(n, dtype=bool)
    for s, e in dev.dropouts:
        out |= (a < e) & (a + BUCKET_S > s)
    return out


def noise_intervals(cfg: HistoryConfig, dev: Device) -> list[tuple[float, float]]:
    """Stretches around the device's precursor-like noise (from an hour before a benign
    remap or a healed degradation's onset to ``noise_after_s`` after it ends), merged."""
    raw = [(r.t_s - PRECURSOR_MARGIN_S, r.t_s + cfg.noise_after_s) for r in dev.remaps]
    raw += [(h.onset_s - PRECURSOR_MARGIN_S, heal_stop_s(h) + cfg.noise_after_s) for h in dev.heals]
    merged: list[tuple[float, float]] = []
    for a, b in sorted(raw):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged
