"""Telemetry series of the fleet history: a segment's bucket features, drawn from the
workload, the physics, the fault classes' counters and XIDs, the healthy-device noise
(history_noise: benign remaps, error bursts, healed degradations, dropouts) and a little
sensor noise (estimates: 0.3 C, 1 % power) so the models cannot lean on exact values.
Features whose telemetry the SKU's real backend cannot read (hardware.telemetry_fields) are
NaN, as the live windows of that SKU are: a model learns only from signals its fleet has;
so are the optional features of a bucket a dropout touches.
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
from gpuflow.tasks.health.device_state import DeviceState, state_from_events
from gpuflow.tasks.health.features import (
    BUCKET_S,
    FEATURE_INDEX,
    N_BASE,
    XID_BUS,
    XID_MEMORY,
    bucket_matrix,
    missing_features,
    with_state,
)
from gpuflow.tasks.health.history_config import (
    POWER_NOISE_RATIO,
    TEMP_NOISE_C,
    U_STEP,
    HistoryConfig,
)
from gpuflow.tasks.health.history_fleet import Device, Fault
from gpuflow.tasks.health.history_noise import (
    DROPOUT_COLUMNS,
    REMAP_PROGRESS,
    dropout_buckets,
    heal_remap_times,
    heal_stop_s,
    noise_counters,
    noise_xids,
    progress_vec,
)
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
    """The segment's bucket features [n, F] (FEATURES order): the base features drawn
    here, the multi-day state from the device's record before the segment onwards."""
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
    fault = seg.fault.fault_dict() if seg.fault is not None else None
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
    counters_end, pending, failure = counters_vec(dev, fault, t_end, cfg)
    counters_start, _, _ = counters_vec(dev, fault, t_start, cfg)
    xids = _xids(cfg, dev, seg, fault, n, rng)
    out = bucket_matrix(
        temperature_c=temp,
        means=means,
        counters_start=counters_start,
        counters_end=counters_end,
        remap_pending=pending,
        remap_failure=failure,
        xid_counts=xids,
    )
    base_cols = [j for j in unreadable_columns(s) if j < N_BASE]
    out[:, base_cols] = np.nan
    out[np.ix_(dropout_buckets(dev, seg.t0_s, n), [j for j in DROPOUT_COLUMNS if j < N_BASE])] = (
        np.nan
    )
    remapped0 = np.nan if np.isnan(out[0, _REMAPPED]) else np.log1p(counters_start[0, 2])
    start = record_before(dev, seg.t0_s, np.float32(remapped0))
    _, full = with_state(
        start, out[None], np.asarray([seg.t0_s + BUCKET_S]), np.zeros((1, n), bool)
    )
    return full[0]


_REMAPPED = FEATURE_INDEX["remapped_rows_total_log"]
_CRITICAL = XID_MEMORY | XID_BUS


def record_before(dev: Device, t0_s: float, remapped_log: float = np.nan) -> DeviceState:
    """The device's multi-day state at ``t0_s`` from its record (device_state): repairs;
    critical XIDs and remaps of benign remaps, healed degradations and earlier precursors,
    and earlier failures' final XIDs; corrected errors of bursts, healed degradations (at
    their stop) and earlier HBM precursors (at their failure) as point events. The live
    monitor accumulates the same events bucket by bucket; placing a precursor's errors at
    one point is the approximation (it only shifts them within the days before)."""
    remaps = [r.t_s for r in dev.remaps]
    errors = list(zip(dev.burst_t, map(float, dev.burst_n), strict=True))
    xids: list[float] = []
    for h in dev.heals:
        remaps += heal_remap_times(h)
        errors.append((heal_stop_s(h), h.errors_at_failure * h.stop_at**2))
    for f in dev.faults:
        if f.failure_s >= t0_s:
            continue
        fd = f.fault_dict()
        if fd is not None and fd["kind"] == "hbm":
            remaps += _remap_times(fd)
            errors.append((f.failure_s, float(F.hbm_errors_at_failure(fd))))
        if f.final_xid in _CRITICAL:
            xids.append(f.failure_s)
    return state_from_events(
        t0_s,
        first_seen_s=0.0,
        repairs=[f.repaired_s for f in dev.faults],
        xids=xids + remaps,
        remaps=remaps,
        errors=errors,
        remapped_log=remapped_log,
    )


def unreadable_columns(s: SkuSpec) -> list[int]:
    """Feature columns the real backend of SKU ``s`` has no input for (NaN there)."""
    fields = real_backend_fields(s.vendor, F.uses_row_remapping(s))
    return [FEATURE_INDEX[f] for f in missing_features(fields)]


def _remap_times(fault: dict[str, Any] | None) -> list[float]:
    if fault is None or fault["kind"] != "hbm":
        return []
    return [F.time_at_progress(fault, p) for p in REMAP_PROGRESS]


def counters_vec(
    dev: Device,
    fault: dict[str, Any] | None,
    t: np.ndarray,
    cfg: HistoryConfig | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(counters [n, 3] = corrected, uncorrected, remapped total; remap pending; remap
    failure) at times ``t`` within one stretch between repairs: the failure's precursor
    (hardware.sim.faults' hbm_corrected and stages, vectorized: tests check they agree)
    plus, given ``cfg``, the device's noise since its last repair (history_noise)."""
    t = np.asarray(t, dtype=np.float64)
    base = dev.repaired_before(float(t.max())) if len(t) else 0.0
    corrected = np.zeros(len(t))
    remaps = np.zeros(len(t))
    pending = np.zeros(len(t), dtype=bool)
    if fault is not None and fault["kind"] == "hbm":
        corrected += np.floor(F.hbm_errors_at_failure(fault) * progress_vec(fault, t) ** 2)
        for rt in _remap_times(fault):
            remaps += t >= rt
        pending |= remaps > 0  # a precursor's remap stays pending up to the failure
    if cfg is not None:
        c, r, p = noise_counters(cfg, dev, t, base)
        corrected, remaps, pending = corrected + c, remaps + r, pending | p
    counters = np.stack([corrected, np.zeros(len(t)), remaps], axis=1)
    return counters, pending.astype(np.float64), np.zeros(len(t))


def _xids(
    cfg: HistoryConfig,
    dev: Device,
    seg: Segment,
    fault: dict[str, Any] | None,
    n: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """XIDs per bucket by class (memory, bus, app, other): the remaps' XID 63 (the
    precursor's and the noise's), and application XIDs as noise the models must learn to
    ignore."""
    xids = np.zeros((n, 4))
    xids[:, 0] += noise_xids(dev, seg.t0_s, n, dev.repaired_before(seg.t0_s + n * BUCKET_S))
    for rt in _remap_times(fault):
        k = int(math.ceil((rt - seg.t0_s) / BUCKET_S)) - 1
        if 0 <= k < n:
            xids[k, 0] += 1
    if cfg.app_xid_per_day > 0:
        xids[:, 2] += rng.poisson(cfg.app_xid_per_day * BUCKET_S / DAY_S, n)
    return xids
