"""MIG profiles and their names (hardware/nvml/mig_profiles.py)."""

from __future__ import annotations

import pynvml
import pytest
from gpuflow.hardware.nvml import mig_profile_name
from gpuflow.hardware.skus import sku

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend, mig_on


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
