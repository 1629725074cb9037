"""The fake's MIG calls: mode, GPU-instance profiles and placements, GI, CI, MIG devices."""

from __future__ import annotations

import ctypes
import uuid as _uuid
from typing import Any

import pynvml as _real

from tests.hardware.nvml.fake_pynvml.base import FakeNvmlBase
from tests.hardware.nvml.fake_pynvml.model import (
    CI_ENUM_BY_SLICES,
    C,
    ComputeInstance,
    FakeDevice,
    GiProfile,
    GpuInstance,
    MigDevice,
    api,
    deref,
    nvml_error,
)


class FakeMig(FakeNvmlBase):
    """MIG: mode, GPU-instance profiles and placements, GPU and compute instances."""

    # -- MIG mode --------------------------------------------------------------------------
    @api()
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        d = self._dev(device)
        if not d.mig_capable:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        return [d.mig_current, d.mig_pending]

    @api()
    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        d = self._dev(device)
        if not d.mig_capable:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if mode not in (C["NVML_DEVICE_MIG_DISABLE"], C["NVML_DEVICE_MIG_ENABLE"]):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        self._privileged()
        if d.gpu_instances:
            raise nvml_error("NVML_ERROR_IN_USE")
        d.mig_pending = mode
        if d.mig_needs_reset:
            return C["NVML_ERROR_RESET_REQUIRED"]
        d.mig_current = mode
        return C["NVML_SUCCESS"]

    def _mig_enabled(self, d: FakeDevice) -> None:
        if not d.mig_capable or d.mig_current != C["NVML_DEVICE_MIG_ENABLE"]:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")

    def _profile(self, d: FakeDevice, profile_id: int, mig_on: bool = True) -> GiProfile:
        """The profile with this *id*; ``mig_on``: the call also needs MIG mode enabled."""
        if mig_on:
            self._mig_enabled(d)
        elif not d.mig_capable:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        p = d.profile_by_id(profile_id)
        if p is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return p

    # -- GPU instance profiles and placements ----------------------------------------------
    @api()
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        if version not in (1, 2):  # pynvml itself refuses other versions
            raise nvml_error("NVML_ERROR_FUNCTION_NOT_FOUND")
        d = self._dev(device)
        # nvml.h: the v1 call answers NOT_SUPPORTED "if device doesn't support MIG or
        # profile isn't supported", so it answers with MIG mode off too (drivers after
        # R535; profiles_with_mig_off=False plays an R535 that needs MIG on). The versioned
        # call (v2) adds "doesn't have MIG mode enabled". An enum outside the
        # NVML_GPU_INSTANCE_PROFILE_* range is invalid.
        if version == 2 or not self.profiles_with_mig_off:
            self._mig_enabled(d)
        elif not d.mig_capable:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if not 0 <= profile < C["NVML_GPU_INSTANCE_PROFILE_COUNT"]:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        p = next((x for x in d.profiles if x.enum == profile), None)
        if p is None:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if version == 2:
            info = _real.c_nvmlGpuInstanceProfileInfo_v2_t()
            if self.report_profile_names:
                info.name = f"MIG {p.name}".encode()
        else:
            info = _real.c_nvmlGpuInstanceProfileInfo_t()
        info.id = p.id
        info.isP2pSupported = 0
        info.sliceCount = p.compute_slices
        reported = p.reported_instance_count
        info.instanceCount = p.instance_count if reported is None else reported
        info.multiprocessorCount = 14 * p.compute_slices
        info.copyEngineCount = p.compute_slices
        info.memorySizeMB = p.memory_mb
        return info

    @api()
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        d = self._dev(device)
        # nvml.h: "all the possible placements for the given profile regardless of whether
        # MIG is enabled or not".
        p = self._profile(d, profileId, mig_on=False)
        count = deref(countRef)
        if placementsRef is None:  # the documented size query
            count.value = len(p.starts)
            return C["NVML_SUCCESS"]
        if (
            not isinstance(placementsRef, ctypes.Array)
            or placementsRef._type_ is not _real.c_nvmlGpuInstancePlacement_t
        ):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if len(placementsRef) < len(p.starts):
            count.value = len(p.starts)
            raise nvml_error("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, s in enumerate(p.starts):
            placementsRef[i].start = s
            placementsRef[i].size = p.memory_slices
        count.value = len(p.starts)
        return C["NVML_SUCCESS"]

    def _used_slices(self, d: FakeDevice) -> list[bool]:
        used = [False] * d.memory_slices_total
        for gi in d.gpu_instances.values():
            for s in range(gi.start, gi.start + gi.profile.memory_slices):
                used[s] = True
        return used

    def _compute_used(self, d: FakeDevice) -> int:
        return sum(gi.profile.compute_slices for gi in d.gpu_instances.values())

    def _count_of(self, d: FakeDevice, p: GiProfile) -> int:
        return sum(1 for gi in d.gpu_instances.values() if gi.profile.id == p.id)

    @api()
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        d = self._dev(device)
        p = self._profile(d, profileId)
        used = self._used_slices(d)
        compute_left = d.compute_slices_total - self._compute_used(d)
        left = p.instance_count - self._count_of(d, p)
        n = 0
        for s in p.starts:
            if n >= left or compute_left < p.compute_slices:
                break
            end = s + p.memory_slices
            if end <= d.memory_slices_total and not any(used[s:end]):
                for k in range(s, s + p.memory_slices):
                    used[k] = True
                compute_left -= p.compute_slices
                n += 1
        return n

    def _create_gi(self, d: FakeDevice, p: GiProfile, start: int) -> Any:
        if d.mig_pending != d.mig_current:
            raise nvml_error("NVML_ERROR_INVALID_STATE")
        self._privileged()
        used = self._used_slices(d)
        if (
            self._count_of(d, p) >= p.instance_count
            or self._compute_used(d) + p.compute_slices > d.compute_slices_total
            or any(used[start : start + p.memory_slices])
        ):
            raise nvml_error("NVML_ERROR_INSUFFICIENT_RESOURCES")
        gi = GpuInstance(id=self._next_gi_id, profile=p, start=start, device=d)
        self._next_gi_id += 1
        gi.handle = self._new_handle(_real.c_nvmlGpuInstance_t, gi)
        d.gpu_instances[gi.id] = gi
        return gi.handle

    @api()
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        d = self._dev(device)
        p = self._profile(d, profileId)
        # The C function takes a pointer: a struct passed by value is garbage to it.
        pl = deref(placement) if placement is not None else None
        if not isinstance(pl, _real.c_nvmlGpuInstancePlacement_t):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if pl.start not in p.starts or pl.size != p.memory_slices:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return self._create_gi(d, p, pl.start)

    @api()
    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        d = self._dev(device)
        p = self._profile(d, profileId)
        used = self._used_slices(d)
        for s in p.starts:
            if not any(used[s : s + p.memory_slices]):
                return self._create_gi(d, p, s)
        raise nvml_error("NVML_ERROR_INSUFFICIENT_RESOURCES")

    @api()
    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        d = self._dev(device)
        p = self._profile(d, profileId)
        count = deref(countRef)
        gis = sorted(
            (gi for gi in d.gpu_instances.values() if gi.profile.id == p.id), key=lambda g: g.id
        )
        if (
            not isinstance(gpuInstancesRef, ctypes.Array)
            or gpuInstancesRef._type_ is not _real.c_nvmlGpuInstance_t
        ):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if len(gpuInstancesRef) < len(gis):
            count.value = len(gis)
            raise nvml_error("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, gi in enumerate(gis):
            gpuInstancesRef[i] = gi.handle
        count.value = len(gis)
        return C["NVML_SUCCESS"]

    @api()
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        d = self._dev(device)
        self._mig_enabled(d)
        gi = d.gpu_instances.get(gpuInstanceId)
        if gi is None:
            raise nvml_error("NVML_ERROR_NOT_FOUND")
        return gi.handle

    @api()
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gi = self._gi(gpuInstance)
        info = _real.c_nvmlGpuInstanceInfo_t()
        info.device = gi.device.handle
        info.id = gi.id
        info.profileId = gi.profile.id
        info.placement.start = gi.start
        info.placement.size = gi.profile.memory_slices
        return info

    @api()
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gi = self._gi(gpuInstance)
        self._privileged()
        if gi.cis:
            raise nvml_error("NVML_ERROR_IN_USE")
        del gi.device.gpu_instances[gi.id]
        self._drop_handle(gi.handle)
        return C["NVML_SUCCESS"]

    # -- compute instances -----------------------------------------------------------------
    @staticmethod
    def _ci_slices_for(gi: GpuInstance, profile: int) -> int | None:
        slices = next((s for s, e in CI_ENUM_BY_SLICES.items() if e == profile), None)
        g = gi.profile.compute_slices
        # CI sizes a GI offers: up to its own size; 3-slice CIs only on 3g and 7g GIs.
        if slices is None or slices > g or slices in (6, 8) or (slices == 3 and g not in (3, 7)):
            return None
        return slices

    @api()
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        gi = self._gi(device)  # pynvml names it "device"; it is a GPU-instance handle
        if not 0 <= profile < C["NVML_COMPUTE_INSTANCE_PROFILE_COUNT"]:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if engProfile != C["NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"]:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        slices = self._ci_slices_for(gi, profile)
        if slices is None:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if version == 2:
            info = _real.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.name = f"MIG {slices}c.{gi.profile.name}".encode()
        elif version == 1:
            info = _real.c_nvmlComputeInstanceProfileInfo_t()
        else:
            raise nvml_error("NVML_ERROR_FUNCTION_NOT_FOUND")
        info.id = profile  # CI profile ids equal their enums (nvidia-smi mig -lcip)
        info.sliceCount = slices
        info.instanceCount = gi.profile.compute_slices // slices
        info.multiprocessorCount = 14 * slices
        return info

    def _ci_free_start(self, gi: GpuInstance, slices: int) -> int | None:
        used = [False] * gi.profile.compute_slices
        for ci in gi.cis.values():
            for k in range(ci.start, ci.start + ci.slices):
                used[k] = True
        for s in range(0, gi.profile.compute_slices - slices + 1, slices):
            if not any(used[s : s + slices]):
                return s
        return None

    @api()
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        gi = self._gi(gpuInstance)
        slices = self._ci_slices_for(gi, profileId)
        if slices is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        left = gi.profile.compute_slices - sum(ci.slices for ci in gi.cis.values())
        return left // slices

    @api()
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gi = self._gi(gpuInstance)
        slices = self._ci_slices_for(gi, profileId)
        if slices is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        self._privileged()
        start = self._ci_free_start(gi, slices)
        if start is None:
            raise nvml_error("NVML_ERROR_INSUFFICIENT_RESOURCES")
        ci_id = next(i for i in range(8) if i not in gi.cis)
        d = gi.device
        ci = ComputeInstance(
            id=ci_id,
            profile_id=profileId,
            slices=slices,
            start=start,
            uuid="MIG-"
            + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"{d.uuid}/{gi.id}/{ci_id}/{gi.start}")),
            gi=gi,
        )
        ci.handle = self._new_handle(_real.c_nvmlComputeInstance_t, ci)
        ci.mig_handle = self._new_handle(_real.c_nvmlDevice_t, MigDevice(ci))
        gi.cis[ci_id] = ci
        return ci.handle

    @api()
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gi = self._gi(gpuInstance)
        if self._ci_slices_for(gi, profileId) is None:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        count = deref(countRef)
        cis = sorted((c for c in gi.cis.values() if c.profile_id == profileId), key=lambda c: c.id)
        if (
            not isinstance(computeInstancesRef, ctypes.Array)
            or computeInstancesRef._type_ is not _real.c_nvmlComputeInstance_t
        ):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if len(computeInstancesRef) < len(cis):
            count.value = len(cis)
            raise nvml_error("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, ci in enumerate(cis):
            computeInstancesRef[i] = ci.handle
        count.value = len(cis)
        return C["NVML_SUCCESS"]

    @api()
    def nvmlComputeInstanceGetInfo(self, computeInstance: Any) -> Any:
        ci = self._ci(computeInstance)
        info = _real.c_nvmlComputeInstanceInfo_t()
        info.device = ci.gi.device.handle
        info.gpuInstance = ci.gi.handle
        info.id = ci.id
        info.profileId = ci.profile_id
        info.placement.start = ci.start
        info.placement.size = ci.slices
        return info

    @api()
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        ci = self._ci(computeInstance)
        self._privileged()
        del ci.gi.cis[ci.id]
        self._drop_handle(ci.handle)
        self._drop_handle(ci.mig_handle)
        return C["NVML_SUCCESS"]

    # -- MIG devices -----------------------------------------------------------------------
    def _mig_devices(self, d: FakeDevice) -> list[ComputeInstance]:
        return [
            ci
            for gi in sorted(d.gpu_instances.values(), key=lambda g: g.id)
            for ci in sorted(gi.cis.values(), key=lambda c: c.id)
        ]

    @api()
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        d = self._dev(device)
        return d.compute_slices_total

    @api()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        d = self._dev(device)
        self._mig_enabled(d)
        if not 0 <= index < d.compute_slices_total:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        migs = self._mig_devices(d)
        if index >= len(migs):
            raise nvml_error("NVML_ERROR_NOT_FOUND")
        return migs[index].mig_handle

    @api()
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        return ctypes.c_uint(int(isinstance(self._dev_or_mig(device), MigDevice)))

    @api()
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        obj = self._dev_or_mig(device)
        if not isinstance(obj, MigDevice):
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        return obj.ci.gi.id

    @api()
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        obj = self._dev_or_mig(device)
        if not isinstance(obj, MigDevice):
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        return obj.ci.id

    @api()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        obj = self._dev_or_mig(migDevice)
        if not isinstance(obj, MigDevice):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return obj.ci.gi.device.handle
