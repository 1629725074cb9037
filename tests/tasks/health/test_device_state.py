"""The multi-day device record: one code path for the live windows and the history."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gpuflow.hardware.backend import TelemetrySample
from gpuflow.hardware.sim.noise import BenignRemap
from gpuflow.tasks.health.device_state import (
    NEVER_S,
    STATE_FEATURES,
    DeviceState,
    advance,
    state_from_events,
)
from gpuflow.tasks.health.features import BUCKET_S, FEATURE_INDEX, N_BASE
from gpuflow.tasks.health.fleet_windows import FleetWindows
from gpuflow.tasks.health.history import Device, Fault, HistoryConfig, Segment
from gpuflow.tasks.health.history_series import counters_vec, record_before, simulate_segment

from .test_fleet_windows import sample

SI = {f: i for i, f in enumerate(STATE_FEATURES)}
A100 = "NVIDIA A100-SXM4-40GB"


def _device() -> Device:
    d = Device(0, "n00000", 0, 0, A100, 30.0, False, 0.0)
    d.remaps = [BenignRemap(t_s=40 * BUCKET_S + 17.0, cleared_s=np.inf)]
    d.burst_t = [5 * BUCKET_S + 3.0, 21 * BUCKET_S + 100.0, 22 * BUCKET_S + 9.0]
    d.burst_n = [40, 7, 300]
    return d


def _sample(dev: Device, cfg: HistoryConfig, t: float, xids: tuple[int, ...]) -> TelemetrySample:
    counters, pending, _ = counters_vec(dev, None, np.asarray([t]), cfg)
    return sample(
        t,
        dev.node,
        dev.index,
        memory_total_mb=40_960,
        ecc_corrected_total=int(counters[0, 0]),
        ecc_uncorrected_total=0,
        remapped_rows_correctable=int(counters[0, 2]),
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=bool(pending[0]),
        remapped_rows_failure=False,
        clock_event_reasons=(),
        xids=xids,
    )


def test_live_windows_and_history_give_identical_state_columns() -> None:
    """The same telemetry (bursts of corrected errors, a benign remap with its XID 63) seen
    by the live windows, sample by sample, and drawn by the history for a segment."""
    cfg = HistoryConfig.small(app_xid_per_day=0.0)
    dev = _device()
    n = 60
    t0 = BUCKET_S  # the live device is first seen at 0, as the history's fleet is
    hist = simulate_segment(cfg, dev, Segment(0, t0, n, "background"))
    fw = FleetWindows()
    live = []
    remap_t = dev.remaps[0].t_s
    for k in range(-1, n):  # bucket -1: the live device's first sample (no growth yet)
        t = t0 + (k + 1) * BUCKET_S - 1.0  # the bucket's last sample
        xids = (63,) if t - BUCKET_S < remap_t <= t else ()
        fw.update([_sample(dev, cfg, t, xids)], [1410.0])
        if k >= 0:
            live.append(fw.windows()[0, -1, N_BASE:])
    live_cols = np.stack(live)
    np.testing.assert_array_equal(live_cols, hist[:, N_BASE:])
    # ...and the columns say what happened: the 300-error burst shows in the 1-hour rate,
    # the remap restarts "time since remap" and "since XID".
    k_burst = 21  # bucket k covers [t0 + k x 300, t0 + (k + 1) x 300)
    assert live_cols[k_burst, SI["ecc_rate_1h_log"]] > live_cols[k_burst - 1, SI["ecc_rate_1h_log"]]
    assert live_cols[k_burst, SI["ecc_rate_1h_log"]] > np.log1p(250)
    k_remap = 39
    assert live_cols[k_remap, SI["since_remap_h_log"]] < 0.1
    assert live_cols[k_remap, SI["since_xid_h_log"]] < 0.1
    assert live_cols[k_remap - 1, SI["since_remap_h_log"]] == np.float32(np.log1p(NEVER_S / 3600.0))


def test_the_record_survives_repairs_gaps_and_saving(tmp_path: Path) -> None:
    fw = FleetWindows()
    cfg = HistoryConfig.small()
    dev = _device()
    t = BUCKET_S - 1.0  # the bursts (up to 22 buckets) come within the 30 samples
    for k in range(30):
        fw.update([_sample(dev, cfg, t + k * BUCKET_S, ())], [1410.0])
    before = fw.windows()[0, -1]
    assert before[N_BASE + SI["repairs_prior_log"]] == 0.0
    # A repair (counters back to 0) restarts the window, not the record.
    fresh = Device(0, "n00000", 0, 0, A100, 30.0, False, 0.0)
    t_rep = t + 31 * BUCKET_S
    fw.update([_sample(fresh, cfg, t_rep, ())], [1410.0])
    after = fw.windows()[0, -1]
    assert after[N_BASE + SI["repairs_prior_log"]] == np.float32(np.log1p(1))
    assert after[N_BASE + SI["since_repair_h_log"]] < np.log1p(BUCKET_S / 3600.0) + 1e-6
    assert after[N_BASE + SI["ecc_rate_7d_log"]] > 0  # the bursts before it still count
    fw.save(tmp_path / "w.npz")
    again = FleetWindows.load(tmp_path / "w.npz")
    # A day later (a gap longer than the window) the 1 h rate has decayed, 7 d has not.
    t_late = t_rep + 86_400.0
    for f in (fw, again):
        f.update([_sample(fresh, cfg, t_late, ())], [1410.0])
    a, b = fw.windows()[0, -1], again.windows()[0, -1]
    np.testing.assert_array_equal(a, b)
    assert a[N_BASE + SI["repairs_prior_log"]] == np.float32(np.log1p(1))
    assert a[N_BASE + SI["ecc_rate_1h_log"]] < 1e-6 < a[N_BASE + SI["ecc_rate_7d_log"]]


def test_record_before_counts_earlier_faults_and_noise() -> None:
    dev = _device()
    dev.faults = [Fault(0, "xid79", 0.0, 3 * BUCKET_S, 0.0, 79, 4 * BUCKET_S, 0)]
    s = record_before(dev, 60 * BUCKET_S)
    assert s.repairs[0] == 1 and s.last_repair_s[0] == 4 * BUCKET_S
    assert s.last_remap_s[0] == dev.remaps[0].t_s  # the benign remap
    assert s.last_xid_s[0] == dev.remaps[0].t_s  # its XID 63 is newer than the XID 79
    assert s.ecc_acc[0, 2] > s.ecc_acc[0, 0] > 0  # bursts: 7 d keeps more than 1 h
    # Nothing at or after the segment's start is part of its record.
    early = record_before(dev, 4 * BUCKET_S)
    assert early.repairs[0] == 0 and early.last_xid_s[0] == 3 * BUCKET_S


def test_advance_one_bucket_at_a_time_equals_a_run_and_nan_stays_missing() -> None:
    rng = np.random.default_rng(0)
    k = 50
    ecc = rng.poisson(0.3, (2, k)).astype(float) * rng.integers(0, 50, (2, k))
    xid = (rng.random((2, k)) < 0.05).astype(float)
    xid[1] = np.nan  # a DCU: no XIDs readable
    remapped = np.log1p(np.cumsum(rng.random((2, k)) < 0.03, axis=1)).astype(float)
    repaired = rng.random((2, k)) < 0.02
    t_end = np.asarray([BUCKET_S, 7 * BUCKET_S])
    start = state_from_events(0.0, errors=[(-10.0, 5.0)])
    start = DeviceState.concat([start, start])
    _, run = advance(start, ecc, xid, remapped, t_end, repaired, BUCKET_S)
    s, steps = start, []
    for i in range(k):
        s, c = advance(
            s,
            ecc[:, i : i + 1],
            xid[:, i : i + 1],
            remapped[:, i : i + 1],
            t_end + i * BUCKET_S,
            repaired[:, i : i + 1],
            BUCKET_S,
        )
        steps.append(c[:, 0])
    np.testing.assert_array_equal(run, np.stack(steps, axis=1))
    xid_cols = [SI[f] for f in STATE_FEATURES if "xid" in f]
    assert np.isnan(run[1][:, xid_cols]).all() and not np.isnan(run[0][:, xid_cols]).any()
    assert FEATURE_INDEX["age_days_log"] == N_BASE
