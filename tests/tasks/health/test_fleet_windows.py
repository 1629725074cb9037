from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gpuflow.hardware.backend import TelemetrySample
from gpuflow.tasks.health.features import (
    BUCKET_S,
    FEATURE_INDEX,
    N_FEATURES,
)
from gpuflow.tasks.health.fleet_windows import FleetWindows

from tests.hardware.inventory.helpers import telemetry_sample

FI = FEATURE_INDEX
T0 = 1_000_000 * BUCKET_S  # bucket-aligned


def sample(t: float, node: str = "n0", index: int = 0, **kw) -> TelemetrySample:
    """A reading with no XID, no throttling and no ECC counters unless ``kw`` gives them."""
    quiet = dict(
        temperature_c=50.0,
        power_mw=200_000,
        energy_mj=0,
        memory_used_mb=20_000,
        memory_total_mb=40_000,
        clock_event_reasons=(),
        xids=(),
    )
    return telemetry_sample(node, index, t, **{**quiet, **kw})


def feed(fw: FleetWindows, samples: list[TelemetrySample]) -> None:
    for s in samples:
        fw.update([s], [1410.0])


def test_bucket_aggregates_samples() -> None:
    fw = FleetWindows()
    # bucket 0: two samples; bucket 1: three samples with a hot one, errors and an XID.
    feed(
        fw,
        [
            sample(T0, temperature_c=40.0, ecc_corrected_total=5),
            sample(T0 + 5, temperature_c=42.0, ecc_corrected_total=6),
        ],
    )
    feed(
        fw,
        [
            sample(T0 + BUCKET_S, temperature_c=60.0, utilization_ratio=1.0, ecc_corrected_total=9),
            sample(
                T0 + BUCKET_S + 5,
                temperature_c=70.0,
                utilization_ratio=0.0,
                ecc_corrected_total=10,
                xids=(63,),
                remapped_rows_pending=True,
                remapped_rows_correctable=1,
                clock_event_reasons=("SwThermalSlowdown",),
            ),
            sample(
                T0 + BUCKET_S + 10,
                temperature_c=65.0,
                utilization_ratio=0.5,
                ecc_corrected_total=12,
                xids=(13, 79),
                remapped_rows_pending=True,
                remapped_rows_correctable=1,
            ),
        ],
    )
    w = fw.windows()
    assert w.shape == (1, fw.window, N_FEATURES)
    prev, cur = w[0, -2], w[0, -1]
    assert prev[FI["temperature_c"]] == pytest.approx(42.0)
    assert cur[FI["temperature_c"]] == pytest.approx(70.0)  # the hottest sample
    assert cur[FI["temperature_trend_c_per_h"]] == pytest.approx((70 - 42) * 3600 / BUCKET_S)
    assert cur[FI["utilization_ratio"]] == pytest.approx(0.5)
    assert cur[FI["throttle_thermal_ratio"]] == pytest.approx(1 / 3, rel=1e-5)
    # growth over the bucket counts from the last sample of the previous bucket (6 -> 12)
    assert cur[FI["ecc_corrected_delta_log"]] == pytest.approx(np.log1p(6))
    assert prev[FI["ecc_corrected_delta_log"]] == pytest.approx(np.log1p(1))
    assert cur[FI["ecc_corrected_total_log"]] == pytest.approx(np.log1p(12))
    assert cur[FI["remap_pending"]] == 1.0 and prev[FI["remap_pending"]] == 0.0
    assert cur[FI["remapped_rows_total_log"]] == pytest.approx(np.log1p(1))
    assert cur[FI["xid_memory_log"]] == pytest.approx(np.log1p(1))
    assert cur[FI["xid_bus_log"]] == pytest.approx(np.log1p(1))
    assert cur[FI["xid_app_log"]] == pytest.approx(np.log1p(1))
    assert prev[FI["xid_memory_log"]] == 0.0
    # a device with two buckets so far: the front is padded with its oldest bucket, flat
    assert np.allclose(w[0, 0, FI["temperature_c"]], 42.0)
    assert w[0, 0, FI["ecc_corrected_delta_log"]] == 0.0


