"""MIG partitions and mode (hardware/nvml/mig.py)."""

from __future__ import annotations

import ctypes

import pynvml
import pytest
from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    UnsupportedError,
)
from gpuflow.hardware.placement import LayoutError

from tests.hardware.nvml.helpers import NODE, FakeNvml, R, backend, mig_on

# -- creating and destroying partitions ---------------------------------------------------


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


# -- MIG mode -----------------------------------------------------------------------------


def test_mig_mode_switch_and_pending_reset():
    fake = FakeNvml(["a100-40gb", "h100", "v100"])
    b = backend(fake)
    assert b.partition_mode(NODE, 0) is False
    b.set_partition_mode(NODE, 0, True)
    assert b.partition_mode(NODE, 0) is True and b.mig_mode(NODE, 0) == (True, True)

    fake.device(1).mig_needs_reset = True
    b.set_partition_mode(NODE, 1, True)  # left pending: the apply's reset phase resets it
    assert b.mig_mode(NODE, 1) == (False, True)
    assert b.partition_mode_state(NODE, 1).reset_pending
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


# -- other geometries ---------------------------------------------------------------------


def test_a30_has_four_compute_and_four_memory_slices():
    fake = FakeNvml(["a30"])
    mig_on(fake, 0)
    b = backend(fake)
    made = b.create_partitions(NODE, 0, [R("2g.12gb"), R("1g.6gb"), R("1g.6gb")])
    assert sorted((p.placement_start, p.profile) for p in made) == [
        (0, "2g.12gb"),  # largest first
        (2, "1g.6gb"),
        (3, "1g.6gb"),
    ]
    assert {g.profile.id for g in fake.device(0).gpu_instances.values()} == {5, 14}
    assert fake.nvmlDeviceGetMaxMigDeviceCount(fake.device(0).handle) == 4
    fake.calls.clear()
    with pytest.raises(LayoutError):  # every slice is taken
        b.create_partitions(NODE, 0, [R("1g.6gb")])
    assert not _created_anything(fake)
    b.destroy_partitions(NODE, 0)
    with pytest.raises(LayoutError) as e:
        b.create_partitions(NODE, 0, [R("4g.24gb"), R("1g.6gb+me")])
    assert e.value.rule == "placement"
    [whole] = b.create_partitions(NODE, 0, [R("4g.24gb")])
    assert (whole.placement_start, whole.placement_size, whole.memory_mb) == (0, 4, 24000)
