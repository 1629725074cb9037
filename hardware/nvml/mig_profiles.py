"""MIG profiles of one GPU: which GPU-instance profiles it offers, and their names.

NVML facts this is built on (DESIGN.md section 4, NVIDIA's nvml.h):

- ``nvmlDeviceGetGpuInstanceProfileInfo`` takes an ``NVML_GPU_INSTANCE_PROFILE_*`` enum;
  every other GI call takes the returned ``info.id`` (19 for 1g.5gb), never the enum.
- The versioned info (v2, with the driver's name) needs MIG mode on. The version-1 info
  and the possible placements answer on a MIG-capable GPU with MIG off too (nvml.h;
  drivers after R535), which is how go-nvlib and mig-parted's generate-config list
  profiles before enabling MIG. So the profiles come from NVML first, named with
  ``mig_profile_name`` as nvidia-smi names them, whatever the mode.
- Only when NVML answers nothing with MIG off (an R535 driver) do plans use the SKU
  tables of hardware/skus.py (NVIDIA's published profiles), for a GPU they know.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import PartitionProfile, UnsupportedError
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.errors import (
    NvmlFunctionNotFoundError,
    NvmlInvalidArgumentError,
    optional,
)
from gpuflow.hardware.skus import SKUS, SkuSpec

_MIB = 1024 * 1024
_GIB = 1024 * _MIB

# NVML_GPU_INSTANCE_PROFILE_<name> enums to try, and the suffix nvidia-smi puts on their
# names (REV1 carries the media engines: "1g.5gb+me"). Enums an older nvidia-ml-py lacks
# are skipped; enums the GPU does not offer answer NOT_SUPPORTED and are skipped too.
_GI_ENUMS: tuple[tuple[str, str], ...] = (
    ("1_SLICE", ""),
    ("1_SLICE_REV1", "+me"),
    ("1_SLICE_REV2", ""),
    ("1_SLICE_GFX", "+gfx"),
    ("1_SLICE_NO_ME", "-me"),
    ("1_SLICE_ALL_ME", "+me.all"),
    ("2_SLICE", ""),
    ("2_SLICE_REV1", "+me"),
    ("2_SLICE_GFX", "+gfx"),
    ("2_SLICE_NO_ME", "-me"),
    ("2_SLICE_ALL_ME", "+me.all"),
    ("3_SLICE", ""),
    ("3_SLICE_GFX", "+gfx"),
    ("4_SLICE", ""),
    ("4_SLICE_GFX", "+gfx"),
    ("6_SLICE", ""),
    ("7_SLICE", ""),
    ("8_SLICE", ""),
)
_PROFILE_NAME_RE = re.compile(r"^\d+g\.\d+gb(\+me|\+me\.all|-me|\+gfx)?$")
# GPUs whose NVML instanceCount is wrong (PCI device id): the A30, whose counts
# mig-parted's discovery hard-codes for that reason. Their counts come from the SKU table.
_WRONG_INSTANCE_COUNTS = frozenset({"0x20B710DE"})


def mig_profile_name(
    compute_slices: int, memory_size_mb: int, device_memory_bytes: int, suffix: str = ""
) -> str:
    """The nvidia-smi name of a GI profile ("1g.5gb", "3g.71gb", "1g.10gb+me").

    As NVIDIA's go-nvlib does it: the instance's share of memory is rounded up to eighths
    (memory slices), times the device's memory in whole GB (rounded up), rounded to the
    nearest GB (halves up). 4864 MiB of an A100-40GB is 1/8 of 40 GB -> 5gb; 4/8 of an
    H200's 141 GB is 70.5 -> 71gb.
    """
    if device_memory_bytes <= 0:
        raise ValueError("device memory must be positive")
    eighths = -(-(memory_size_mb * _MIB * 8) // device_memory_bytes)
    total_gb = -(-device_memory_bytes // _GIB)
    gb = (eighths * total_gb * 2 + 8) // 16
    return f"{compute_slices}g.{gb}gb{suffix}"


@dataclass(frozen=True)
class GiProfile:
    """A GI profile as NVML reports it: the enum asked for, the info, our view of it."""

    enum: int
    profile_id: int
    slice_count: int
    instance_count: int
    profile: PartitionProfile


def mig_state(dev: NvmlDevice) -> tuple[bool, bool] | None:
    """(current, pending) MIG mode, None when the GPU has no MIG."""
    return optional(None, dev.mig_mode_enabled)


# -- profiles --------------------------------------------------------------------------
def offered_or_none(read: Callable[..., Any], *args: Any) -> Any | None:
    """``read(*args)`` for a profile enum; None when the GPU does not offer that profile.

    Probing enums is how profiles are listed, so NOT_SUPPORTED and INVALID_ARGUMENT mean
    "not this one"; a function the driver lacks is still an error.
    """
    try:
        return read(*args)
    except NvmlFunctionNotFoundError:
        raise
    except (UnsupportedError, NvmlInvalidArgumentError):
        return None


def _profile_info(dev: NvmlDevice, enum: int, mig_enabled: bool) -> Any | None:
    if not mig_enabled:
        # The versioned call answers NOT_SUPPORTED while MIG is off; version 1 does not.
        return offered_or_none(dev.gi_profile_info_v1, enum)
    try:
        return offered_or_none(dev.gi_profile_info, enum)
    except NvmlFunctionNotFoundError:
        # Drivers without the versioned call answer only the version-1 struct (no name).
        return offered_or_none(dev.gi_profile_info_v1, enum)


def _profile_name(info: Any, total_bytes: int, suffix: str) -> str:
    # The v2 info carries the driver's own name ("MIG 1g.5gb"); older drivers leave it
    # out, and then we compute it the way nvidia-smi does.
    raw = getattr(info, "name", b"")
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
    text = text.strip().removeprefix("MIG ").strip()
    if _PROFILE_NAME_RE.match(text):
        return text
    return mig_profile_name(int(info.sliceCount), int(info.memorySizeMB), total_bytes, suffix)


def gi_profiles(dev: NvmlDevice, mig_enabled: bool = True) -> list[GiProfile]:
    """The GI profiles NVML lists for the device; pass ``mig_enabled=False`` with MIG off.

    With MIG off a driver that answers no profile info, or no placements, gives [] (the
    caller falls back to the SKU table), not half a list.
    """
    total_bytes = dev.memory_bytes()[1]
    table = _sku_of(dev) if _pci_id(dev) in _WRONG_INSTANCE_COUNTS else None
    out = []
    for enum_name, suffix in _GI_ENUMS:
        enum = getattr(dev.nvml, "NVML_GPU_INSTANCE_PROFILE_" + enum_name, None)
        if enum is None:
            continue
        info = _profile_info(dev, enum, mig_enabled)
        if info is None:
            continue
        if mig_enabled:
            placements = dev.gi_possible_placements(int(info.id))
        else:
            # nvml.h promises placements with MIG off; a driver that still refuses them
            # leaves NVML's answer unusable for planning, so none of it is used.
            answered = offered_or_none(dev.gi_possible_placements, int(info.id))
            if answered is None:
                return []
            placements = answered
        name = _profile_name(info, total_bytes, suffix)
        max_count = int(info.instanceCount)
        if table is not None:
            max_count = next((p.max_count for p in table.mig_profiles if p.name == name), max_count)
        profile = PartitionProfile(
            name=name,
            kind="mig",
            profile_id=int(info.id),
            compute_slices=int(info.sliceCount),
            memory_mb=int(info.memorySizeMB),
            max_count=max_count,
            placement_starts=tuple(sorted({s for s, _ in placements})),
            placement_size=placements[0][1] if placements else 0,
        )
        out.append(
            GiProfile(
                enum=enum,
                profile_id=int(info.id),
                slice_count=int(info.sliceCount),
                instance_count=int(info.instanceCount),
                profile=profile,
            )
        )
    return out


def _pci_id(dev: NvmlDevice) -> str:
    return f"0x{dev.pci_device_id():08X}"


def _sku_of(dev: NvmlDevice) -> SkuSpec | None:
    """The SKU table entry of this GPU, matched by NVML name or PCI device id."""
    name, pci = dev.name(), _pci_id(dev)
    for spec in SKUS.values():
        if spec.name == name or (spec.pci_device_id and spec.pci_device_id == pci):
            return spec
    return None


def nvml_partition_profiles(dev: NvmlDevice) -> list[PartitionProfile]:
    """What NVML itself lists, MIG on or off (no SKU-table fallback; the A30's counts are
    still fixed): [] without MIG or when NVML says none."""
    mode = mig_state(dev)
    if mode is None:
        return []
    return [g.profile for g in gi_profiles(dev, mig_enabled=mode[0])]


def partition_profiles(dev: NvmlDevice) -> list[PartitionProfile]:
    """NVML's profiles; with MIG off and nothing from NVML, the published ones of this SKU."""
    mode = mig_state(dev)
    if mode is None:
        return []
    profiles = [g.profile for g in gi_profiles(dev, mig_enabled=mode[0])]
    if not profiles and not mode[0]:
        # An R535 driver lists no profile with MIG off; to plan before enabling it, use
        # the published table for this SKU. A GPU in no table has none until MIG is on.
        spec = _sku_of(dev)
        return list(spec.mig_profiles) if spec else []
    return profiles
