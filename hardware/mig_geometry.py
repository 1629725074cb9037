"""MIG geometries: a chip's compute and memory slices and its GPU-instance profiles.

Ids, counts and placements from NVIDIA's MIG user guide and real ``nvidia-smi mig
-lgip/-lgipp`` output (A30); hardware/skus.py names the profiles per board (the names
depend on the board's memory) and gives what each instance reports.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.hardware.backend import PartitionProfile


@dataclass(frozen=True)
class MigSlot:
    """One GPU-instance profile of a MIG geometry, as nvidia-smi lists it (-lgip, -lgipp)."""

    enum: str  # NVML_GPU_INSTANCE_PROFILE_<enum>, what nvmlDeviceGetGpuInstanceProfileInfo takes
    profile_id: int  # the GI profile id every other call takes (19 for 1g.5gb on an A100)
    compute_slices: int
    memory_slices: int  # also the placement size
    max_count: int
    starts: tuple[int, ...]  # legal placement starts, in memory slices


@dataclass(frozen=True)
class MigGeometry:
    """A MIG-capable chip's slices and GI profiles; the profile names depend on memory."""

    compute_slices: int
    memory_slices: int
    slots: tuple[MigSlot, ...]

    def enum_names(self) -> tuple[str, ...]:
        return tuple(s.enum for s in self.slots)


def _slots(*rows: tuple[str, int, int, int, int, tuple[int, ...]]) -> tuple[MigSlot, ...]:
    return tuple(MigSlot(*r) for r in rows)


# GA100/GH100 (A100, A800, H100, H800, H20, H200, GH200): 7 compute and 8 memory slices.
# Placements are the A100 rules of NVIDIA's MIG user guide; Hopper publishes the same
# start:size table.
A100_MIG_GEOMETRY = MigGeometry(
    7,
    8,
    _slots(
        ("1_SLICE", 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
        ("1_SLICE_REV1", 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
        ("1_SLICE_REV2", 15, 1, 2, 4, (0, 2, 4, 6)),
        ("2_SLICE", 14, 2, 2, 3, (0, 2, 4)),
        ("3_SLICE", 9, 3, 4, 2, (0, 4)),
        ("4_SLICE", 5, 4, 4, 1, (0,)),
        ("7_SLICE", 0, 7, 8, 1, (0,)),
    ),
)
# A30: 4 compute and 4 memory slices. Ids and placements from a real A30's
# `nvidia-smi mig -lgip` / `-lgipp` (driver 535); counts from NVIDIA's MIG user guide.
A30_MIG_GEOMETRY = MigGeometry(
    4,
    4,
    _slots(
        ("1_SLICE", 14, 1, 1, 4, (0, 1, 2, 3)),
        ("1_SLICE_REV1", 21, 1, 1, 1, (0, 1, 2, 3)),
        ("2_SLICE", 5, 2, 2, 2, (0, 2)),
        ("2_SLICE_REV1", 6, 2, 2, 1, (0, 2)),
        ("4_SLICE", 0, 4, 4, 1, (0,)),
    ),
)
# The A100-class totals, which most of the fleet has (the scheduler's share of a GPU).
MIG_COMPUTE_SLICES = A100_MIG_GEOMETRY.compute_slices
MIG_MEMORY_SLICES = A100_MIG_GEOMETRY.memory_slices


def build_mig_profiles(
    names: tuple[str, ...],
    memory_total_mb: int,
    geometry: MigGeometry = A100_MIG_GEOMETRY,
    memory_mb: tuple[int, ...] | None = None,
) -> tuple[PartitionProfile, ...]:
    """PartitionProfiles of ``geometry`` named ``names`` (in slot order).

    Memory is slices x (total / memory slices) unless ``memory_mb`` gives what a real card
    reports per profile.
    """
    slice_mb = memory_total_mb // geometry.memory_slices
    sizes = memory_mb or tuple(s.memory_slices * slice_mb for s in geometry.slots)
    return tuple(
        PartitionProfile(
            name=name,
            kind="mig",
            profile_id=s.profile_id,
            compute_slices=s.compute_slices,
            memory_mb=mb,
            max_count=s.max_count,
            placement_starts=s.starts,
            placement_size=s.memory_slices,
        )
        for name, s, mb in zip(names, geometry.slots, sizes, strict=True)
    )


def mig_enum_names(geometry: MigGeometry = A100_MIG_GEOMETRY) -> tuple[str, ...]:
    """NVML enum suffixes (NVML_GPU_INSTANCE_PROFILE_<name>) in slot order."""
    return geometry.enum_names()
