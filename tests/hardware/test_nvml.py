"""NvmlBackend against the in-repo NVML fake (tests/hardware/fake_pynvml.py)."""

from __future__ import annotations

import ctypes
import inspect

import pynvml
import pytest
from gpuflow.hardware.backend import (
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.nvml import NvmlBackend, decode_clock_event_reasons, mig_profile_name
from gpuflow.hardware.placement import LayoutError
from gpuflow.hardware.skus import sku

try:  # tests/ importable as a package (repo root on sys.path)
    from tests.hardware import fake_pynvml
except ImportError:  # pytest's default "prepend" import puts this folder on sys.path
    import fake_pynvml

FakeNvml = fake_pynvml.FakeNvml
NODE = "gpu-node-1"
ENABLE = pynvml.NVML_DEVICE_MIG_ENABLE


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("GPUFLOW_REGION", raising=False)


def backend(fake: FakeNvml, **kw) -> NvmlBackend:
    return NvmlBackend(node_name=NODE, nvml=fake, **kw)


def mig_on(fake: FakeNvml, *indexes: int) -> None:
    for i in indexes:
        fake.device(i).mig_current = fake.device(i).mig_pending = ENABLE


def R(profile: str, start: int | None = None) -> PartitionRequest:
    return PartitionRequest(profile=profile, placement_start=start)


# -- the fake is only useful if it matches nvidia-ml-py ----------------------------------


def test_fake_functions_have_pynvml_signatures():
    names = fake_pynvml.api_names()
    assert len(names) > 50
    for name in names:
        real = inspect.signature(getattr(pynvml, name))
        fake = inspect.signature(getattr(FakeNvml, name))
        fake_params = list(fake.parameters.values())[1:]  # drop self
        assert [p.name for p in fake_params] == list(real.parameters), name
        assert [p.default for p in fake_params] == [p.default for p in real.parameters.values()], (
            name
        )


def test_fake_constants_and_structs_are_pynvml_s():
    f = FakeNvml()
    assert f.NVML_ERROR_GPU_IS_LOST == pynvml.NVML_ERROR_GPU_IS_LOST
    assert f.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 == pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1
    assert f.c_nvmlGpuInstancePlacement_t is pynvml.c_nvmlGpuInstancePlacement_t
    with pytest.raises(AttributeError):
        f.nvmlNoSuchFunction  # noqa: B018


def test_fake_refuses_calls_before_init():
    f = FakeNvml()
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlDeviceGetCount()
    assert e.value.value == pynvml.NVML_ERROR_UNINITIALIZED


def test_fake_enforces_ci_before_gi_destroy_order():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    gi = f.nvmlDeviceCreateGpuInstance(h, 9)  # 3g.20gb by id
    f.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlGpuInstanceDestroy(gi)
    assert e.value.value == pynvml.NVML_ERROR_IN_USE


def test_fake_enum_is_not_an_id():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    info = f.nvmlDeviceGetGpuInstanceProfileInfo(h, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1)
    assert info.id == 20 and pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 == 7
    count = ctypes.c_uint(0)
    with pytest.raises(fake_pynvml.NVMLError) as e:  # 7 is the enum, no profile has id 7
        f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 7, None, ctypes.byref(count))
    assert e.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT
    # enum 0 (1_SLICE) read as an id is the 7g profile: one placement of 8 memory slices
    f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 0, None, ctypes.byref(count))
    arr = (pynvml.c_nvmlGpuInstancePlacement_t * count.value)()
    f.nvmlDeviceGetGpuInstancePossiblePlacements(h, 0, arr, ctypes.byref(count))
    assert [(p.start, p.size) for p in arr] == [(0, 8)]


def test_fake_remaining_capacity_tracks_overlap():
    f = FakeNvml(["a100-40gb"])
    mig_on(f, 0)
    f.nvmlInit()
    h = f.nvmlDeviceGetHandleByIndex(0)
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 2  # 3g.20gb at 0 and 4
    pl = pynvml.c_nvmlGpuInstancePlacement_t(4, 4)
    f.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, ctypes.byref(pl))
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 9) == 1
    assert f.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 0) == 0  # 7g needs every slice
    with pytest.raises(fake_pynvml.NVMLError) as e:
        f.nvmlDeviceCreateGpuInstanceWithPlacement(
            h, 14, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(4, 2))
        )
    assert e.value.value == pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(fake_pynvml.NVMLError) as e:  # a struct by value, not a pointer
        f.nvmlDeviceCreateGpuInstanceWithPlacement(h, 9, pynvml.c_nvmlGpuInstancePlacement_t(0, 4))
    assert e.value.value == pynvml.NVML_ERROR_INVALID_ARGUMENT


