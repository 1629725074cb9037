"""Telemetry series of the fleet history: a segment's bucket features, drawn from the
workload, the physics, the fault classes' counters and XIDs, and a little sensor noise
(estimates: 0.3 C, 1 % power) so the models cannot lean on exact values. Features whose
telemetry the SKU's real backend cannot read (hardware.telemetry_fields) are NaN, as the
live windows of that SKU are: a model learns only from signals its fleet has.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from gpuflow.hardware.sim import faults as F
from gpuflow.hardware.sim.hazard import DAY_S
from gpuflow.hardware.skus import SkuSpec
from gpuflow.hardware.skus import sku as lookup_sku
from gpuflow.hardware.telemetry_fields import real_backend_fields
from gpuflow.tasks.health.features import (
    BUCKET_S,
    FEATURE_INDEX,
    bucket_matrix,
    missing_features,
)
from gpuflow.tasks.health.history_config import (
    POWER_NOISE_RATIO,
    TEMP_NOISE_C,
    U_STEP,
    HistoryConfig,
)
from gpuflow.tasks.health.history_fleet import Device, Fault
from gpuflow.tasks.health.history_physics import (
    steady_state,
    thermal_run,
    thermal_start_s,
    workload,
)


@dataclass
class Segment:
    """Contiguous buckets of one device: [t0_s, t0_s + n * BUCKET_S)."""

    ordinal: int
    t0_s: float
    n: int
    kind: str  # "incident" | "background"
    fault: Fault | None = None


def simulate_segment(cfg: HistoryConfig, dev: Device, seg: Segment) -> np.ndarray:
    """The segment's bucket features [n, F] (FEATURES order)."""
    s = lookup_sku(dev.sku)
    n = seg.n
    t_end = seg.t0_s + BUCKET_S * (np.arange(n) + 1)
    util, mem = workload(cfg, dev.ordinal, seg.t0_s, n)
    u_idx = np.rint(util / U_STEP).astype(int)
    table = np.array([steady_state(dev.sku, dev.ambient_c, i) for i in range(int(1 / U_STEP) + 1)])
    temp = table[u_idx, 0].copy()
    power = table[u_idx, 1].copy()
    clock = table[u_idx, 2].copy()
    thr = table[u_idx, 3].copy()
    cap = table[u_idx, 4].copy()
    f = seg.fault
    fault = None
    if f is not None and not f.abrupt:
        fault = F.new_fault(f.kind, "natural", f.onset_s, f.lead_s, f.final_xid)
    if fault is not None and fault["kind"] == "thermal":
        # Healthy (table) before the canonical start, integrated physics from there on.
        ts = thermal_start_s(fault["onset_s"])
        k0 = max(0, int(round((ts - seg.t0_s) / BUCKET_S)))
        n_run = int(math.ceil((seg.t0_s + n * BUCKET_S - ts) / BUCKET_S))
        u_run, _ = workload(cfg, dev.ordinal, ts, n_run)
        tt, pp, cc, th, cp, _ = thermal_run(dev, fault, ts, u_run)
        skip = max(0, int(round((seg.t0_s - ts) / BUCKET_S)))  # run buckets before t0
        tt, pp, cc, th, cp = (x[skip : skip + n - k0] for x in (tt, pp, cc, th, cp))
        k1 = k0 + len(tt)
        temp[k0:k1], power[k0:k1], clock[k0:k1], thr[k0:k1], cap[k0:k1] = tt, pp, cc, th, cp
        if k1 < n:  # the segment ends at the shutdown; hold the last state up to it
            for arr in (temp, power, clock, thr, cap):
                arr[k1:] = arr[k1 - 1] if k1 > 0 else arr[k1:]
    rng = np.random.default_rng(
        int.from_bytes(hashlib.sha256(f"{cfg.seed}:{dev.ordinal}:{seg.t0_s}".encode()).digest()[:8])
    )
    temp = temp + rng.normal(0.0, TEMP_NOISE_C, n)
    power = power * (1.0 + rng.normal(0.0, POWER_NOISE_RATIO, n))
    power_w = power / 1000.0
    means = np.stack(
        [
            (temp - 25.0) / np.maximum(power_w, 1.0),
            power / s.power_default_limit_mw,
            clock / s.sm_clock_max_mhz,
            thr,
            cap,
            util,
            mem,
        ],
        axis=1,
    )
    t_start = t_end - BUCKET_S
    counters_end, pending, failure = counters_vec(dev, fault, t_end)
    counters_start, _, _ = counters_vec(dev, fault, t_start)
    xids = _xids(cfg, seg, fault, n, rng)
    out = bucket_matrix(
        temperature_c=temp,
        means=means,
        counters_start=counters_start,
        counters_end=counters_end,
        remap_pending=pending,
        remap_failure=failure,
        xid_counts=xids,
    )
    out[:, unreadable_columns(s)] = np.nan
    return out


def unreadable_columns(s: SkuSpec) -> list[int]:
    """Feature columns the real backend of SKU ``s`` has no input for (NaN there)."""
    fields = real_backend_fields(s.vendor, F.uses_row_remapping(s))
    return [FEATURE_INDEX[f] for f in missing_features(fields)]


def _remap_times(fault: dict[str, Any] | None) -> list[float]:
    if fault is None or fault["kind"] != "hbm":
        return []
    return [fault["onset_s"] + f * fault["lead_s"] for f, name in F.HBM_STAGES if name == "remap"]


def counters_vec(
    dev: Device, fault: dict[str, Any] | None, t: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counters [n, 3] = corrected, uncorrected, remapped total; remap pending; remap
    failure) at times ``t`` within one stretch between repairs: hardware.sim.faults'
    counters_at and stages, vectorized (tests check they agree)."""
    t = np.asarray(t, dtype=np.float64)
    base = dev.repaired_before(float(t.max())) if len(t) else 0.0
    rate = F.LEMON_SBE_PER_DAY if dev.lemon else F.BACKGROUND_SBE_PER_DAY
    phase = (dev.ordinal * 0.618034) % 1.0
    corrected = np.floor(np.maximum(t - base, 0.0) / DAY_S * rate + phase)
    remaps = np.zeros(len(t))
    if fault is not None and fault["kind"] == "hbm":
        progress = np.minimum(np.maximum((t - fault["onset_s"]) / fault["lead_s"], 0.0), 1.0)
        corrected += np.floor(F.HBM_CORRECTED_AT_FAILURE * progress**2)
        for rt in _remap_times(fault):
            remaps += t >= rt
    counters = np.stack([corrected, np.zeros(len(t)), remaps], axis=1)
    return counters, (remaps > 0).astype(np.float64), np.zeros(len(t))


def _xids(
    cfg: HistoryConfig,
    seg: Segment,
    fault: dict[str, Any] | None,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """XIDs per bucket by class (memory, bus, app, other): the remaps' XID 63, and
    application XIDs as noise the models must learn to ignore."""
    xids = np.zeros((n, 4))
    for rt in _remap_times(fault):
        k = int(math.ceil((rt - seg.t0_s) / BUCKET_S)) - 1
        if 0 <= k < n:
            xids[k, 0] += 1
    if cfg.app_xid_per_day > 0:
        xids[:, 2] += rng.poisson(cfg.app_xid_per_day * BUCKET_S / DAY_S, n)
    return xids
