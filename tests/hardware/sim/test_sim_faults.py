from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gpuflow.hardware.backend import DeviceLostError, HardwareError, InvalidRequestError
from gpuflow.hardware.sim import FAULT_KINDS, SimBackend
from gpuflow.hardware.sim import hazard as H
from gpuflow.hardware.skus import sku

HOUR = 3600.0
DAY = 86_400.0


def _events(twin: SimBackend) -> list[tuple[str, str]]:
    return [(e["event"], e["kind"]) for e in twin.fault_log()]


def test_fault_kinds_cover_the_brief() -> None:
    assert {"xid79", "hbm", "thermal", "ecc-uncorrectable", "remap-pending", "app-fatal"} <= set(
        FAULT_KINDS
    )


def test_hbm_precursors_come_in_order_before_the_failure(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "job", 0.9, memory_mb=2000)
    r = quiet.inject_fault("a100-0", 0, "hbm", lead_s=48 * HOUR)
    assert r["expected_failure_s"] == pytest.approx(r["sim_time_s"] + 48 * HOUR)
    seen: list[tuple[float, object]] = []
    failed_at = None
    for hour in range(1, 50):
        quiet.advance(HOUR)
        t = quiet.telemetry("a100-0", 0)
        seen.append((hour, t))
        if failed_at is None and quiet.workload_status("job").startswith("failed"):
            failed_at = hour
    corrected = [t.ecc_corrected_total for _, t in seen]
    assert corrected == sorted(corrected) and corrected[5] > 0
    first_63 = next(h for h, t in seen if 63 in t.xids)
    first_pending = next(h for h, t in seen if t.remapped_rows_pending)
    final = next(h for h, t in seen if set(t.xids) & {48, 94, 95, 64})
    assert 0 < first_63 == first_pending < final == 48 == failed_at
    # Corrected errors grew before the first remap; the job ran until the failure.
    assert corrected[first_63 - 2] > 0
    assert all(t.utilization_ratio > 0 for h, t in seen if h < final)
    last = seen[-1][1]
    assert last.ecc_uncorrected_total >= 1 or last.remapped_rows_failure
    assert last.present  # an ECC failure needs a reset; the device is still on the bus
    assert last.utilization_ratio == 0.0
    assert _events(quiet) == [
        ("onset", "hbm"),
        ("precursor", "hbm"),
        ("precursor", "hbm"),
        ("failure", "hbm"),
    ]
    log = quiet.fault_log()
    assert [e["sim_time_s"] for e in log] == sorted(e["sim_time_s"] for e in log)
    assert log[-1]["tenants"] == ["job"]
    with pytest.raises(HardwareError, match="repair"):
        quiet.set_workload("a100-0", 0, "job2", 0.5)
    quiet.repair("a100-0", 0)
    t = quiet.telemetry("a100-0", 0)
    assert (t.ecc_uncorrected_total, t.remapped_rows_pending, t.remapped_rows_failure) == (
        0,
        False,
        False,
    )
    quiet.set_workload("a100-0", 0, "job2", 0.5)


def test_abrupt_xid79_has_no_precursor(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 1, "job", 1.0)
    before = quiet.telemetry("a100-0", 1)
    r = quiet.inject_fault("a100-0", 1, "xid79")
    assert r["xids"] == [79] and r["failed_tenants"] == ["job"]
    assert (before.ecc_corrected_total, before.xids, before.remapped_rows_pending) == (0, (), False)
    t = quiet.telemetry("a100-0", 1)
    assert t.present is False and t.xids == (79,) and t.power_mw == 0
    assert quiet.workload_status("job").startswith("failed: device fell off the bus")
    assert _events(quiet) == [("failure", "xid79")]
    for call in (
        lambda: quiet.clocks("a100-0", 1),
        lambda: quiet.set_power_limit_mw("a100-0", 1, 300_000),
        lambda: quiet.partitions("a100-0", 1),
        lambda: quiet.set_workload("a100-0", 1, "again", 0.1),
    ):
        with pytest.raises(DeviceLostError):
            call()
    energy = t.energy_mj
    quiet.advance(DAY)
    assert quiet.energy_mj("a100-0", 1) == energy  # off the bus: no power drawn
    quiet.repair("a100-0", 1)
    assert quiet.telemetry("a100-0", 1).present


