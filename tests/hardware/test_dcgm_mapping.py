"""gpuflow fields -> DCGM exporter's names, units and labels (hardware/dcgm_mapping.py)."""

from __future__ import annotations

import itertools

import pytest
from gpuflow.hardware.backend import (
    CLOCK_EVENT_REASONS,
    TELEMETRY_FIELDS,
    ClockState,
    DeviceInfo,
    Partition,
    TelemetrySample,
)
from gpuflow.hardware.dcgm_mapping import (
    clock_event_mask,
    clock_values,
    device_labels,
    ecc_specs,
    instance_ids,
    partition_labels,
    placement_instance_id,
    sample_values,
)
from gpuflow.hardware.mig_geometry import A30_MIG_GEOMETRY, A100_MIG_GEOMETRY
from gpuflow.hardware.sim import SimBackend

DEV = DeviceInfo("node-a", 3, "NVIDIA", "NVIDIA A100-SXM4-40GB", "GPU-1", 40960)


def _sample(**over: object) -> TelemetrySample:
    base: dict[str, object] = {
        "node": "node-a",
        "index": 3,
        "timestamp_s": 1.0,
        "present": True,
        "temperature_c": 41.5,
        "power_mw": 123_456,
        "energy_mj": 9_000,
        "utilization_ratio": 0.375,
        "memory_used_mb": 1024,
        "memory_total_mb": 40960,
        "sm_clock_mhz": 1410,
        "power_limit_mw": 400_000,
    }
    return TelemetrySample(**{**base, **over})  # type: ignore[arg-type]


def test_units_are_dcgms() -> None:
    got = {spec.name: v for spec, v in sample_values(_sample())}
    assert got["DCGM_FI_DEV_GPU_TEMP"] == 41.5
    assert got["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(123.456)  # mW -> W
    assert got["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 400.0
    assert got["DCGM_FI_DEV_GPU_UTIL"] == 37.5  # ratio -> %
    assert got["DCGM_FI_DEV_FB_USED"] == 1024 and got["DCGM_FI_DEV_FB_FREE"] == 40960 - 1024
    assert got["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 9_000  # mJ, as DCGM
    assert got["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 0.0  # read, and nothing pending


def test_a_field_the_backend_cannot_read_has_no_series_at_all() -> None:
    blank = dict.fromkeys(TELEMETRY_FIELDS)  # a backend that reads none (hy-smi)
    names = {spec.name for spec, _ in sample_values(_sample(**blank))}
    assert names == {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL",
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
    }
    # A device off the bus answers nothing: its zeros are not readings.
    assert sample_values(_sample(present=False, temperature_c=0.0)) == []


def test_ecc_names_follow_the_counter_nvml_reads() -> None:
    assert [s.name for s in ecc_specs()] == [
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ]
    assert [s.name for s in ecc_specs("aggregate")] == [
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    ]
    values = {s.name: v for s, v in sample_values(_sample(ecc_corrected_total=7), "aggregate")}
    assert values["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] == 7
    assert "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" not in values


def test_clock_events_as_nvmls_bitmask() -> None:
    assert clock_event_mask(()) == 0
    assert clock_event_mask(("GpuIdle",)) == 0x1
    assert clock_event_mask(("SwPowerCap", "HwSlowdown", "SwPowerCap")) == 0x4 | 0x8
    assert clock_event_mask(CLOCK_EVENT_REASONS) == 0xFF
    got = {s.name: v for s, v in sample_values(_sample(clock_event_reasons=("SwThermalSlowdown",)))}
    assert got["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0x20


def test_application_clocks_only_where_reported() -> None:
    both = ClockState(
        1410, 210, 1410, applications_sm_clock_mhz=1095, applications_mem_clock_mhz=1215
    )
    assert [(s.name, v) for s, v in clock_values(both)] == [
        ("DCGM_FI_DEV_APP_SM_CLOCK", 1095.0),
        ("DCGM_FI_DEV_APP_MEM_CLOCK", 1215.0),
    ]
    assert clock_values(ClockState(300, 300, 1500)) == []


def test_labels_are_dcgm_exporters() -> None:
    assert device_labels(DEV) == {
        "gpu": "3",
        "UUID": "GPU-1",
        "modelName": "NVIDIA A100-SXM4-40GB",
        "Hostname": "node-a",
        "vendor": "NVIDIA",
    }
    mig = Partition("node-a", 3, "MIG-9", "1g.5gb", "mig", 4864, 6, 1)
    assert partition_labels(DEV, mig, 13) == {
        **device_labels(DEV),
        "GPU_I_PROFILE": "1g.5gb",
        "GPU_I_ID": "13",
    }


@pytest.mark.parametrize("geometry", [A100_MIG_GEOMETRY, A30_MIG_GEOMETRY])
def test_placement_ids_never_collide_for_instances_that_can_coexist(geometry) -> None:  # type: ignore[no-untyped-def]
    slices = geometry.memory_slices
    spots = {(start, slot.memory_slices) for slot in geometry.slots for start in slot.starts}
    ids = {spot: placement_instance_id(*spot, slices) for spot in spots}
    assert None not in ids.values()
    for a, b in itertools.combinations(spots, 2):
        overlap = a[0] < b[0] + b[1] and b[0] < a[0] + a[1]
        if not overlap:
            assert ids[a] != ids[b], (a, b)
    assert placement_instance_id(0, slices, slices) == 0  # the whole GPU
    assert placement_instance_id(1, 2, 8) is None  # not aligned: no tree position
    assert placement_instance_id(0, 3, 8) is None


def test_instance_ids_prefer_the_drivers_and_derive_the_rest() -> None:
    twin = SimBackend()
    dev = twin.device("a100-0", 0)
    parts = [
        Partition(dev.node, 0, "MIG-a", "3g.20gb", "mig", 20096, 4, 4),
        Partition(dev.node, 0, "MIG-b", "1g.5gb", "mig", 4864, 0, 1),
    ]
    assert instance_ids(twin, dev, parts) == {"MIG-a": 2, "MIG-b": 7}  # the twin has none

    class Driver(SimBackend):
        def gpu_instance_ids(self, node: str, index: int) -> dict[str, int]:
            return {"MIG-a": 2, "MIG-b": 5}

    assert instance_ids(Driver(), dev, parts) == {"MIG-a": 2, "MIG-b": 5}
    dcu = twin.device("dcu-0", 0)
    vdcus = [
        Partition(dcu.node, 0, f"VDCU-{i}", "vdcu", "vdcu", 4096, compute_units=5) for i in range(3)
    ]
    assert instance_ids(twin, dcu, vdcus) == {"VDCU-0": 0, "VDCU-1": 1, "VDCU-2": 2}
