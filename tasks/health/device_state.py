"""Per-device state over days: what a 1-hour window cannot hold.

Lead times run to days (HBM: median 36 h, thermal: 5 days) and the strongest predictor of
a fault is the device's own record (a few lemons carry most faults; the hazard rises after
each repair: docs/health.md). So every bucket also carries columns of the device's state at
its end (``STATE_FEATURES``): device age, prior repairs (each repair follows a fault, so
this is also the count of prior faults), time since the last repair, critical XID and row
remap, and corrected-error and critical-XID rates over 1 h, 24 h and 7 d.

The rates are exponentially weighted counts (time constants 1 h, 24 h, 7 d, per hour): a
few numbers per device, not a 7-day buffer, and they survive between monitor runs (saved
with FleetWindows) and across repairs (a repair resets the counters, not the record).

One code path: ``advance`` folds a run of consecutive buckets into the state and returns
each bucket's state columns. The live windows call it with one bucket whenever a bucket is
scored or closed; the fleet history calls it with a whole segment. Both start from a
``DeviceState``: the live one from its first sample, the history's from the device's
record before the segment (``state_from_events``: its repairs, XIDs, remaps and error
bursts as point events). A test checks that identical telemetry gives identical columns.

Missing inputs stay NaN: a rate or time-since whose input the bucket lacks (ECC, XIDs,
remap counters; see features.FEATURE_INPUTS) is NaN in that bucket; the state itself
carries on from what was readable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

DAY_S = 86_400.0
TAUS_S = (3600.0, DAY_S, 7 * DAY_S)  # the rates' time constants: 1 h, 24 h, 7 d
NEVER_S = 30 * DAY_S  # "time since" of an event never seen (or longer ago): capped here

STATE_FEATURES: tuple[str, ...] = (
    "age_days_log",  # log1p(days since the device was first seen)
    "repairs_prior_log",  # log1p(repairs so far): each one followed a fault
    "since_repair_h_log",  # log1p(hours since the last repair, capped at 30 days)
    "since_xid_h_log",  # ... since the last critical (memory/bus) XID
    "since_remap_h_log",  # ... since remapped rows / retired pages last grew
    "ecc_rate_1h_log",  # log1p(corrected errors per hour), weighted over 1 h
    "ecc_rate_24h_log",
    "ecc_rate_7d_log",
    "xid_rate_1h_log",  # log1p(critical XIDs per hour), weighted over 1 h
    "xid_rate_24h_log",
    "xid_rate_7d_log",
)
N_STATE = len(STATE_FEATURES)


@dataclass
class DeviceState:
    """Per-device record, one row per device (numpy arrays, float64)."""

    first_seen_s: np.ndarray
    t_s: np.ndarray  # end of the last bucket folded in (-inf: none yet)
    repairs: np.ndarray
    last_repair_s: np.ndarray  # -inf: never
    last_xid_s: np.ndarray
    last_remap_s: np.ndarray
    last_remapped_log: np.ndarray  # the remap total's last readable value (NaN: none)
    ecc_acc: np.ndarray  # [n, 3] weighted corrected-error counts, one per TAUS_S
    xid_acc: np.ndarray  # [n, 3]

    @classmethod
    def empty(cls, n: int, first_seen_s: float | np.ndarray = np.nan) -> DeviceState:
        return cls(
            first_seen_s=np.broadcast_to(np.asarray(first_seen_s, np.float64), (n,)).copy(),
            t_s=np.full(n, -np.inf),
            repairs=np.zeros(n),
            last_repair_s=np.full(n, -np.inf),
            last_xid_s=np.full(n, -np.inf),
            last_remap_s=np.full(n, -np.inf),
            last_remapped_log=np.full(n, np.nan),
            ecc_acc=np.zeros((n, len(TAUS_S))),
            xid_acc=np.zeros((n, len(TAUS_S))),
        )

    def __len__(self) -> int:
        return len(self.t_s)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def take(self, rows: np.ndarray) -> DeviceState:
        return DeviceState(**{k: v[rows] for k, v in self.arrays().items()})

    def put(self, rows: np.ndarray, other: DeviceState) -> None:
        for k, v in other.arrays().items():
            getattr(self, k)[rows] = v

    @classmethod
    def concat(cls, parts: Iterable[DeviceState]) -> DeviceState:
        parts = list(parts)
        return cls(
            **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(cls)}
        )


def _since(t: np.ndarray, last: np.ndarray) -> np.ndarray:
    return np.log1p(np.minimum(t - last, NEVER_S) / 3600.0)


def _running_last(initial: np.ndarray, event: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[n, k]: the time of the newest event up to each bucket (``initial`` before any)."""
    stamped = np.where(event, t, -np.inf)
    return np.maximum.accumulate(np.concatenate([initial[:, None], stamped], axis=1), axis=1)[:, 1:]


