"""The twin reports, per SKU, only the telemetry its real backend can read."""

from __future__ import annotations

from gpuflow.hardware.backend import TELEMETRY_FIELDS
from gpuflow.hardware.health import health_status
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.telemetry_fields import HY_SMI, NVML_PAGE_RETIREMENT, NVML_ROW_REMAPPING

HOUR = 3600.0


def test_each_sku_declares_what_its_real_backend_reads(quiet: SimBackend) -> None:
    assert quiet.telemetry_fields("a100-0", 0) == NVML_ROW_REMAPPING
    assert quiet.telemetry_fields("v100-0", 0) == NVML_PAGE_RETIREMENT
    assert quiet.telemetry_fields("dcu-0", 0) == HY_SMI == frozenset()
    for d in quiet.devices():
        s = quiet.telemetry(d.node, d.index)
        # The sample carries exactly the declared fields, no more, no less.
        assert s.unreadable_fields() == TELEMETRY_FIELDS - quiet.telemetry_fields(d.node, d.index)


def test_v100_has_ecc_and_retired_pages_but_no_row_remaps(quiet: SimBackend) -> None:
    v = quiet.telemetry("v100-0", 0)
    assert isinstance(v.ecc_corrected_total, int) and v.ecc_uncorrected_total == 0
    assert v.retired_pages == 0 and v.xids == ()
    assert v.clock_event_reasons is not None
    assert (
        v.remapped_rows_correctable,
        v.remapped_rows_uncorrectable,
        v.remapped_rows_pending,
        v.remapped_rows_failure,
    ) == (None, None, None, None)
    a = quiet.telemetry("a100-0", 0)
    assert a.remapped_rows_pending is False and a.retired_pages is None  # Ampere: remaps


def test_dcu_reports_nothing_hy_smi_cannot_read(quiet: SimBackend) -> None:
    s = quiet.telemetry("dcu-0", 0)
    assert s.present and s.temperature_c > 0 and s.power_mw > 0
    for name in TELEMETRY_FIELDS:
        assert getattr(s, name) is None, name


def test_a_dcu_hbm_fault_gives_no_warning_and_still_fails(quiet: SimBackend) -> None:
    quiet.set_workload("dcu-0", 0, "job", 0.9, memory_mb=1000)
    quiet.inject_fault("dcu-0", 0, "hbm", lead_s=24 * HOUR)
    statuses = []
    for _ in range(25):
        quiet.advance(HOUR)
        s = quiet.telemetry("dcu-0", 0)
        assert s.ecc_corrected_total is None and s.xids is None and s.retired_pages is None
        statuses.append(health_status(s).level)
    # The twin's ground truth says it failed; telemetry never hinted at it.
    assert quiet.device_health("dcu-0", 0)["health"] == "failed"
    assert quiet.workload_status("job").startswith("failed")
    assert set(statuses) == {"ok"}
    assert "xids" in health_status(s).unreadable
    # The precursors happened on the twin (its labels), invisible through hy-smi.
    kinds = [e["event"] for e in quiet.fault_log() if e["node"] == "dcu-0"]
    assert kinds == ["onset", "precursor", "precursor", "failure"]


def test_v100_remap_failure_shows_through_ecc_and_xid_only(quiet: SimBackend) -> None:
    quiet.inject_fault("v100-0", 0, "ecc-uncorrectable")
    v = quiet.telemetry("v100-0", 0)
    assert v.ecc_uncorrected_total == 1 and 48 in v.xids and v.retired_pages == 1
    assert v.remapped_rows_failure is None
    assert health_status(v).level == "critical"


def test_a_lost_device_reads_only_the_xids_it_left(quiet: SimBackend) -> None:
    quiet.inject_fault("a100-0", 1, "xid79")
    a = quiet.telemetry("a100-0", 1)
    assert a.present is False and a.xids == (79,)
    assert a.unreadable_fields() == TELEMETRY_FIELDS - {"xids"}
    quiet.inject_fault("dcu-0", 0, "xid79")
    d = quiet.telemetry("dcu-0", 0)
    assert d.present is False and d.xids is None  # hy-smi just stops listing the card