# -- availability and lifecycle -----------------------------------------------------------


def test_available_false_without_driver_or_library():
    ok, why = NvmlBackend.available(nvml=FakeNvml(driver_loaded=False))
    assert not ok and "Driver Not Loaded" in why
    ok, why = NvmlBackend.available(nvml=FakeNvml(library_found=False))
    assert not ok and "Library Not Found" in why
    fake = FakeNvml(["h100", "h100"])
    ok, why = NvmlBackend.available(nvml=fake)
    assert ok and "2 GPU" in why
    assert fake._init_count == 0  # available() shuts NVML down again
    ok, why = NvmlBackend.available(nvml=FakeNvml([]))
    assert not ok and "no GPU" in why


def test_available_with_the_real_pynvml_on_this_machine():
    ok, why = NvmlBackend.available()
    if ok:
        pytest.skip(f"an NVIDIA driver answers here: {why}")
    assert why  # says why, e.g. "NVML Shared Library Not Found"


def test_init_once_and_close_shuts_down():
    fake = FakeNvml()
    b = backend(fake)
    b.discover()
    b.telemetry(NODE, 0)
    assert fake.calls.count("nvmlInit") == 1
    b.close()
    b.close()
    assert fake.calls.count("nvmlShutdown") == 1
    assert fake._init_count == 0
    with pytest.raises(HardwareError, match="closed"):
        b.discover()


def test_init_failure_is_a_hardware_error():
    with pytest.raises(HardwareError, match="Driver Not Loaded"):
        backend(FakeNvml(driver_loaded=False))


# -- discovery ------------------------------------------------------------------------------


def test_discover(monkeypatch):
    monkeypatch.setenv("GPUFLOW_REGION", "eu-west")
    fake = FakeNvml(["a100-40gb", "v100", "h200"])
    [node] = backend(fake).discover()
    assert (node.name, node.region, node.role) == (NODE, "eu-west", "active")
    a100, v100, h200 = node.devices
    assert [d.index for d in node.devices] == [0, 1, 2]
    assert a100.sku == "NVIDIA A100-SXM4-40GB" and a100.vendor == "NVIDIA"
    assert a100.uuid == fake.device(0).uuid and a100.uuid.startswith("GPU-")
    assert a100.memory_total_mb == 40960
    assert a100.pci_device_id == "0x20B010DE"
    assert h200.pci_device_id == "0x233510DE"
    assert a100.partition_kinds == ("mig",) and h200.partition_kinds == ("mig",)
    assert v100.partition_kinds == ()
    monkeypatch.delenv("GPUFLOW_REGION")
    assert backend(FakeNvml()).region == "local"
    assert NvmlBackend(nvml=FakeNvml(), region="r2").region == "r2"


def test_node_and_index_are_checked():
    b = backend(FakeNvml(["a100-40gb"]))
    with pytest.raises(InvalidRequestError, match="not this host"):
        b.telemetry("other-node", 0)
    with pytest.raises(InvalidRequestError, match="no GPU index 3"):
        b.clocks(NODE, 3)


# -- MIG profiles -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("total_mb", "memory_mb", "slices", "suffix", "name"),
    [
        (40960, 4864, 1, "", "1g.5gb"),
        (40960, 4864, 1, "+me", "1g.5gb+me"),
        (40960, 19968, 3, "", "3g.20gb"),
        (40960, 40192, 7, "", "7g.40gb"),
        (81559, 9856, 1, "", "1g.10gb"),  # H100: 79.6 GiB reported, named from 80 GB
        (143771, 69632, 4, "", "4g.71gb"),  # H200: 4/8 of 141 GB = 70.5 -> 71
        (143771, 16384, 1, "", "1g.18gb"),
    ],
)
def test_mig_profile_name(total_mb, memory_mb, slices, suffix, name):
    assert mig_profile_name(slices, memory_mb, total_mb * 1024 * 1024, suffix) == name


