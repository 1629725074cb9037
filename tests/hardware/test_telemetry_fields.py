"""The declared telemetry capability sets (hardware/telemetry_fields.py) and how the
threshold rules (hardware/health.py) treat a field that is absent."""

from __future__ import annotations

from dataclasses import replace

from gpuflow.hardware.backend import TELEMETRY_FIELDS, TelemetrySample
from gpuflow.hardware.health import health_status
from gpuflow.hardware.skus import SKUS
from gpuflow.hardware.telemetry_fields import (
    HY_SMI,
    NVML_PAGE_RETIREMENT,
    NVML_ROW_REMAPPING,
    real_backend_fields,
    without_unreadable,
)

HEALTHY = TelemetrySample(
    node="n",
    index=0,
    timestamp_s=1.0,
    present=True,
    temperature_c=50.0,
    power_mw=100_000,
    energy_mj=0,
    utilization_ratio=0.5,
    memory_used_mb=0,
    memory_total_mb=32_768,
    sm_clock_mhz=1000,
    power_limit_mw=300_000,
)


def test_capability_sets_per_backend() -> None:
    assert real_backend_fields("Hygon", row_remapping=False) == HY_SMI == frozenset()
    assert real_backend_fields("NVIDIA", row_remapping=True) == NVML_ROW_REMAPPING
    assert real_backend_fields("NVIDIA", row_remapping=False) == NVML_PAGE_RETIREMENT
    assert "retired_pages" not in NVML_ROW_REMAPPING
    assert "remapped_rows_pending" not in NVML_PAGE_RETIREMENT
    assert NVML_ROW_REMAPPING | NVML_PAGE_RETIREMENT == TELEMETRY_FIELDS


def test_every_sku_maps_to_a_set() -> None:
    from gpuflow.hardware.sim.faults import uses_row_remapping

    for spec in SKUS.values():
        fields = real_backend_fields(spec.vendor, uses_row_remapping(spec))
        assert fields <= TELEMETRY_FIELDS
        if spec.vendor == "Hygon":
            assert not fields


def test_without_unreadable_blanks_only_optional_fields() -> None:
    values = {"temperature_c": 40.0, "xids": (13,), "retired_pages": 2}
    assert without_unreadable(values, frozenset({"xids"})) == {
        "temperature_c": 40.0,
        "xids": (13,),
        "retired_pages": None,
    }


def test_rules_cannot_fire_on_an_absent_field_and_say_so() -> None:
    blind = replace(HEALTHY, **{f: None for f in TELEMETRY_FIELDS})
    status = health_status(blind)
    assert status.level == "ok" and set(status.unreadable) == TELEMETRY_FIELDS
    assert health_status(HEALTHY).unreadable == ()
    hot = replace(blind, temperature_c=90.0)
    assert health_status(hot).level == "warn"  # what is readable still counts
    failing = replace(HEALTHY, ecc_uncorrected_total=2, remapped_rows_pending=None)
    assert health_status(failing).level == "critical"
    assert health_status(failing).unreadable == ("remapped_rows_pending",)