def test_thermal_degradation_drifts_throttles_then_shuts_down(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "job", 1.0)
    quiet.advance(600)
    base = quiet.telemetry("a100-0", 0)
    r = quiet.inject_fault("a100-0", 0, "thermal", lead_s=4 * DAY)
    s = sku("a100-40gb")
    samples = []
    for _ in range(4 * 24):
        quiet.advance(HOUR)
        samples.append(quiet.telemetry("a100-0", 0))
    temps = [t.temperature_c for t in samples if t.present]
    assert temps[0] < temps[10] < temps[20]  # a drift, under the same load
    assert temps[0] >= base.temperature_c
    reasons = [t.clock_event_reasons for t in samples if t.present]
    first_sw = next(i for i, rs in enumerate(reasons) if "SwThermalSlowdown" in rs)
    first_hw = next(i for i, rs in enumerate(reasons) if "HwSlowdown" in rs)
    assert first_sw <= first_hw
    lost = next(i for i, t in enumerate(samples) if not t.present)
    assert lost > first_hw
    assert 79 in samples[lost].xids
    failure = [e for e in quiet.fault_log() if e["event"] == "failure"]
    assert [e["kind"] for e in failure] == ["thermal"]
    assert failure[0]["sim_time_s"] <= r["expected_failure_s"] + 1e-6
    assert "thermal shutdown" in quiet.workload_status("job")
    assert max(temps) <= s.shutdown_temp_c


def test_ecc_uncorrectable_and_remap_pending(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "a", 0.5)
    r = quiet.inject_fault("a100-0", 0, "remap-pending")
    assert r["xids"] == [63]
    t = quiet.telemetry("a100-0", 0)
    assert t.remapped_rows_pending and t.remapped_rows_correctable == 1 and 63 in t.xids
    assert quiet.workload_status("a") == "running"
    r = quiet.inject_fault("a100-0", 0, "ecc-uncorrectable")
    assert r["xids"] == [48] and r["failed_tenants"] == ["a"]
    t = quiet.telemetry("a100-0", 0)
    assert t.ecc_uncorrected_total == 1 and t.remapped_rows_uncorrectable == 1 and t.present
    # V100 retires pages instead of remapping rows; NVML has no row-remap fields there.
    quiet.inject_fault("v100-0", 0, "remap-pending")
    v = quiet.telemetry("v100-0", 0)
    assert v.retired_pages == 1 and 63 in v.xids
    assert v.remapped_rows_correctable is None and v.remapped_rows_pending is None


def test_bad_fault_requests_list_what_is_valid(quiet: SimBackend) -> None:
    with pytest.raises(InvalidRequestError, match="valid: xid79, hbm"):
        quiet.inject_fault("a100-0", 0, "meteor")
    with pytest.raises(InvalidRequestError, match=r"devices: a100-0:0\.\.1"):
        quiet.inject_fault("a100-9", 0, "xid79")
    with pytest.raises(InvalidRequestError, match="lead_s"):
        quiet.inject_fault("a100-0", 0, "xid79", lead_s=10)
    quiet.inject_fault("a100-0", 0, "hbm")
    with pytest.raises(HardwareError, match="already degrading"):
        quiet.inject_fault("a100-0", 0, "thermal")
    assert _events(quiet) == [("onset", "hbm")]


def test_same_seed_same_natural_schedule(write_spec: Callable[..., Path], tmp_path: Path) -> None:
    spec = {
        "name": "busy",
        "seed": 99,
        "faults": {"rate_per_node_day": 0.5},  # far above real rates: many events quickly
        "nodes": [
            {
                "name": f"n{i}",
                "region": "r",
                "role": "active",
                "devices": [{"sku": "h100", "count": 4}],
            }
            for i in range(3)
        ],
    }
    path = write_spec(spec)
    logs = []
    for home in ("a", "b"):
        twin = SimBackend(home=tmp_path / home, spec_path=path)
        twin.advance(60 * DAY)
        logs.append(
            [
                (round(e["elapsed_s"], 3), e["node"], e["index"], e["event"], e["kind"])
                for e in twin.fault_log()
            ]
        )
    assert logs[0] == logs[1] and len(logs[0]) > 5
    kinds = {k for *_, k in logs[0]}
    assert {"hbm", "xid79"} <= kinds
    # The twin's natural onsets are the pure hazard model's schedule (minus skipped draws).
    model = H.HazardModel(rate_per_node_day=0.5)
    lemons, sched = H.fleet_schedule(99, 12, model, 60 * DAY)
    onsets = {(round(d.onset_s, 3), d.kind) for ds in sched.values() for d in ds}
    twin_onsets = {
        (t, k)
        for t, _, _, ev, k in logs[0]
        if ev == "onset" or (ev == "failure" and k in H.ABRUPT_KINDS)
    }
    assert twin_onsets <= onsets
    other = write_spec({**spec, "seed": 100})
    twin = SimBackend(home=tmp_path / "c", spec_path=other)
    twin.advance(60 * DAY)
    assert [(round(e["elapsed_s"], 3), e["kind"]) for e in twin.fault_log()] != [
        (t, k) for t, _, _, _, k in logs[0]
    ]