@pytest.mark.parametrize("sku_name", ["a100-40gb", "a100-80gb", "h100", "h200"])
@pytest.mark.parametrize("driver_names", [True, False])
def test_profiles_match_the_sku_tables(sku_name, driver_names):
    fake = FakeNvml([sku_name], report_profile_names=driver_names)
    mig_on(fake, 0)
    got = backend(fake).partition_profiles(NODE, 0)
    want = sku(sku_name).mig_profiles
    assert [p.name for p in got] == [p.name for p in want]
    assert [p.profile_id for p in got] == [p.profile_id for p in want]
    assert [(p.placement_starts, p.placement_size) for p in got] == [
        (p.placement_starts, p.placement_size) for p in want
    ]
    assert [(p.compute_slices, p.max_count) for p in got] == [
        (p.compute_slices, p.max_count) for p in want
    ]
    assert all(p.kind == "mig" for p in got)


def test_profiles_carry_ids_not_enums():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    profiles = {p.name: p for p in backend(fake).partition_profiles(NODE, 0)}
    assert profiles["1g.5gb"].profile_id == 19 != pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    assert profiles["3g.20gb"].profile_id == 9 != pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE
    assert profiles["7g.40gb"].profile_id == 0 != pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE
    assert profiles["1g.5gb"].memory_mb == 4864  # what NVML reports, not 40960 / 8


def test_profiles_with_mig_off_come_from_the_sku_table():
    fake = FakeNvml(["a100-40gb", "v100"])
    b = backend(fake)
    assert b.nvml_partition_profiles(NODE, 0) == []  # NVML lists none with MIG off
    assert b.partition_profiles(NODE, 0) == list(sku("a100-40gb").mig_profiles)
    assert b.partition_profiles(NODE, 1) == []  # V100: no MIG


# -- creating and destroying partitions ---------------------------------------------------------


def test_all_balanced_layout_puts_the_3g_at_slice_4():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    created = b.create_partitions(NODE, 0, [R("1g.5gb"), R("1g.5gb"), R("2g.10gb"), R("3g.20gb")])
    assert [p.profile for p in created] == ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"]
    starts = {p.profile: p.placement_start for p in created}
    assert starts["3g.20gb"] == 4
    gis = sorted(fake.device(0).gpu_instances.values(), key=lambda g: g.start)
    assert [(g.profile.id, g.start) for g in gis] == [(14, 0), (19, 2), (19, 3), (9, 4)]
    assert all(len(g.cis) == 1 for g in gis)
    [ci] = next(g for g in gis if g.profile.id == 9).cis.values()
    assert ci.slices == 3  # a compute instance spanning the whole GI


def test_create_destroy_round_trip_with_uuids():
    fake = FakeNvml(["h100"])
    mig_on(fake, 0)
    b = backend(fake)
    created = b.create_partitions(NODE, 0, [R("3g.40gb"), R("2g.20gb", start=0), R("1g.10gb")])
    uuids = [p.uuid for p in created]
    assert all(u.startswith("MIG-") for u in uuids) and len(set(uuids)) == 3
    fake_uuids = {ci.uuid for g in fake.device(0).gpu_instances.values() for ci in g.cis.values()}
    assert set(uuids) == fake_uuids
    listed = b.partitions(NODE, 0)
    assert {p.uuid for p in listed} == set(uuids)
    assert [p.placement_start for p in listed] == sorted(p.placement_start for p in listed)
    by_uuid = {p.uuid: p for p in listed}
    assert by_uuid[created[1].uuid].placement_start == 0
    assert by_uuid[created[0].uuid].memory_mb == created[0].memory_mb > 0

    b.destroy_partitions(NODE, 0, [uuids[1]])
    assert {p.uuid for p in b.partitions(NODE, 0)} == {uuids[0], uuids[2]}
    with pytest.raises(InvalidRequestError, match="no partition"):
        b.destroy_partitions(NODE, 0, [uuids[0], "MIG-nope"])
    assert len(b.partitions(NODE, 0)) == 2  # the valid uuid was not destroyed either
    b.destroy_partitions(NODE, 0)
    assert b.partitions(NODE, 0) == [] and fake.device(0).gpu_instances == {}
    # CIs went before their GIs: the fake refuses the other order
    order = [c for c in fake.calls if c in ("nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy")]
    assert order == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"] * 3