def advance(
    state: DeviceState,
    ecc: np.ndarray,
    xid: np.ndarray,
    remapped_log: np.ndarray,
    t_end: np.ndarray,
    repaired: np.ndarray,
    bucket_s: float,
) -> tuple[DeviceState, np.ndarray]:
    """Fold ``k`` consecutive buckets per device into ``state``; returns (the new state,
    the state columns [n, k, N_STATE] float32 at each bucket's end). Pure: ``state`` is
    not changed.

    Per bucket [n, k]: ``ecc`` the corrected-error growth, ``xid`` the critical XIDs seen
    (NaN: unreadable then), ``remapped_log`` the remap total (log1p, NaN: unreadable),
    ``repaired`` whether a repair happened in it. ``t_end`` [n]: the end of the first bucket;
    the others follow ``bucket_s`` apart.
    """
    # Imported here: scipy.signal costs ~1 s to import, and every `gpuflow` command loads
    # this module through the sampler without needing it.
    from scipy.signal import lfilter

    n, k = ecc.shape
    t = t_end[:, None] + bucket_s * np.arange(k)[None, :]
    # Decay over any gap before the first bucket (the monitor was not running).
    prior_end = np.where(np.isfinite(state.t_s), state.t_s, t_end - bucket_s)
    gap = np.maximum(t_end - bucket_s - prior_end, 0.0)
    cols = np.empty((n, k, N_STATE), dtype=np.float64)
    new_acc = {}
    for name, x, base in (("ecc", ecc, state.ecc_acc), ("xid", xid, state.xid_acc)):
        filled = np.where(np.isnan(x), 0.0, x)
        out_acc = np.empty((n, len(TAUS_S)))
        for j, tau in enumerate(TAUS_S):
            d = float(np.exp(-bucket_s / tau))
            start = base[:, j] * np.exp(-gap / tau)
            # y_i = d * y_{i-1} + x_i, from y_{-1} = start: exact for one bucket or many.
            acc = lfilter([1.0], [1.0, -d], filled, axis=1, zi=(d * start)[:, None])[0]
            rate = np.log1p(acc * 3600.0 / tau)
            col = (5 if name == "ecc" else 8) + j
            cols[:, :, col] = np.where(np.isnan(x), np.nan, rate)
            out_acc[:, j] = acc[:, -1]
        new_acc[name] = out_acc
    # Remap events: the total grew since its last readable value (a repair resets it).
    prev = np.concatenate([state.last_remapped_log[:, None], remapped_log[:, :-1]], axis=1)
    # Forward-fill the previous readable value across NaN buckets.
    idx = np.where(~np.isnan(prev), np.arange(k)[None, :], -1)
    idx = np.maximum.accumulate(idx, axis=1)
    prev_ff = np.where(idx >= 0, np.take_along_axis(prev, np.maximum(idx, 0), axis=1), np.nan)
    remap_event = remapped_log > prev_ff  # NaN compares False
    xid_event = np.nan_to_num(xid) > 0
    repaired = np.asarray(repaired, dtype=bool)
    last_repair = _running_last(state.last_repair_s, repaired, t)
    last_xid = _running_last(state.last_xid_s, xid_event, t)
    last_remap = _running_last(state.last_remap_s, remap_event, t)
    repairs = state.repairs[:, None] + np.cumsum(repaired, axis=1)
    first = np.where(np.isnan(state.first_seen_s), t_end - bucket_s, state.first_seen_s)
    cols[:, :, 0] = np.log1p(np.maximum(t - first[:, None], 0.0) / DAY_S)
    cols[:, :, 1] = np.log1p(repairs)
    cols[:, :, 2] = _since(t, last_repair)
    cols[:, :, 3] = np.where(np.isnan(xid), np.nan, _since(t, last_xid))
    cols[:, :, 4] = np.where(np.isnan(remapped_log), np.nan, _since(t, last_remap))
    last_readable = np.where(np.isnan(remapped_log), prev_ff, remapped_log)[:, -1]
    new = DeviceState(
        first_seen_s=first,
        t_s=t[:, -1],
        repairs=repairs[:, -1],
        last_repair_s=last_repair[:, -1],
        last_xid_s=last_xid[:, -1],
        last_remap_s=last_remap[:, -1],
        last_remapped_log=last_readable,
        ecc_acc=new_acc["ecc"],
        xid_acc=new_acc["xid"],
    )
    return new, cols.astype(np.float32)


def state_from_events(
    t_s: float,
    *,
    first_seen_s: float = 0.0,
    repairs: Iterable[float] = (),
    xids: Iterable[float] = (),
    remaps: Iterable[float] = (),
    errors: Iterable[tuple[float, float]] = (),
    remapped_log: float = np.nan,
) -> DeviceState:
    """One device's state at ``t_s`` from its record before then, as point events: repair
    times, critical XID times, remap times, (time, corrected errors) pairs. The fleet
    history starts each segment from this (events at or after ``t_s`` are ignored)."""
    s = DeviceState.empty(1, first_seen_s)
    s.t_s[0] = t_s
    rep = [x for x in repairs if x < t_s]
    s.repairs[0] = len(rep)
    s.last_repair_s[0] = max(rep, default=-np.inf)
    xs = np.asarray([x for x in xids if x < t_s], dtype=np.float64)
    s.last_xid_s[0] = xs.max() if len(xs) else -np.inf
    s.last_remap_s[0] = max((x for x in remaps if x < t_s), default=-np.inf)
    s.last_remapped_log[0] = remapped_log
    ev = [(a, n) for a, n in errors if a < t_s]
    et = np.asarray([a for a, _ in ev], dtype=np.float64)
    en = np.asarray([n for _, n in ev], dtype=np.float64)
    for j, tau in enumerate(TAUS_S):
        s.ecc_acc[0, j] = float(np.sum(en * np.exp(-(t_s - et) / tau)))
        s.xid_acc[0, j] = float(np.sum(np.exp(-(t_s - xs) / tau)))
    return s
