"""Telemetry samples, degraded fields and XID events (hardware/nvml/telemetry.py)."""

from __future__ import annotations

import pynvml
import pytest
from gpuflow.hardware.backend import TELEMETRY_FIELDS
from gpuflow.hardware.nvml import decode_clock_event_reasons
from gpuflow.hardware.telemetry_fields import NVML_PAGE_RETIREMENT, NVML_ROW_REMAPPING

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend, mig_on


def test_decode_clock_event_reasons():
    assert decode_clock_event_reasons(0) == ()
    assert decode_clock_event_reasons(0x1 | 0x4 | 0x40 | 0x100) == (
        "GpuIdle",
        "SwPowerCap",
        "HwThermalSlowdown",
    )


def test_telemetry_decoding():
    fake = FakeNvml(["a100-40gb"])
    d = fake.device(0)
    d.temperature_c, d.power_mw, d.energy_mj = 71, 312_500, 9_000_000
    d.utilization_gpu_pct, d.memory_used_mb, d.sm_clock_mhz = 87, 30_000, 1410
    d.ecc_volatile = {0: 5, 1: 1}
    d.ecc_aggregate = {0: 50, 1: 2}
    d.remapped_rows = (3, 1, 1, 0)
    d.clock_event_reasons = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwThermalSlowdown
    )
    b = backend(fake)
    fake.inject_xid(0, 48)
    fake.inject_xid(0, 63)
    s = b.telemetry(NODE, 0)
    assert s.present and (s.node, s.index) == (NODE, 0)
    assert (s.temperature_c, s.power_mw, s.energy_mj) == (71.0, 312_500, 9_000_000)
    assert s.utilization_ratio == pytest.approx(0.87)
    assert (s.memory_used_mb, s.memory_total_mb, s.sm_clock_mhz) == (30_000, 40960, 1410)
    assert s.power_limit_mw == 400_000
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (5, 1)  # volatile by default
    assert s.retired_pages is None  # A100 remaps rows; page retirement is NOT_SUPPORTED
    assert (s.remapped_rows_correctable, s.remapped_rows_uncorrectable) == (3, 1)
    assert s.remapped_rows_pending is True and s.remapped_rows_failure is False
    assert s.clock_event_reasons == ("SwPowerCap", "HwThermalSlowdown")
    assert s.xids == (48, 63)
    assert b.telemetry(NODE, 0).xids == ()  # drained
    fake.advance(2.0)
    assert b.energy_mj(NODE, 0) == 9_000_000 + 625_000

    agg = backend(fake, ecc_counter="aggregate").telemetry(NODE, 0)
    assert (agg.ecc_corrected_total, agg.ecc_uncorrected_total) == (50, 2)


def test_telemetry_degrades_not_supported_fields():
    fake = FakeNvml(["v100", "a100-40gb"], legacy_driver=True)
    v = fake.device(0)
    v.retired_pages = {0: [0x1000, 0x2000], 1: [0x3000]}
    v.ecc_enabled = False
    v.clock_event_reasons = pynvml.nvmlClocksThrottleReasonGpuIdle
    mig_on(fake, 1)
    fake.device(1).utilization_gpu_pct = 50
    b = backend(fake)
    s = b.telemetry(NODE, 0)
    assert s.retired_pages == 3  # both causes
    # V100: no row remapping, and ECC off: absent, not zero.
    assert (s.remapped_rows_correctable, s.remapped_rows_pending) == (None, None)
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (None, None)
    assert s.clock_event_reasons == ("GpuIdle",)  # from the pre-r535 ThrottleReasons call
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    assert b.telemetry(NODE, 1).utilization_ratio == 0.0  # MIG on: no utilization


def test_xids_reach_only_registered_event_sets():
    fake = FakeNvml(["h100", "h100"])
    b = backend(fake)
    fake.inject_xid(1, 94)
    fake.inject_xid(0, 13)
    assert b.telemetry(NODE, 0).xids == (13,)
    assert b.telemetry(NODE, 1).xids == (94,)


def test_probed_fields_match_what_nvml_offers_per_architecture():
    fake = FakeNvml(["a100-40gb", "v100", "h100"])
    b = backend(fake)
    assert b.telemetry_fields(NODE, 0) == NVML_ROW_REMAPPING
    assert b.telemetry_fields(NODE, 1) == NVML_PAGE_RETIREMENT  # V100: no remapped rows
    assert b.telemetry_fields(NODE, 2) == NVML_ROW_REMAPPING
    v = b.telemetry(NODE, 1)
    assert v.unreadable_fields() == TELEMETRY_FIELDS - NVML_PAGE_RETIREMENT
    assert (v.retired_pages, v.ecc_corrected_total, v.xids) == (0, 0, ())  # read: zero
    assert v.remapped_rows_failure is None


def test_fields_are_probed_once_and_not_asked_for_again():
    fake = FakeNvml(["v100"])
    b = backend(fake)
    b.telemetry(NODE, 0)
    probes = fake.calls.count("nvmlDeviceGetRemappedRows")
    assert probes == 1  # the probe, which answered NOT_SUPPORTED
    for _ in range(3):
        assert b.telemetry(NODE, 0).remapped_rows_pending is None
    assert fake.calls.count("nvmlDeviceGetRemappedRows") == probes


def test_ecc_off_and_no_event_set_leave_ecc_and_xids_absent():
    fake = FakeNvml(["a100-40gb"])
    fake.device(0).ecc_enabled = False
    fake.device(0).xid_events_supported = False  # the fake refuses nvmlDeviceRegisterEvents
    b = backend(fake)
    fields = b.telemetry_fields(NODE, 0)
    assert not fields & {"ecc_corrected_total", "ecc_uncorrected_total", "xids"}
    assert "remapped_rows_pending" in fields
    s = b.telemetry(NODE, 0)
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total, s.xids) == (None, None, None)
    assert s.remapped_rows_pending is False  # readable, and nothing pending


def test_a_lost_gpu_reads_no_counters():
    fake = FakeNvml(["a100-40gb"])
    b = backend(fake)
    b.discover()
    fake.inject_xid(0, 79)
    fake.lose_gpu(0)
    s = b.telemetry(NODE, 0)
    assert s.present is False and s.xids == (79,)
    assert s.ecc_corrected_total is None and s.remapped_rows_pending is None
