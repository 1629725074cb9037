"""MIG profiles and their names (hardware/nvml/mig_profiles.py)."""

from __future__ import annotations

import pynvml
import pytest
from gpuflow.hardware.nvml import mig_profile_name
from gpuflow.hardware.nvml.errors import NvmlFunctionNotFoundError
from gpuflow.hardware.skus import SKUS, sku

from tests.hardware.nvml.helpers import NODE, FakeNvml, R, backend, mig_on


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
        (24576, 5952, 1, "+me", "1g.6gb+me"),  # A30: 1/4 of its memory is 2/8
        (24576, 11968, 2, "", "2g.12gb"),
        (95830, 45526, 3, "", "3g.47gb"),  # H100 NVL: 4/8 of 94 GB = 47
        (97871, 11622, 1, "", "1g.12gb"),  # GH200 / H20
    ],
)
def test_mig_profile_name(total_mb, memory_mb, slices, suffix, name):
    assert mig_profile_name(slices, memory_mb, total_mb * 1024 * 1024, suffix) == name


MIG_SKUS = sorted(n for n, s in SKUS.items() if s.supports_mig)


@pytest.mark.parametrize("sku_name", MIG_SKUS)
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


@pytest.mark.parametrize("card", [*MIG_SKUS, "future-gpu"])
def test_profiles_with_mig_off_come_from_nvml_named_as_the_driver_names_them(card):
    """MIG off: v1 info (no name) and placements, named by mig_profile_name; the same
    profiles, names included, as the driver lists once MIG is on."""
    off = FakeNvml([card])
    got = backend(off).partition_profiles(NODE, 0)
    assert backend(off).nvml_partition_profiles(NODE, 0) == got
    on = FakeNvml([card], report_profile_names=True)
    mig_on(on, 0)
    assert got == backend(on).partition_profiles(NODE, 0) != []
    assert "nvmlDeviceGetGpuInstancePossiblePlacements" in off.calls


def test_the_sku_table_is_the_fallback_when_nvml_answers_nothing():
    fake = FakeNvml(["a100-40gb", "future-gpu", "v100"], profiles_with_mig_off=False)
    b = backend(fake)
    assert b.nvml_partition_profiles(NODE, 0) == []  # this driver lists none with MIG off
    assert b.partition_profiles(NODE, 0) == list(sku("a100-40gb").mig_profiles)
    assert b.partition_profiles(NODE, 1) == []  # in no table: nothing until MIG is on
    assert b.partition_profiles(NODE, 2) == []  # V100: no MIG
    mig_on(fake, 1)
    assert [p.name for p in b.partition_profiles(NODE, 1)][0] == "1g.32gb"


def test_a_gpu_without_mig_reports_none_and_asks_no_profile():
    fake = FakeNvml(["v100"])
    b = backend(fake)
    assert b.partition_profiles(NODE, 0) == [] == b.nvml_partition_profiles(NODE, 0)
    assert "nvmlDeviceGetGpuInstanceProfileInfo" not in fake.calls


def test_placements_refused_with_mig_off_fall_back_to_the_table(monkeypatch):
    fake = FakeNvml(["a800-80gb", "future-gpu"])

    def refuse(device, profileId, placementsRef, countRef):
        raise fake.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(fake, "nvmlDeviceGetGpuInstancePossiblePlacements", refuse, raising=False)
    b = backend(fake)
    assert b.partition_profiles(NODE, 0) == list(sku("a800-80gb").mig_profiles)
    assert b.partition_profiles(NODE, 1) == []


def test_a_missing_function_with_mig_off_is_an_error():
    fake = FakeNvml(["a100-40gb"])
    b = backend(fake)
    fake.fail_next["nvmlDeviceGetGpuInstanceProfileInfo"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    with pytest.raises(NvmlFunctionNotFoundError):
        b.partition_profiles(NODE, 0)


@pytest.mark.parametrize("mig", [False, True])
def test_a30_counts_come_from_the_table_because_nvml_gets_them_wrong(mig):
    """mig-parted hard-codes the A30's counts: its NVML reports wrong instanceCounts."""
    fake = FakeNvml(["a30"])
    if mig:
        mig_on(fake, 0)
    for p in fake.device(0).profiles:
        p.reported_instance_count = 1  # what a buggy driver might say
    b = backend(fake)
    got = b.partition_profiles(NODE, 0)
    assert b.nvml_partition_profiles(NODE, 0) == got  # the same fix, for creating too
    assert [(p.name, p.max_count) for p in got] == [
        ("1g.6gb", 4),
        ("1g.6gb+me", 1),
        ("2g.12gb", 2),
        ("2g.12gb+me", 1),
        ("4g.24gb", 1),
    ]
    if mig:  # creating checks the table's counts too: four 1g.6gb fit
        assert len(b.create_partitions(NODE, 0, [R("1g.6gb")] * 4)) == 4
