"""MIG partitions of one GPU: list, create (with rollback), destroy, and the MIG mode.

A partition is a GPU instance (GI) with one compute instance (CI) spanning all of it; its
uuid is the MIG device's ``MIG-...`` UUID. Profiles come from mig_profiles.py. A MIG mode
whose pending value differs from the current one waits for a GPU reset.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    Partition,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.errors import NvmlNotFoundError, optional
from gpuflow.hardware.nvml.mig_profiles import (
    GiProfile,
    gi_profiles,
    mig_state,
    offered_or_none,
)
from gpuflow.hardware.placement import Occupied, fit_mig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComputeInstance:
    handle: Any
    ci_id: int
    slices: int


@dataclass(frozen=True)
class GpuInstance:
    handle: Any
    gi_id: int
    profile: GiProfile
    start: int
    size: int
    cis: tuple[ComputeInstance, ...]


@dataclass
class _Created:
    """What create_partitions made so far, so a failure can undo it."""

    gi: Any
    gi_id: int
    profile: GiProfile
    start: int
    ci: Any = None
    ci_id: int | None = None


def mig_mode(dev: NvmlDevice) -> tuple[bool, bool]:
    """(current, pending) MIG mode; UnsupportedError on a GPU without MIG."""
    mode = mig_state(dev)
    if mode is None:
        raise UnsupportedError(f"{dev.where}: this GPU does not support MIG")
    return mode


# -- instances and partitions ----------------------------------------------------------
def _ci_enums(dev: NvmlDevice) -> range:
    return range(int(getattr(dev.nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8)))


def _compute_instances(dev: NvmlDevice, gi: Any) -> tuple[ComputeInstance, ...]:
    out = []
    for enum in _ci_enums(dev):
        info = offered_or_none(dev.ci_profile_info, gi, enum)
        if info is None or int(info.instanceCount) == 0:
            continue
        for ci in dev.compute_instances(gi, int(info.id), int(info.instanceCount)):
            out.append(ComputeInstance(ci, dev.ci_id(ci), int(info.sliceCount)))
    return tuple(out)


def _gpu_instances(dev: NvmlDevice, profiles: list[GiProfile]) -> list[GpuInstance]:
    out = []
    for gp in profiles:
        if gp.instance_count == 0:
            continue
        for gi in dev.gpu_instances(gp.profile_id, gp.instance_count):
            info = dev.gi_info(gi)
            out.append(
                GpuInstance(
                    handle=gi,
                    gi_id=int(info.id),
                    profile=gp,
                    start=int(info.placement.start),
                    size=int(info.placement.size),
                    cis=_compute_instances(dev, gi),
                )
            )
    return out


def _mig_uuids(dev: NvmlDevice) -> dict[tuple[int, int], str]:
    """(GI id, CI id) -> MIG device UUID."""
    out: dict[tuple[int, int], str] = {}
    for slot in range(optional(0, dev.max_mig_device_count)):
        try:
            mig = dev.mig_device_handle(slot)
        except NvmlNotFoundError:  # an empty slot
            continue
        out[(dev.mig_gi_id(mig), dev.mig_ci_id(mig))] = dev.mig_uuid(mig)
    return out


def _mig_partition(
    dev: NvmlDevice, uuid: str, profile: str, memory_mb: int, start: int, size: int
) -> Partition:
    return Partition(
        node=dev.node,
        device_index=dev.index,
        uuid=uuid,
        profile=profile,
        kind="mig",
        memory_mb=memory_mb,
        placement_start=start,
        placement_size=size,
    )


def list_partitions(dev: NvmlDevice) -> list[tuple[Partition, GpuInstance]]:
    """Every partition with the GI it lives in, by placement; [] while MIG mode is off."""
    mode = mig_state(dev)
    if mode is None or not mode[0]:
        return []
    instances = _gpu_instances(dev, gi_profiles(dev))
    uuids = _mig_uuids(dev)
    index = dev.index
    out = []
    for gi in instances:
        gp = gi.profile.profile
        # A GI without compute instances has no MIG device (and no UUID) but still
        # holds its slices; it gets a stable placeholder id so it can be destroyed.
        entries = [(f"gi:{index}:{gi.gi_id}", gp.name)] if not gi.cis else []
        for ci in gi.cis:
            name = gp.name if ci.slices == gp.compute_slices else f"{ci.slices}c.{gp.name}"
            uuid = uuids.get((gi.gi_id, ci.ci_id), f"gi:{index}:{gi.gi_id}:ci:{ci.ci_id}")
            entries.append((uuid, name))
        for uuid, name in entries:
            out.append((_mig_partition(dev, uuid, name, gp.memory_mb, gi.start, gi.size), gi))
    out.sort(key=lambda pg: (pg[0].placement_start or 0, pg[0].uuid))
    return out


# -- changes ---------------------------------------------------------------------------
def set_mig_mode(dev: NvmlDevice, enabled: bool) -> tuple[bool, bool]:
    """Ask for MIG on or off and return (current, pending). NVML activates the mode at
    once when it can; when a client holds the GPU (DCGM) or it is passed through to a VM
    the change stays pending until a GPU reset (the apply's reset phase does that)."""
    where = dev.where
    mode = mig_mode(dev)
    if mode == (enabled, enabled):
        return mode
    if not enabled and mode[0]:
        existing = list_partitions(dev)
        if existing:
            raise InvalidRequestError(
                f"{where}: {len(existing)} MIG partition(s) exist; destroy them before "
                "disabling MIG mode"
            )
    status = dev.set_mig_mode(enabled)
    current, pending = mig_state(dev) or (False, False)
    if current != enabled:
        why = f" ({dev.error_string(status)})" if status else ""
        log.info("%s: MIG mode %s pending a GPU reset%s", where, pending, why)
    return current, pending


def _full_ci_profile(dev: NvmlDevice, gi: Any, slices: int) -> Any:
    for enum in _ci_enums(dev):
        info = offered_or_none(dev.ci_profile_info, gi, enum)
        if info is not None and int(info.sliceCount) == slices:
            return info
    raise HardwareError(
        f"{dev.where}: no compute-instance profile spans a {slices}-slice GPU instance"
    )


def _rollback(dev: NvmlDevice, created: list[_Created]) -> None:
    for c in reversed(created):
        try:
            if c.ci is not None:
                dev.destroy_compute_instance(c.ci)
            dev.destroy_gpu_instance(c.gi)
        except HardwareError as e:
            log.error("%s: rollback of GI %d failed: %s", dev.where, c.gi_id, e)


def _check_can_create(dev: NvmlDevice, sku_name: str, requests: Sequence[PartitionRequest]) -> None:
    where = dev.where
    mode = mig_state(dev)
    if mode is None:
        raise UnsupportedError(f"{where} ({sku_name}) does not support MIG")
    current, pending = mode
    if not current and pending:
        raise HardwareError(
            f"{where}: MIG mode is enabled but pending: reset the GPU "
            f"(nvidia-smi -r -i {dev.index}) before creating partitions"
        )
    if not current:
        raise InvalidRequestError(f"{where}: MIG mode is disabled; enable it first")
    if not pending:
        raise HardwareError(f"{where}: MIG mode is being disabled (pending a GPU reset)")
    for r in requests:
        if r.compute_units is not None or r.memory_mb is not None:
            raise InvalidRequestError(
                f"{where}: compute_units/memory_mb are vDCU settings, not MIG ({r.profile!r})"
            )


def create_partitions(dev: NvmlDevice, requests: Sequence[PartitionRequest]) -> list[Partition]:
    """Fit the whole layout first (hardware/placement.py), then create GI + CI per request.

    A failure midway destroys what this call created, so the GPU is left as it was.
    """
    requests = list(requests)
    if not requests:  # an empty layout is a no-op, even on a GPU without MIG
        return []
    sku_name = dev.name()
    _check_can_create(dev, sku_name, requests)
    profiles = gi_profiles(dev)
    by_name = {g.profile.name: g for g in profiles}
    instances = _gpu_instances(dev, profiles)
    placed = fit_mig(
        f"{dev.where} ({sku_name})",
        [g.profile for g in profiles],
        requests,
        existing=[Occupied(gi.start, gi.size, gi.profile.slice_count) for gi in instances],
        existing_counts=Counter(gi.profile.profile.name for gi in instances),
    )
    created: list[_Created] = []
    try:
        for req in placed:
            gp = by_name[req.profile]
            start = int(req.placement_start or 0)
            gi = dev.create_gpu_instance(gp.profile_id, start, gp.profile.placement_size)
            c = _Created(gi=gi, gi_id=int(dev.gi_info(gi).id), profile=gp, start=start)
            created.append(c)
            ci_profile = _full_ci_profile(dev, gi, gp.slice_count)
            c.ci = dev.create_compute_instance(gi, int(ci_profile.id))
            c.ci_id = dev.ci_id(c.ci)
    except HardwareError:
        _rollback(dev, created)
        raise
    uuids = _mig_uuids(dev)
    return [
        _mig_partition(
            dev,
            uuids.get((c.gi_id, c.ci_id or 0), f"gi:{dev.index}:{c.gi_id}:ci:{c.ci_id}"),
            c.profile.profile.name,
            c.profile.profile.memory_mb,
            c.start,
            c.profile.profile.placement_size,
        )
        for c in created
    ]


def destroy_partitions(dev: NvmlDevice, uuids: Sequence[str] | None = None) -> None:
    """Destroy partitions; a partition's whole GPU instance goes, compute instances first."""
    existing = list_partitions(dev)
    if uuids is None:
        targets = [gi for _, gi in existing]
    else:
        known = {p.uuid: gi for p, gi in existing}
        unknown = [u for u in uuids if u not in known]
        if unknown:
            raise InvalidRequestError(
                f"{dev.where}: no partition(s) {unknown}; existing: {sorted(known) or 'none'}"
            )
        targets = [known[u] for u in uuids]
    seen: set[int] = set()
    for gi in targets:
        if gi.gi_id in seen:
            continue
        seen.add(gi.gi_id)
        for ci in gi.cis:
            dev.destroy_compute_instance(ci.handle)
        dev.destroy_gpu_instance(gi.handle)
