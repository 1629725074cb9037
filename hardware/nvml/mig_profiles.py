"""MIG profiles of one GPU: which GPU-instance profiles it offers, and their names.

NVML facts this is built on (DESIGN.md section 4, NVIDIA's nvml.h):

- ``nvmlDeviceGetGpuInstanceProfileInfo`` takes an ``NVML_GPU_INSTANCE_PROFILE_*`` enum;
  every other GI call takes the returned ``info.id`` (19 for 1g.5gb), never the enum.
- NVML lists GI profiles only while MIG mode is on; before it is enabled, plans use the
  SKU tables of hardware/skus.py (NVIDIA's published profiles) for a known GPU.
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
from gpuflow.hardware.skus import SKUS

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


def _profile_info(dev: NvmlDevice, enum: int) -> Any | None:
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


def gi_profiles(dev: NvmlDevice) -> list[GiProfile]:
    """The GI profiles NVML lists for the device ([] while MIG mode is off)."""
    total_bytes = dev.memory_bytes()[1]
    out = []
    for enum_name, suffix in _GI_ENUMS:
        enum = getattr(dev.nvml, "NVML_GPU_INSTANCE_PROFILE_" + enum_name, None)
        if enum is None:
            continue
        info = _profile_info(dev, enum)
        if info is None:
            continue
        placements = dev.gi_possible_placements(int(info.id))
        profile = PartitionProfile(
            name=_profile_name(info, total_bytes, suffix),
            kind="mig",
            profile_id=int(info.id),
            compute_slices=int(info.sliceCount),
            memory_mb=int(info.memorySizeMB),
            max_count=int(info.instanceCount),
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


def _sku_profiles(dev: NvmlDevice) -> list[PartitionProfile]:
    name = dev.name()
    pci = f"0x{dev.pci_device_id():08X}"
    for spec in SKUS.values():
        if spec.name == name or (spec.pci_device_id and spec.pci_device_id == pci):
            return list(spec.mig_profiles)
    return []


def nvml_partition_profiles(dev: NvmlDevice) -> list[PartitionProfile]:
    """Only what NVML itself lists: [] while MIG mode is off or without MIG."""
    if mig_state(dev) is None:
        return []
    return [g.profile for g in gi_profiles(dev)]


def partition_profiles(dev: NvmlDevice) -> list[PartitionProfile]:
    """NVML's profiles, or with MIG still off the published ones of this SKU."""
    mode = mig_state(dev)
    if mode is None:
        return []
    profiles = [g.profile for g in gi_profiles(dev)]
    if not profiles and not mode[0]:
        # NVML lists profiles only with MIG on; to plan before enabling it, use the
        # published table for this SKU (matched by NVML name or PCI device id).
        return _sku_profiles(dev)
    return profiles
