"""The fleet's rolling feature windows: every device's buckets, kept between monitor runs.

``FleetWindows`` keeps the state of features.py's buckets for a whole fleet in numpy
arrays (10,000 devices update and assemble in milliseconds) and saves it to one .npz so
that consecutive monitor runs continue where the last one stopped. What a bucket and a
window hold, and why, is features.py's; this module only accumulates them per device.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.hardware.backend import TelemetrySample
from gpuflow.hardware.home import replace_atomically
from gpuflow.tasks.health.device_state import DeviceState
from gpuflow.tasks.health.features import (
    BUCKET_S,
    FEATURES,
    MEAN_CHANNELS,
    N_COUNTERS,
    N_FEATURES,
    N_XID_CLASSES,
    NO_GROWTH_COLS,
    REFERENCE_C,
    THERMAL_REASONS,
    WINDOW_BUCKETS,
    bucket_matrix,
    num_or_nan,
    remapped_total,
    with_state,
    xid_class_counts,
    zero_growth,
)

DeviceKey = tuple[str, int]  # (node, index)


class FleetWindows:
    """Rolling bucket windows of many devices, updated from telemetry samples.

    Rows are devices (added on first sight). Per row: the last ``window`` completed
    buckets, the bucket in progress (accumulators), the counters at the previous sample.
    ``windows()`` returns [rows, window, F] with the bucket in progress as the newest
    bucket, so a new XID counts at the next score, not five minutes later.
    """

    def __init__(self, window: int = WINDOW_BUCKETS, bucket_s: float = BUCKET_S) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2 buckets, got {window}")
        if bucket_s <= 0:
            raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
        self.window = window
        self.bucket_s = bucket_s
        self.keys: list[DeviceKey] = []
        self._row: dict[DeviceKey, int] = {}
        self.max_clock_mhz = np.zeros(0, dtype=np.float64)
        self.done = np.zeros((0, window, N_FEATURES), dtype=np.float32)  # completed buckets
        self.n_done = np.zeros(0, dtype=np.int64)  # how many of them are real
        self.bucket_id = np.full(0, -1, dtype=np.int64)  # id of the bucket in progress
        self.acc_n = np.zeros(0, dtype=np.int64)
        self.acc_means = np.zeros((0, len(MEAN_CHANNELS)), dtype=np.float64)
        self.acc_temp_max = np.zeros(0, dtype=np.float64)
        self.acc_xids = np.zeros((0, N_XID_CLASSES), dtype=np.float64)
        self.acc_start = np.zeros((0, N_COUNTERS), dtype=np.float64)  # counters at start
        self.last_counters = np.zeros((0, N_COUNTERS), dtype=np.float64)
        self.last_flags = np.zeros((0, 2), dtype=np.float64)
        self.prev_temp = np.full(0, np.nan, dtype=np.float64)  # last completed bucket's temp
        self.last_ts = np.full(0, -np.inf, dtype=np.float64)
        # The multi-day record (device_state): never reset, only advanced.
        self.state = DeviceState.empty(0)
        self.acc_repaired = np.zeros(0, dtype=bool)  # a repair seen in the bucket in progress

    # -- rows -----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.keys)

    def row(self, node: str, index: int) -> int | None:
        return self._row.get((node, index))

    def ensure(self, keys: Sequence[DeviceKey], max_clock_mhz: Sequence[float]) -> np.ndarray:
        """Row numbers of ``keys``, adding the unknown ones."""
        row = self._row
        new = [(k, c) for k, c in zip(keys, max_clock_mhz, strict=True) if k not in row]
        if new:
            start = len(self.keys)
            for i, (k, _) in enumerate(new):
                self._row[k] = start + i
                self.keys.append(k)
            m = len(new)
            self.max_clock_mhz = np.concatenate(
                [self.max_clock_mhz, np.asarray([c for _, c in new], dtype=np.float64)]
            )
            self.done = np.concatenate(
                [self.done, np.zeros((m, self.window, N_FEATURES), dtype=np.float32)]
            )
            self.n_done = np.concatenate([self.n_done, np.zeros(m, dtype=np.int64)])
            self.bucket_id = np.concatenate([self.bucket_id, np.full(m, -1, dtype=np.int64)])
            self.acc_n = np.concatenate([self.acc_n, np.zeros(m, dtype=np.int64)])
            self.acc_means = np.concatenate([self.acc_means, np.zeros((m, len(MEAN_CHANNELS)))])
            self.acc_temp_max = np.concatenate([self.acc_temp_max, np.zeros(m)])
            self.acc_xids = np.concatenate([self.acc_xids, np.zeros((m, N_XID_CLASSES))])
            self.acc_start = np.concatenate([self.acc_start, np.zeros((m, N_COUNTERS))])
            self.last_counters = np.concatenate([self.last_counters, np.zeros((m, N_COUNTERS))])
            self.last_flags = np.concatenate([self.last_flags, np.zeros((m, 2))])
            self.prev_temp = np.concatenate([self.prev_temp, np.full(m, np.nan)])
            self.last_ts = np.concatenate([self.last_ts, np.full(m, -np.inf)])
            self.state = DeviceState.concat([self.state, DeviceState.empty(m)])
            self.acc_repaired = np.concatenate([self.acc_repaired, np.zeros(m, dtype=bool)])
        return np.fromiter(map(row.__getitem__, keys), dtype=np.int64, count=len(keys))

    def reset_rows(self, rows: np.ndarray) -> None:
        """Forget the window of these devices (repaired, replaced, or back after a gap);
        their multi-day record (``state``) carries on."""
        self.n_done[rows] = 0
        self.bucket_id[rows] = -1
        self.acc_n[rows] = 0
        self.prev_temp[rows] = np.nan
        self.last_ts[rows] = -np.inf

    # -- updates --------------------------------------------------------------------
    def update(
        self, samples: Sequence[TelemetrySample], max_clock_mhz: Sequence[float]
    ) -> np.ndarray:
        """Add one sample per device (present devices only; lost ones are not scored);
        returns the samples' row numbers."""
        if len(samples) != len(max_clock_mhz):
            raise ValueError("samples and max_clock_mhz must have the same length")
        if not samples:
            return np.zeros(0, dtype=np.int64)
        keys = [(s.node, s.index) for s in samples]
        rows = self.ensure(keys, max_clock_mhz)
        n = len(samples)

        def col(get: Any) -> np.ndarray:
            return np.fromiter(map(get, samples), dtype=np.float64, count=n)

        ts = col(lambda s: s.timestamp_s)
        temps = col(lambda s: s.temperature_c)
        power_mw = col(lambda s: s.power_mw)
        limit_mw = col(lambda s: s.power_limit_mw)
        mem_total = col(lambda s: s.memory_total_mb)
        max_clock = self.max_clock_mhz[rows]
        reasons = [s.clock_event_reasons for s in samples]
        means = np.empty((n, len(MEAN_CHANNELS)))
        means[:, 0] = (temps - REFERENCE_C) / np.maximum(power_mw / 1000.0, 1.0)
        means[:, 1] = np.where(limit_mw > 0, power_mw / np.maximum(limit_mw, 1.0), 0.0)
        means[:, 2] = np.where(
            max_clock > 0, col(lambda s: s.sm_clock_mhz) / np.maximum(max_clock, 1.0), 0.0
        )
        means[:, 3] = np.fromiter(
            (np.nan if r is None else float(not THERMAL_REASONS.isdisjoint(r)) for r in reasons),
            dtype=np.float64,
            count=n,
        )
        means[:, 4] = np.fromiter(
            (np.nan if r is None else float("SwPowerCap" in r) for r in reasons), np.float64, n
        )
        means[:, 5] = col(lambda s: s.utilization_ratio)
        means[:, 6] = np.where(
            mem_total > 0, col(lambda s: s.memory_used_mb) / np.maximum(mem_total, 1.0), 0.0
        )
        counters = np.empty((n, N_COUNTERS))
        counters[:, 0] = col(lambda s: num_or_nan(s.ecc_corrected_total))
        counters[:, 1] = col(lambda s: num_or_nan(s.ecc_uncorrected_total))
        counters[:, 2] = col(remapped_total)
        flags = np.empty((n, 2))
        flags[:, 0] = col(lambda s: num_or_nan(s.remapped_rows_pending))
        flags[:, 1] = col(lambda s: num_or_nan(s.remapped_rows_failure))
        xids = np.zeros((n, N_XID_CLASSES))
        for i, s in enumerate(samples):
            if s.xids is None:  # this backend cannot read XIDs: absent, not "none seen"
                xids[i] = np.nan
            elif s.xids:  # rare: a loop over the few samples that carry XIDs
                xids[i] = xid_class_counts(s.xids)
        self.update_arrays(rows, ts, temps, means, counters, flags, xids)
        return rows

    def update_arrays(
        self,
        rows: np.ndarray,
        ts: np.ndarray,
        temps: np.ndarray,
        means: np.ndarray,
        counters: np.ndarray,
        flags: np.ndarray,
        xids: np.ndarray,
    ) -> None:
        """The vectorized core of update(); arrays are per sample, aligned with ``rows``."""
        if len(np.unique(rows)) != len(rows):
            raise ValueError("one sample per device per update")
        # A sample older than the last one of its device is ignored (clock went back).
        fresh = ts > self.last_ts[rows]
        rows, ts, temps, means = rows[fresh], ts[fresh], temps[fresh], means[fresh]
        counters, flags, xids = counters[fresh], flags[fresh], xids[fresh]
        # Counters that went down: the device was repaired; its old window means nothing.
        repaired = np.any(counters < self.last_counters[rows] - 1e-9, axis=1) & (
            self.bucket_id[rows] >= 0
        )
        bid = np.floor(ts / self.bucket_s).astype(np.int64)
        # A gap longer than the window: start over (the buckets in between are unknown).
        gap = (self.bucket_id[rows] >= 0) & (bid - self.bucket_id[rows] > self.window)
        restart = repaired | gap
        if restart.any():
            # The record keeps what the bucket in progress saw before the window restarts.
            r = rows[restart]
            self.state.put(r, self._with_current(r)[0])
            self.reset_rows(r)
        cur = self.bucket_id[rows]
        advancing = (cur >= 0) & (bid > cur)
        if advancing.any():
            self._close_buckets(rows[advancing], bid[advancing] - cur[advancing])
        opening = self.bucket_id[rows] != bid
        if opening.any():
            r = rows[opening]
            self.bucket_id[r] = bid[opening]
            self.acc_n[r] = 0
            self.acc_means[r] = 0.0
            self.acc_temp_max[r] = -np.inf
            self.acc_xids[r] = 0.0
            self.acc_repaired[r] = False
            # The bucket's growth counts from the previous sample (continuous deltas);
            # a device seen for the first time starts from its current counters.
            first = ~np.isfinite(self.last_ts[r])
            start = self.last_counters[r].copy()
            start[first] = counters[opening][first]
            self.acc_start[r] = start
        if repaired.any():
            self.acc_repaired[rows[repaired]] = True  # the record counts the repair
        self.acc_n[rows] += 1
        self.acc_means[rows] += means
        self.acc_temp_max[rows] = np.maximum(self.acc_temp_max[rows], temps)
        self.acc_xids[rows] += xids
        self.last_counters[rows] = counters
        self.last_flags[rows] = flags
        self.last_ts[rows] = ts

    def _current_base(self, rows: np.ndarray) -> np.ndarray:
        """Base features (BASE_FEATURES) of the buckets in progress."""
        n = np.maximum(self.acc_n[rows], 1)[:, None]
        temps = self.acc_temp_max[rows]
        out = bucket_matrix(
            temperature_c=temps,
            means=self.acc_means[rows] / n,
            counters_start=self.acc_start[rows],
            counters_end=self.last_counters[rows],
            remap_pending=self.last_flags[rows, 0],
            remap_failure=self.last_flags[rows, 1],
            xid_counts=self.acc_xids[rows],
            bucket_s=self.bucket_s,
        )
        prev = self.prev_temp[rows]
        # The trend is against the previous completed bucket (none yet: flat).
        out[:, 1] = np.where(np.isnan(prev), 0.0, (temps - prev) * 3600.0 / self.bucket_s)
        return out

    def _bucket_end(self, rows: np.ndarray, ahead: int = 0) -> np.ndarray:
        return (self.bucket_id[rows] + 1 + ahead).astype(np.float64) * self.bucket_s

    def _with_current(self, rows: np.ndarray) -> tuple[DeviceState, np.ndarray]:
        """(the record with the buckets in progress folded in, their full features)."""
        new, out = with_state(
            self.state.take(rows),
            self._current_base(rows)[:, None],
            self._bucket_end(rows),
            self.acc_repaired[rows][:, None],
            self.bucket_s,
        )
        return new, out[:, 0]

    def _current_buckets(self, rows: np.ndarray) -> np.ndarray:
        """Full features of the buckets in progress (the record not yet advanced)."""
        return self._with_current(rows)[1]

    def _close_buckets(self, rows: np.ndarray, steps: np.ndarray) -> None:
        """Push the bucket in progress; missing buckets in a short gap repeat it, with no
        counter growth and no XIDs (nothing was seen then). The record advances by each."""
        cur = self._current_base(rows)
        for k in range(int(steps.max())):
            sel = steps > k
            r = rows[sel]
            base = cur[sel]
            if k > 0:
                base = base.copy()
                zero_growth(base, NO_GROWTH_COLS)  # no trend, growth or XIDs (NaN stays)
            repaired = self.acc_repaired[r] if k == 0 else np.zeros(len(r), dtype=bool)
            new, full = with_state(
                self.state.take(r),
                base[:, None],
                self._bucket_end(r, k),
                repaired[:, None],
                self.bucket_s,
            )
            self.state.put(r, new)
            b = full[:, 0]
            self.done[r, :-1] = self.done[r, 1:]
            self.done[r, -1] = b
            self.n_done[r] = np.minimum(self.n_done[r] + 1, self.window)
            self.prev_temp[r] = b[:, 0]

    # -- windows --------------------------------------------------------------------
    def ready(self) -> np.ndarray:
        """Rows that have at least one sample."""
        return np.flatnonzero(self.bucket_id >= 0)

    def windows(self, rows: np.ndarray | None = None) -> np.ndarray:
        """[rows, window, F]: the last window-1 completed buckets + the one in progress.

        A device with fewer buckets so far is padded at the front with copies of its
        oldest known bucket (no growth, no XIDs), so a new device scores as steady.
        """
        rows = self.ready() if rows is None else np.asarray(rows, dtype=np.int64)
        w = self.window
        out = np.empty((len(rows), w, N_FEATURES), dtype=np.float32)
        if not len(rows):
            return out
        out[:, :-1] = self.done[rows, 1:]
        out[:, -1] = self._current_buckets(rows)
        have = np.minimum(self.n_done[rows], w - 1)  # completed buckets in the window
        short = np.flatnonzero(have < w - 1)
        for i in short:
            h = int(have[i])
            oldest = out[i, w - 1 - h].copy()
            zero_growth(oldest, NO_GROWTH_COLS)
            out[i, : w - 1 - h] = oldest
        return out

    # -- persistence ----------------------------------------------------------------
    def save(self, path: Path) -> None:
        """Atomically write the state to ``path`` (.npz)."""
        path = Path(path)
        buf = io.BytesIO()
        np.savez(
            buf,
            meta=np.frombuffer(
                json.dumps(
                    {
                        "window": self.window,
                        "bucket_s": self.bucket_s,
                        "features": list(FEATURES),
                        "keys": [[n, i] for n, i in self.keys],
                    }
                ).encode(),
                dtype=np.uint8,
            ),
            max_clock_mhz=self.max_clock_mhz,
            done=self.done,
            n_done=self.n_done,
            bucket_id=self.bucket_id,
            acc_n=self.acc_n,
            acc_means=self.acc_means,
            acc_temp_max=self.acc_temp_max,
            acc_xids=self.acc_xids,
            acc_start=self.acc_start,
            last_counters=self.last_counters,
            last_flags=self.last_flags,
            prev_temp=self.prev_temp,
            last_ts=self.last_ts,
            acc_repaired=self.acc_repaired,
            **{f"state_{k}": v for k, v in self.state.arrays().items()},
        )
        replace_atomically(path, buf.getvalue(), ".windows-")

    @classmethod
    def load(cls, path: Path) -> FleetWindows:
        """The saved state; a file from another feature layout raises ValueError."""
        with np.load(Path(path)) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("features") != list(FEATURES):
                raise ValueError(
                    f"{path}: saved with features {meta.get('features')}, this code uses "
                    f"{list(FEATURES)}; delete the file to start over"
                )
            fw = cls(window=int(meta["window"]), bucket_s=float(meta["bucket_s"]))
            fw.keys = [(str(n), int(i)) for n, i in meta["keys"]]
            fw._row = {k: i for i, k in enumerate(fw.keys)}
            for name in (
                "max_clock_mhz",
                "done",
                "n_done",
                "bucket_id",
                "acc_n",
                "acc_means",
                "acc_temp_max",
                "acc_xids",
                "acc_start",
                "last_counters",
                "last_flags",
                "prev_temp",
                "last_ts",
                "acc_repaired",
            ):
                setattr(fw, name, z[name].copy())
            fw.state = DeviceState(
                **{k: z[f"state_{k}"].copy() for k in DeviceState.empty(0).arrays()}
            )
        return fw

    @classmethod
    def load_or_new(
        cls, path: Path, window: int = WINDOW_BUCKETS, bucket_s: float = BUCKET_S
    ) -> FleetWindows:
        """The saved state when it matches ``window``/``bucket_s``, else a fresh one."""
        path = Path(path)
        if path.exists():
            try:
                fw = cls.load(path)
            except (ValueError, KeyError, OSError):
                return cls(window, bucket_s)
            if fw.window == window and fw.bucket_s == bucket_s:
                return fw
        return cls(window, bucket_s)