def test_one_sample_scores_as_steady() -> None:
    fw = FleetWindows()
    feed(fw, [sample(T0 + 7, ecc_corrected_total=3)])
    w = fw.windows()[0]
    assert np.allclose(w, w[-1:])  # every bucket the same
    assert w[-1, FI["ecc_corrected_delta_log"]] == 0.0


def test_short_gap_repeats_last_bucket_without_events() -> None:
    fw = FleetWindows()
    feed(fw, [sample(T0, xids=(63,), ecc_corrected_total=1)])
    feed(fw, [sample(T0 + 4 * BUCKET_S, ecc_corrected_total=1)])  # 3 buckets unseen
    w = fw.windows()[0]
    assert w[-5, FI["xid_memory_log"]] > 0  # the real bucket keeps its XID
    assert np.all(w[-4:-1, FI["xid_memory_log"]] == 0)  # filled buckets carry no events
    assert fw.n_done[0] == 4


def test_long_gap_and_repair_restart_the_window() -> None:
    fw = FleetWindows()
    feed(fw, [sample(T0 + k * BUCKET_S, ecc_corrected_total=100 + k) for k in range(5)])
    assert fw.n_done[0] == 4
    feed(fw, [sample(T0 + 5 * BUCKET_S, ecc_corrected_total=0)])  # counters reset: repaired
    assert fw.n_done[0] == 0
    feed(fw, [sample(T0 + 6 * BUCKET_S, ecc_corrected_total=0)])
    assert fw.n_done[0] == 1
    feed(fw, [sample(T0 + 40 * BUCKET_S, ecc_corrected_total=0)])  # longer than the window
    assert fw.n_done[0] == 0


def test_stale_samples_are_ignored() -> None:
    fw = FleetWindows()
    feed(fw, [sample(T0 + 10, temperature_c=50.0)])
    before = fw.windows().copy()
    feed(fw, [sample(T0 + 5, temperature_c=90.0)])
    assert np.array_equal(fw.windows(), before)


def test_many_devices_and_save_load(tmp_path: Path) -> None:
    fw = FleetWindows()
    rng = np.random.default_rng(1)
    for k in range(15):
        fw.update(
            [
                sample(
                    T0 + k * 60,
                    node=f"n{i}",
                    index=i % 2,
                    temperature_c=float(rng.uniform(30, 80)),
                    ecc_corrected_total=k,
                )
                for i in range(6)
            ],
            [1410.0] * 6,
        )
    path = tmp_path / "w.npz"
    fw.save(path)
    back = FleetWindows.load(path)
    assert back.keys == fw.keys
    assert np.array_equal(back.windows(), fw.windows())
    # continuing after the load gives what continuing without it gives
    nxt = [sample(T0 + 16 * 60, node=f"n{i}", index=i % 2) for i in range(6)]
    fw.update(nxt, [1410.0] * 6)
    back.update(nxt, [1410.0] * 6)
    assert np.array_equal(back.windows(), fw.windows())


def test_load_or_new_starts_over_on_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "w.npz"
    fw = FleetWindows(window=6)
    feed(fw, [sample(T0)])
    fw.save(path)
    assert len(FleetWindows.load_or_new(path, window=6)) == 1
    assert len(FleetWindows.load_or_new(path, window=12)) == 0
    path.write_bytes(b"not a npz")
    assert len(FleetWindows.load_or_new(path)) == 0


def test_bad_input() -> None:
    fw = FleetWindows()
    with pytest.raises(ValueError, match="same length"):
        fw.update([sample(T0)], [])
    s = sample(T0)
    with pytest.raises(ValueError, match="one sample per device"):
        fw.update([s, replace(s, timestamp_s=T0 + 5)], [1.0, 1.0])
    with pytest.raises(ValueError, match="window"):
        FleetWindows(window=1)