def _created_anything(fake: FakeNvml) -> bool:
    return any(
        c.startswith(("nvmlDeviceCreateGpuInstance", "nvmlGpuInstanceCreate")) for c in fake.calls
    )


def test_refusals_create_nothing():
    fake = FakeNvml(["a100-40gb", "v100", "a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    with pytest.raises(UnsupportedError, match="does not support MIG"):
        b.create_partitions(NODE, 1, [R("1g.5gb")])
    with pytest.raises(LayoutError) as e:
        b.create_partitions(NODE, 0, [R("1g.5gb")] * 8)
    assert e.value.rule == "max-count"
    with pytest.raises(LayoutError) as e:
        b.create_partitions(NODE, 0, [R("7g.40gb"), R("1g.5gb")])
    assert e.value.rule == "compute-slices"
    with pytest.raises(LayoutError) as e:
        b.create_partitions(NODE, 0, [R("3g.20gb", start=2)])
    assert e.value.rule == "placement"
    with pytest.raises(LayoutError, match="unknown-profile"):
        b.create_partitions(NODE, 0, [R("1g.5gb"), R("vdcu")])
    with pytest.raises(InvalidRequestError, match="MIG mode is disabled"):
        b.create_partitions(NODE, 2, [R("1g.5gb")])
    assert not _created_anything(fake)
    assert all(not d.gpu_instances for d in fake.devices)


def test_existing_instances_count_against_a_new_layout():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    [first] = b.create_partitions(NODE, 0, [R("4g.20gb")])
    fake.calls.clear()
    with pytest.raises(LayoutError) as e:  # 4 + 3 + 1 compute slices > 7
        b.create_partitions(NODE, 0, [R("3g.20gb"), R("1g.5gb")])
    assert e.value.rule == "compute-slices"
    assert not _created_anything(fake)
    [second] = b.create_partitions(NODE, 0, [R("3g.20gb")])
    assert (first.placement_start, second.placement_start) == (0, 4)


def test_a_failure_midway_rolls_back_what_this_call_created():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    fake.fail_next["nvmlGpuInstanceCreateComputeInstance"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(HardwareError, match="Unknown Error"):
        b.create_partitions(NODE, 0, [R("2g.10gb"), R("1g.5gb")])
    assert fake.device(0).gpu_instances == {}


def test_gi_with_several_compute_instances():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    gi = fake.nvmlDeviceCreateGpuInstanceWithPlacement(
        h, 9, ctypes.byref(pynvml.c_nvmlGpuInstancePlacement_t(0, 4))
    )
    fake.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    fake.nvmlGpuInstanceCreateComputeInstance(gi, pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE)
    fake.nvmlDeviceCreateGpuInstance(h, 14)  # a GI without any compute instance, at slice 4
    parts = b.partitions(NODE, 0)
    assert [p.profile for p in parts] == ["1c.3g.20gb", "1c.3g.20gb", "2g.10gb"]
    assert parts[2].uuid.startswith("gi:0:")
    b.destroy_partitions(NODE, 0, [parts[0].uuid, parts[2].uuid])  # the whole 3g GI goes
    assert b.partitions(NODE, 0) == []


# -- MIG mode ---------------------------------------------------------------------------------


def test_mig_mode_switch_and_pending_reset():
    fake = FakeNvml(["a100-40gb", "h100", "v100"])
    b = backend(fake)
    assert b.partition_mode(NODE, 0) is False
    b.set_partition_mode(NODE, 0, True)
    assert b.partition_mode(NODE, 0) is True and b.mig_mode(NODE, 0) == (True, True)

    fake.device(1).mig_needs_reset = True
    with pytest.raises(HardwareError, match="reset"):
        b.set_partition_mode(NODE, 1, True)
    assert b.mig_mode(NODE, 1) == (False, True)
    assert b.partition_mode(NODE, 1) is False
    with pytest.raises(HardwareError, match="pending"):
        b.create_partitions(NODE, 1, [R("1g.10gb")])
    fake.reset_gpu(1)
    assert b.partition_mode(NODE, 1) is True

    with pytest.raises(UnsupportedError):
        b.set_partition_mode(NODE, 2, True)
    with pytest.raises(UnsupportedError):
        b.mig_mode(NODE, 2)
    assert b.partition_mode(NODE, 2) is False


def test_disabling_mig_with_partitions_is_refused_first():
    fake = FakeNvml(["a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    b.create_partitions(NODE, 0, [R("7g.40gb")])
    with pytest.raises(InvalidRequestError, match="destroy them"):
        b.set_partition_mode(NODE, 0, False)
    assert "nvmlDeviceSetMigMode" not in fake.calls
    b.destroy_partitions(NODE, 0)
    b.set_partition_mode(NODE, 0, False)
    assert b.mig_mode(NODE, 0) == (False, False)


# -- telemetry ----------------------------------------------------------------------------------


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
    assert s.retired_pages == 0  # A100 remaps rows; page retirement is NOT_SUPPORTED
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
    assert s.remapped_rows_correctable == 0 and not s.remapped_rows_pending  # V100: none
    assert (s.ecc_corrected_total, s.ecc_uncorrected_total) == (0, 0)
    assert s.clock_event_reasons == ("GpuIdle",)  # from the pre-r535 ThrottleReasons call
    assert "nvmlDeviceGetCurrentClocksThrottleReasons" in fake.calls
    assert b.telemetry(NODE, 1).utilization_ratio == 0.0  # MIG on: no utilization


def test_other_nvml_errors_quote_nvml():
    fake = FakeNvml()
    b = backend(fake)
    fake.fail_next["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(HardwareError, match="nvmlDeviceGetPowerUsage failed: NVML: Unknown Error"):
        b.telemetry(NODE, 0)


def test_xids_reach_only_registered_event_sets():
    fake = FakeNvml(["h100", "h100"])
    b = backend(fake)
    fake.inject_xid(1, 94)
    fake.inject_xid(0, 13)
    assert b.telemetry(NODE, 0).xids == (13,)
    assert b.telemetry(NODE, 1).xids == (94,)


# -- a lost GPU ---------------------------------------------------------------------------------


def test_gpu_lost():
    fake = FakeNvml(["h100", "h100"])
    b = backend(fake)
    b.discover()
    fake.inject_xid(1, 79)
    fake.lose_gpu(1)
    s = b.telemetry(NODE, 1)
    assert s.present is False and s.xids == (79,) and s.memory_total_mb == 81559
    with pytest.raises(DeviceLostError, match="lost"):
        b.clocks(NODE, 1)
    with pytest.raises(DeviceLostError):
        b.set_power_limit_mw(NODE, 1, 300_000)
    with pytest.raises(DeviceLostError):
        b.partitions(NODE, 1)
    [node] = b.discover()
    assert [d.index for d in node.devices] == [0]
    assert b.telemetry(NODE, 0).present


# -- clocks and power ----------------------------------------------------------------------------


def _set_calls(fake: FakeNvml) -> list[str]:
    return [c for c in fake.calls if c.startswith("nvmlDeviceSet")]


def test_clock_state():
    fake = FakeNvml(["a100-40gb"])
    c = backend(fake).clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.sm_clock_min_mhz, c.sm_clock_max_mhz) == (210, 210, 1410)
    assert (c.applications_sm_clock_mhz, c.applications_mem_clock_mhz) == (1095, 1215)
    assert c.locked_min_mhz is None


def test_locked_clocks_are_validated_then_set():
    fake = FakeNvml(["a100-40gb"])
    b = backend(fake)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_locked_clocks(NODE, 0, 100, 1410)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_locked_clocks(NODE, 0, 210, 2000)
    with pytest.raises(InvalidRequestError, match="above"):
        b.set_locked_clocks(NODE, 0, 1200, 900)
    with pytest.raises(InvalidRequestError, match="integer"):
        b.set_locked_clocks(NODE, 0, 900.5, 1200)
    assert _set_calls(fake) == []
    b.set_locked_clocks(NODE, 0, 900, 1200)
    assert fake.device(0).locked_clocks_mhz == (900, 1200)
    c = b.clocks(NODE, 0)
    assert (c.locked_min_mhz, c.locked_max_mhz) == (900, 1200) and c.sm_clock_mhz == 900
    b.reset_locked_clocks(NODE, 0)
    assert fake.device(0).locked_clocks_mhz is None and b.clocks(NODE, 0).locked_min_mhz is None


def test_applications_clocks_are_validated_then_set():
    fake = FakeNvml(["v100"])
    b = backend(fake)
    with pytest.raises(InvalidRequestError, match="memory clock 1000"):
        b.set_applications_clocks(NODE, 0, 1000, 1312)
    with pytest.raises(InvalidRequestError, match="SM clock 1313"):
        b.set_applications_clocks(NODE, 0, 877, 1313)
    assert _set_calls(fake) == []
    b.set_applications_clocks(NODE, 0, 877, 1305)
    c = b.clocks(NODE, 0)
    assert (c.applications_mem_clock_mhz, c.applications_sm_clock_mhz) == (877, 1305)


def test_power_limits_validated_then_set():
    fake = FakeNvml(["h100"])
    b = backend(fake)
    lim = b.power_limits(NODE, 0)
    assert (lim.min_limit_mw, lim.max_limit_mw, lim.default_limit_mw, lim.limit_mw) == (
        200_000,
        700_000,
        700_000,
        700_000,
    )
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_power_limit_mw(NODE, 0, 150_000)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_power_limit_mw(NODE, 0, 800_000)
    assert _set_calls(fake) == []
    b.set_power_limit_mw(NODE, 0, 450_000)
    assert b.power_limits(NODE, 0).limit_mw == 450_000
    assert b.telemetry(NODE, 0).power_limit_mw == 450_000


def test_unprivileged_control_says_root():
    fake = FakeNvml(["h100"], privileged=False)
    b = backend(fake)
    with pytest.raises(HardwareError, match="root"):
        b.set_power_limit_mw(NODE, 0, 450_000)
    with pytest.raises(HardwareError, match="Insufficient Permissions"):
        b.set_partition_mode(NODE, 0, True)


# -- scripts/gpu_check.py ------------------------------------------------------------------------


def _load_gpu_check():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_gpu_check_reads_everything_and_changes_nothing(monkeypatch, capsys):
    import json

    mod = _load_gpu_check()
    fake = FakeNvml(["a100-40gb", "v100"])
    mig_on(fake, 0)

    class OnFake(NvmlBackend):
        def __init__(self):
            super().__init__(node_name=NODE, nvml=fake)

        @classmethod
        def available(cls, nvml=None):
            return NvmlBackend.available(nvml=fake)

    # a partition that exists before the check runs
    backend(fake).create_partitions(NODE, 0, [R("3g.20gb")])
    fake.calls.clear()
    monkeypatch.setattr(mod, "NvmlBackend", OnFake)
    assert mod.main(["--json", "--sleep-s", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ok"] and summary["driver_version"] == fake.driver_version
    a100, v100 = summary["devices"]
    assert a100["mig_profiles_source"] == "nvml"
    assert [p["profile"] for p in a100["partitions"]] == ["3g.20gb"]
    assert a100["energy"]["delta_mj"] == 0 and v100["mig_mode"] is None
    changing = (
        "nvmlDeviceSet",
        "nvmlDeviceReset",
        "nvmlDeviceCreate",
        "nvmlGpuInstanceCreate",
        "nvmlGpuInstanceDestroy",
        "nvmlComputeInstanceDestroy",
    )
    assert not [c for c in fake.calls if c.startswith(changing)]
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in fake.calls


def test_gpu_check_without_nvml_exits_nonzero(monkeypatch, capsys):
    mod = _load_gpu_check()
    monkeypatch.setattr(
        mod.NvmlBackend, "available", classmethod(lambda cls, nvml=None: (False, "no driver here"))
    )
    assert mod.main(["--json"]) == 2
    captured = capsys.readouterr()
    assert '"available": false' in captured.out and "no driver here" in captured.err
