"""Per-device feature windows: telemetry samples -> 5-minute buckets -> a window of buckets.

Why buckets: the monitor samples every 5 s, the fleet history is generated in 5-minute
steps (a year of a large fleet in seconds). Both reduce to the same bucket features, so
the model trained on history scores live windows unchanged. A bucket holds what its
samples saw: the hottest temperature, mean power/clocks/utilization/memory, the share of
samples throttled, the growth of the error counters over the bucket, the counter totals
and remap flags at its end, and the XIDs seen in it, counted by class (``BASE_FEATURES``);
then the device's multi-day state at the bucket's end (``device_state.STATE_FEATURES``:
age, prior repairs, time since the last repair / XID / remap, error rates over 1 h, 24 h,
7 d), which outlives the window, the monitor run and repairs. A window is the last
``WINDOW_BUCKETS`` buckets (1 hour), oldest first.

fleet_windows.FleetWindows keeps these buckets for a whole fleet between monitor runs.

Missing inputs: a feature whose telemetry the device's backend cannot read (None in the
sample: ECC and XIDs on a hy-smi DCU, row remapping on a V100; FEATURE_INPUTS says which
feature reads what) is NaN, never 0, so "no errors" and "no error counter" stay apart.
``missing_features`` names them for a set of readable fields, ``missing_in`` for windows;
the models see the gap (tasks.health.model masks it, the trees split on NaN, the rules
cannot fire on it).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from gpuflow.hardware.backend import TELEMETRY_FIELDS, TelemetrySample
from gpuflow.hardware.health import CRITICAL_XIDS
from gpuflow.tasks.health.device_state import (
    STATE_FEATURES,
    DeviceState,
    advance,
)

BUCKET_S = 300.0  # one bucket: 5 minutes of samples
WINDOW_BUCKETS = 12  # one window: the last hour
REFERENCE_C = 25.0  # thermal_c_per_w = (temperature - REFERENCE_C) / power: ambient-ish
DEFAULT_MAX_CLOCK_MHZ = 1500  # only for devices whose SKU is unknown and clocks unreadable

# XID classes. memory + bus is exactly hardware.health.CRITICAL_XIDS (checked below).
XID_MEMORY = frozenset({48, 63, 64, 92, 94, 95})
XID_BUS = frozenset({74, 79})
XID_APP = frozenset({13, 31, 43, 45, 68, 109})
if XID_MEMORY | XID_BUS != CRITICAL_XIDS:  # pragma: no cover - a guard for future edits
    raise RuntimeError("XID_MEMORY | XID_BUS must equal hardware.health.CRITICAL_XIDS")

THERMAL_REASONS = frozenset(
    {"SwThermalSlowdown", "HwSlowdown", "HwThermalSlowdown", "HwPowerBrakeSlowdown"}
)

BASE_FEATURES: tuple[str, ...] = (
    "temperature_c",  # hottest sample of the bucket
    "temperature_trend_c_per_h",  # change of temperature_c since the previous bucket
    "thermal_c_per_w",  # (temperature - 25 C) / power: rises as a thermal interface degrades
    "power_ratio",  # power / power limit
    "clock_ratio",  # SM clock / SKU max clock
    "throttle_thermal_ratio",  # share of samples with a thermal clock-event reason
    "throttle_power_ratio",  # share of samples with SwPowerCap
    "utilization_ratio",
    "memory_used_ratio",
    "ecc_corrected_delta_log",  # log1p(growth over the bucket)
    "ecc_uncorrected_delta_log",
    "ecc_corrected_total_log",  # log1p(total at the end of the bucket)
    "ecc_uncorrected_total_log",
    "remapped_rows_total_log",  # remapped rows (both kinds) + retired pages
    "remap_pending",  # 0/1 at the end of the bucket
    "remap_failure",
    "xid_memory_log",  # log1p(XIDs of the class seen in the bucket)
    "xid_bus_log",
    "xid_app_log",
    "xid_other_log",
)
N_BASE = len(BASE_FEATURES)
# Each bucket also carries the device's multi-day state at its end (device_state).
FEATURES: tuple[str, ...] = BASE_FEATURES + STATE_FEATURES
N_FEATURES = len(FEATURES)
FEATURE_INDEX = {name: i for i, name in enumerate(FEATURES)}

# The optional telemetry fields (hardware.backend.TELEMETRY_FIELDS) each feature is
# computed from; a feature exists when any one of its inputs is readable (the remapped
# total sums row remaps (Ampere+) and retired pages (V100), whichever the device has).
# Features not listed read only fields every backend gives.
_REMAPPED = frozenset({"remapped_rows_correctable", "remapped_rows_uncorrectable", "retired_pages"})
FEATURE_INPUTS: dict[str, frozenset[str]] = {
    "throttle_thermal_ratio": frozenset({"clock_event_reasons"}),
    "throttle_power_ratio": frozenset({"clock_event_reasons"}),
    "ecc_corrected_delta_log": frozenset({"ecc_corrected_total"}),
    "ecc_uncorrected_delta_log": frozenset({"ecc_uncorrected_total"}),
    "ecc_corrected_total_log": frozenset({"ecc_corrected_total"}),
    "ecc_uncorrected_total_log": frozenset({"ecc_uncorrected_total"}),
    "remapped_rows_total_log": _REMAPPED,
    "remap_pending": frozenset({"remapped_rows_pending"}),
    "remap_failure": frozenset({"remapped_rows_failure"}),
    "xid_memory_log": frozenset({"xids"}),
    "xid_bus_log": frozenset({"xids"}),
    "xid_app_log": frozenset({"xids"}),
    "xid_other_log": frozenset({"xids"}),
    "since_xid_h_log": frozenset({"xids"}),
    "since_remap_h_log": _REMAPPED,
    **{f"ecc_rate_{p}_log": frozenset({"ecc_corrected_total"}) for p in ("1h", "24h", "7d")},
    **{f"xid_rate_{p}_log": frozenset({"xids"}) for p in ("1h", "24h", "7d")},
}
if not all(f in FEATURE_INDEX and v <= TELEMETRY_FIELDS for f, v in FEATURE_INPUTS.items()):
    raise RuntimeError("FEATURE_INPUTS: unknown feature or field")  # pragma: no cover


def missing_features(readable: Iterable[str]) -> tuple[str, ...]:
    """The features (FEATURES order) with no readable input among ``readable`` fields."""
    have = frozenset(readable)
    return tuple(f for f in FEATURES if f in FEATURE_INPUTS and not FEATURE_INPUTS[f] & have)


def missing_in(windows: np.ndarray) -> list[tuple[str, ...]]:
    """Per window, the features its newest bucket lacks (NaN: no input was readable)."""
    gaps = np.isnan(windows[:, -1, :])
    return [tuple(FEATURES[j] for j in np.flatnonzero(row)) for row in gaps]


def num_or_nan(v: float | None) -> float:
    return np.nan if v is None else float(v)


def remapped_total(s: TelemetrySample) -> float:
    parts = [
        v
        for v in (s.remapped_rows_correctable, s.remapped_rows_uncorrectable, s.retired_pages)
        if v is not None
    ]
    return float(sum(parts)) if parts else np.nan


def zero_growth(b: np.ndarray, cols: list[int]) -> None:
    """Set growth/event columns to 0 ("nothing seen then"), leaving missing ones NaN."""
    sub = b[..., cols]
    b[..., cols] = np.where(np.isnan(sub), np.nan, 0.0)


NO_GROWTH_COLS = [1, 9, 10, 16, 17, 18, 19]  # trend, counter growth, XIDs (base columns)

# Per-sample "mean" channels accumulated in a bucket (temperature is a max, kept apart).
MEAN_CHANNELS = (
    "thermal_c_per_w",
    "power_ratio",
    "clock_ratio",
    "throttle_thermal_ratio",
    "throttle_power_ratio",
    "utilization_ratio",
    "memory_used_ratio",
)
# Counter channels: (corrected, uncorrected, remapped_total); flags: (pending, failure).
N_COUNTERS = 3
N_XID_CLASSES = 4


def xid_class_counts(xids: Iterable[int]) -> tuple[int, int, int, int]:
    """(memory, bus, app, other) counts of a sequence of XIDs."""
    mem = bus = app = other = 0
    for x in xids:
        if x in XID_MEMORY:
            mem += 1
        elif x in XID_BUS:
            bus += 1
        elif x in XID_APP:
            app += 1
        else:
            other += 1
    return mem, bus, app, other


def bucket_matrix(
    *,
    temperature_c: np.ndarray,
    means: np.ndarray,
    counters_start: np.ndarray,
    counters_end: np.ndarray,
    remap_pending: np.ndarray,
    remap_failure: np.ndarray,
    xid_counts: np.ndarray,
    first_prev_temperature_c: float | None = None,
    bucket_s: float = BUCKET_S,
) -> np.ndarray:
    """Base feature vectors of buckets (BASE_FEATURES order; ``with_state`` adds the rest);
    the history and the live windows both build their buckets here, so the two cannot
    drift apart.

    A counter that went down was reset (a repair): its growth counts from zero. Shapes:
    temperature_c [n], means [n, 7] (MEAN_CHANNELS), counters_* [n, 3] (corrected,
    uncorrected, remapped total), flags [n], xid_counts [n, 4]. The trend of bucket i uses bucket i-1 (``first_prev_temperature_c`` for bucket 0).
    """
    n = len(temperature_c)
    out = np.empty((n, N_BASE), dtype=np.float32)
    out[:, 0] = temperature_c
    prev = np.empty(n, dtype=np.float64)
    if n:
        prev[0] = temperature_c[0] if first_prev_temperature_c is None else first_prev_temperature_c
        prev[1:] = temperature_c[:-1]
    out[:, 1] = (temperature_c - prev) * 3600.0 / bucket_s
    out[:, 2:9] = means
    deltas = np.where(counters_end >= counters_start, counters_end - counters_start, counters_end)
    out[:, 9] = np.log1p(np.maximum(deltas[:, 0], 0.0))
    out[:, 10] = np.log1p(np.maximum(deltas[:, 1], 0.0))
    out[:, 11:14] = np.log1p(np.maximum(counters_end, 0.0))
    out[:, 14] = remap_pending
    out[:, 15] = remap_failure
    out[:, 16:20] = np.log1p(xid_counts)
    return out


_ECC_DELTA = FEATURE_INDEX["ecc_corrected_delta_log"]
_XID_CRIT = [FEATURE_INDEX["xid_memory_log"], FEATURE_INDEX["xid_bus_log"]]
_REMAPPED_COL = FEATURE_INDEX["remapped_rows_total_log"]


def with_state(
    state: DeviceState,
    base: np.ndarray,
    t_end: np.ndarray,
    repaired: np.ndarray,
    bucket_s: float = BUCKET_S,
) -> tuple[DeviceState, np.ndarray]:
    """(the state after them, full buckets [n, k, F]) of ``k`` consecutive base buckets
    [n, k, N_BASE] per device ending at ``t_end`` [n] (first bucket) onwards; ``repaired``
    [n, k]: a repair happened in that bucket. The one path from base buckets to features,
    for the live windows (k = 1) and the history (a segment)."""
    base = np.asarray(base, dtype=np.float32)
    ecc = np.expm1(base[..., _ECC_DELTA].astype(np.float64))
    crit = np.expm1(base[..., _XID_CRIT].astype(np.float64))
    xid = np.where(np.isnan(crit).all(axis=-1), np.nan, np.nansum(crit, axis=-1))
    remapped = base[..., _REMAPPED_COL].astype(np.float64)
    new, cols = advance(
        state, ecc, xid, remapped, np.asarray(t_end, np.float64), repaired, bucket_s
    )
    return new, np.concatenate([base, cols], axis=-1)


def sliding_windows(buckets: np.ndarray, window: int = WINDOW_BUCKETS) -> np.ndarray:
    """All windows of consecutive buckets [n - window + 1, window, F] (a view, no copy)."""
    if len(buckets) < window:
        return np.empty((0, window, buckets.shape[1]), dtype=buckets.dtype)
    v = np.lib.stride_tricks.sliding_window_view(buckets, window, axis=0)
    return v.transpose(0, 2, 1)  # [n, F, window] -> [n, window, F]


def summary_features(windows: np.ndarray) -> np.ndarray:
    """Flat per-window features for tree models: last, mean, max and last - first."""
    last = windows[:, -1, :]
    return np.concatenate(
        [last, windows.mean(axis=1), windows.max(axis=1), last - windows[:, 0, :]], axis=1
    ).astype(np.float32)


def summary_feature_names() -> list[str]:
    return [f"{agg}:{f}" for agg in ("last", "mean", "max", "delta") for f in FEATURES]


def sample_counters(s: TelemetrySample) -> tuple[float, float, float]:
    """(corrected, uncorrected, remapped total); NaN where the backend cannot read it."""
    return (
        num_or_nan(s.ecc_corrected_total),
        num_or_nan(s.ecc_uncorrected_total),
        remapped_total(s),
    )


def sample_means(s: TelemetrySample, max_clock_mhz: float) -> tuple[float, ...]:
    power_w = s.power_mw / 1000.0
    reasons = s.clock_event_reasons
    return (
        (s.temperature_c - REFERENCE_C) / max(power_w, 1.0),
        s.power_mw / s.power_limit_mw if s.power_limit_mw > 0 else 0.0,
        s.sm_clock_mhz / max_clock_mhz if max_clock_mhz > 0 else 0.0,
        np.nan if reasons is None else float(not THERMAL_REASONS.isdisjoint(reasons)),
        np.nan if reasons is None else float("SwPowerCap" in reasons),
        float(s.utilization_ratio),
        s.memory_used_mb / s.memory_total_mb if s.memory_total_mb > 0 else 0.0,
    )
