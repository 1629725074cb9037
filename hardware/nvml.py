"""NVIDIA GPUs on this host through NVML (nvidia-ml-py, module ``pynvml``).

One ``NvmlBackend`` sees the local host as one node (``socket.gethostname()``) whose
devices are NVML's indexes. MIG goes through GPU instances (GI) and compute instances
(CI): a partition is a GI with one compute instance spanning all of it, and its uuid is
the MIG device's ``MIG-...`` UUID.

NVML facts this module is built on (DESIGN.md section 4, NVIDIA's nvml.h):

- ``nvmlDeviceGetGpuInstanceProfileInfo`` takes an ``NVML_GPU_INSTANCE_PROFILE_*`` enum;
  every other GI call takes the returned ``info.id`` (19 for 1g.5gb), never the enum.
- NVML lists GI profiles only while MIG mode is on; before it is enabled, plans use the
  SKU tables of hardware/skus.py (NVIDIA's published profiles) for a known GPU.
- A MIG mode whose pending value differs from the current one waits for a GPU reset.
- NOT_SUPPORTED telemetry fields (ECC off, no row remapping on a V100, utilization with
  MIG on...) read as their defaults; any other NVML error becomes a HardwareError quoting
  NVML's message, and NVML_ERROR_GPU_IS_LOST a DeviceLostError. telemetry() of a lost GPU
  returns a sample with ``present=False`` instead, so a monitor loop keeps going.

pynvml is imported lazily: this module imports on machines without it or a driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import socket
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuflow.hardware.backend import (
    CLOCK_EVENT_REASONS,
    Backend,
    ClockState,
    DeviceInfo,
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    NodeInfo,
    Partition,
    PartitionProfile,
    PartitionRequest,
    PowerLimits,
    TelemetrySample,
    UnsupportedError,
)
from gpuflow.hardware.placement import Occupied, fit_mig
from gpuflow.hardware.skus import SKUS

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
_GIB = 1024 * _MIB

# nvmlClocksEventReason* bits; NVML's ABI fixes them, so they need no live module.
CLOCK_EVENT_BITS: dict[str, int] = {
    "GpuIdle": 0x1,
    "ApplicationsClocksSetting": 0x2,
    "SwPowerCap": 0x4,
    "HwSlowdown": 0x8,
    "SyncBoost": 0x10,
    "SwThermalSlowdown": 0x20,
    "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}
assert tuple(CLOCK_EVENT_BITS) == CLOCK_EVENT_REASONS

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
_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_DRAIN = 10_000  # a driver that never says TIMEOUT must not hang us

EccCounter = Literal["volatile", "aggregate"]


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """Names (hardware.backend.CLOCK_EVENT_REASONS) of the bits set in an NVML mask."""
    return tuple(name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit)


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


def _import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise HardwareError(f"nvidia-ml-py (module pynvml) is not installed: {e}") from e
    return pynvml


@dataclass(frozen=True)
class _GiProfile:
    """A GI profile as NVML reports it: the enum asked for, the info, our view of it."""

    enum: int
    profile_id: int
    slice_count: int
    instance_count: int
    profile: PartitionProfile


@dataclass(frozen=True)
class _ComputeInstance:
    handle: Any
    ci_id: int
    slices: int


@dataclass(frozen=True)
class _GpuInstance:
    handle: Any
    gi_id: int
    profile: _GiProfile
    start: int
    size: int
    cis: tuple[_ComputeInstance, ...]


@dataclass
class _Created:
    gi: Any
    gi_id: int
    profile: _GiProfile
    start: int
    ci: Any = None
    ci_id: int | None = None


class NvmlBackend(Backend):
    """The local host's NVIDIA GPUs.

    ``nvml`` lets tests inject a stand-in for the pynvml module. ECC totals are NVML's
    ``volatile`` counters (since the driver last loaded) unless ``ecc_counter`` says
    ``aggregate`` (the device's lifetime, kept in its infoROM).
    """

    name = "nvml"

    def __init__(
        self,
        node_name: str | None = None,
        region: str | None = None,
        nvml: Any | None = None,
        ecc_counter: EccCounter = "volatile",
    ) -> None:
        if ecc_counter not in ("volatile", "aggregate"):
            raise InvalidRequestError(
                f"ecc_counter must be volatile or aggregate, not {ecc_counter!r}"
            )
        self._nvml = nvml if nvml is not None else _import_pynvml()
        self._error: type[Exception] = self._nvml.NVMLError
        self.node = node_name or socket.gethostname()
        self.region = region or os.environ.get("GPUFLOW_REGION", "local")
        self.ecc_counter: EccCounter = ecc_counter
        self._open = False
        self._nv(None, "nvmlInit")
        self._open = True
        self._info: dict[int, DeviceInfo] = {}
        # NVML has no getter for locked clocks: remember what this process set.
        self._locked: dict[int, tuple[int, int]] = {}
        self._event_sets: dict[int, Any] = {}
        try:
            self._register_xid_events()
        except BaseException:
            self.close()  # do not leak the nvmlInit reference
            raise

    # -- availability ----------------------------------------------------------------
    @classmethod
    def available(cls, nvml: Any | None = None) -> tuple[bool, str]:
        """(True, what answered) when an NVIDIA driver answers NVML, else (False, why)."""
        try:
            mod = nvml if nvml is not None else _import_pynvml()
        except HardwareError as e:
            return False, str(e)
        try:
            mod.nvmlInit()
        except mod.NVMLError as e:
            return False, f"nvmlInit failed: {e}"
        except OSError as e:
            return False, f"nvmlInit failed: {e}"
        try:
            count = mod.nvmlDeviceGetCount()
            driver = mod.nvmlSystemGetDriverVersion()
        except mod.NVMLError as e:
            return False, f"NVML initialised but could not list GPUs: {e}"
        finally:
            with contextlib.suppress(Exception):
                mod.nvmlShutdown()
        if count == 0:
            return False, f"NVML (driver {driver}) sees no GPU"
        return True, f"NVML driver {driver} sees {count} GPU(s)"

    def close(self) -> None:
        """Free the event sets and shut NVML down; safe to call twice."""
        if not self._open:
            return
        for es in self._event_sets.values():
            with contextlib.suppress(Exception):
                self._nvml.nvmlEventSetFree(es)
        self._event_sets.clear()
        self._open = False
        try:
            self._nvml.nvmlShutdown()
        except self._error as e:
            log.warning("nvmlShutdown failed: %s", e)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def driver_version(self) -> str:
        return str(self._nv(None, "nvmlSystemGetDriverVersion"))

    # -- NVML calls and errors -------------------------------------------------------
    def _code(self, name: str) -> int:
        return int(getattr(self._nvml, name))

    def _where(self, index: int | None) -> str:
        return self.node if index is None else f"{self.node}:{index}"

    def _translate(self, e: Exception, index: int | None, what: str) -> HardwareError:
        code = getattr(e, "value", None)
        where = self._where(index)
        if code == self._code("NVML_ERROR_GPU_IS_LOST"):
            return DeviceLostError(
                f"{where}: the GPU is lost (fell off the bus?); {what}: NVML: {e}"
            )
        msg = f"{where}: {what} failed: NVML: {e}"
        if code == self._code("NVML_ERROR_NOT_SUPPORTED"):
            return UnsupportedError(msg)
        if code == self._code("NVML_ERROR_NO_PERMISSION"):
            return HardwareError(msg + " (this needs root)")
        return HardwareError(msg)

    def _nv(self, index: int | None, fn: str, *args: Any, **kwargs: Any) -> Any:
        """Call pynvml.<fn>, turning NVMLError into our errors."""
        try:
            return getattr(self._nvml, fn)(*args, **kwargs)
        except self._error as e:
            raise self._translate(e, index, fn) from e

    def _nv_or(
        self,
        index: int | None,
        default: Any,
        codes: Sequence[str],
        fn: str,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Like _nv, but the NVML error codes named in ``codes`` give ``default``."""
        try:
            return getattr(self._nvml, fn)(*args, **kwargs)
        except self._error as e:
            if getattr(e, "value", None) in {self._code(c) for c in codes}:
                return default
            raise self._translate(e, index, fn) from e

    def _opt(self, index: int, default: Any, fn: str, *args: Any) -> Any:
        """A field the device may not offer: NOT_SUPPORTED (or a missing symbol) -> default."""
        return self._nv_or(
            index, default, ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND"), fn, *args
        )

    # -- devices ---------------------------------------------------------------------
    def _count(self) -> int:
        if not self._open:
            raise HardwareError("the NVML backend is closed")
        return int(self._nv(None, "nvmlDeviceGetCount"))

    def _check(self, node: str, index: int) -> None:
        if node != self.node:
            raise InvalidRequestError(
                f"node {node!r} is not this host ({self.node!r}); the NVML backend sees local GPUs only"
            )
        count = self._count()
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise InvalidRequestError(f"no GPU index {index!r} on {self.node} (NVML sees {count})")

    def _handle(self, node: str, index: int) -> Any:
        self._check(node, index)
        return self._nv(index, "nvmlDeviceGetHandleByIndex", index)

    def _mig_mode(self, index: int, h: Any) -> tuple[bool, bool] | None:
        """(current, pending) MIG mode, None when the GPU has no MIG."""
        mode = self._nv_or(index, None, ("NVML_ERROR_NOT_SUPPORTED",), "nvmlDeviceGetMigMode", h)
        if mode is None:
            return None
        enable = self._code("NVML_DEVICE_MIG_ENABLE")
        return mode[0] == enable, mode[1] == enable

    def _device_info(self, index: int) -> DeviceInfo:
        h = self._nv(index, "nvmlDeviceGetHandleByIndex", index)
        pci = self._nv(index, "nvmlDeviceGetPciInfo", h)
        info = DeviceInfo(
            node=self.node,
            index=index,
            vendor="NVIDIA",
            sku=str(self._nv(index, "nvmlDeviceGetName", h)),
            uuid=str(self._nv(index, "nvmlDeviceGetUUID", h)),
            memory_total_mb=int(self._nv(index, "nvmlDeviceGetMemoryInfo", h).total) // _MIB,
            pci_device_id=f"0x{int(pci.pciDeviceId):08X}",
            partition_kinds=("mig",) if self._mig_mode(index, h) is not None else (),
        )
        self._info[index] = info
        return info

    def discover(self) -> list[NodeInfo]:
        devices = []
        for i in range(self._count()):
            try:
                devices.append(self._device_info(i))
            except DeviceLostError as e:
                log.warning("%s: leaving a lost GPU out of discovery: %s", self._where(i), e)
        return [NodeInfo(name=self.node, region=self.region, role="active", devices=tuple(devices))]

    # -- MIG profiles ----------------------------------------------------------------
    def _profile_info(self, index: int, h: Any, enum: int) -> Any | None:
        """The GI profile info for an enum; None when the GPU does not offer it."""
        fn = "nvmlDeviceGetGpuInstanceProfileInfo"
        skip = {self._code("NVML_ERROR_NOT_SUPPORTED"), self._code("NVML_ERROR_INVALID_ARGUMENT")}
        try:
            return getattr(self._nvml, fn)(h, enum)
        except self._error as e:
            code = getattr(e, "value", None)
            if code in skip:
                return None
            if code != self._code("NVML_ERROR_FUNCTION_NOT_FOUND"):
                raise self._translate(e, index, fn) from e
        # Drivers without the versioned call answer only the version-1 struct (no name).
        return self._nv_or(
            index,
            None,
            ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"),
            fn,
            h,
            enum,
            version=1,
        )

    def _placements(self, index: int, h: Any, profile_id: int) -> list[tuple[int, int]]:
        count = ctypes.c_uint(0)
        fn = "nvmlDeviceGetGpuInstancePossiblePlacements"
        self._nv(index, fn, h, profile_id, None, ctypes.byref(count))  # size query
        if count.value == 0:
            return []
        arr = (self._nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        self._nv(index, fn, h, profile_id, arr, ctypes.byref(count))
        return [(int(arr[i].start), int(arr[i].size)) for i in range(count.value)]

    def _gi_profiles(self, index: int, h: Any) -> list[_GiProfile]:
        """The GI profiles NVML lists for the device ([] while MIG mode is off)."""
        total_bytes = int(self._nv(index, "nvmlDeviceGetMemoryInfo", h).total)
        out = []
        for enum_name, suffix in _GI_ENUMS:
            enum = getattr(self._nvml, "NVML_GPU_INSTANCE_PROFILE_" + enum_name, None)
            if enum is None:
                continue
            info = self._profile_info(index, h, enum)
            if info is None:
                continue
            placements = self._placements(index, h, int(info.id))
            name = self._profile_name(info, total_bytes, suffix)
            profile = PartitionProfile(
                name=name,
                kind="mig",
                profile_id=int(info.id),
                compute_slices=int(info.sliceCount),
                memory_mb=int(info.memorySizeMB),
                max_count=int(info.instanceCount),
                placement_starts=tuple(sorted({s for s, _ in placements})),
                placement_size=placements[0][1] if placements else 0,
            )
            out.append(
                _GiProfile(
                    enum=enum,
                    profile_id=int(info.id),
                    slice_count=int(info.sliceCount),
                    instance_count=int(info.instanceCount),
                    profile=profile,
                )
            )
        return out

    @staticmethod
    def _profile_name(info: Any, total_bytes: int, suffix: str) -> str:
        # The v2 info carries the driver's own name ("MIG 1g.5gb"); older drivers leave it
        # out, and then we compute it the way nvidia-smi does.
        raw = getattr(info, "name", b"")
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
        text = text.strip().removeprefix("MIG ").strip()
        if _PROFILE_NAME_RE.match(text):
            return text
        return mig_profile_name(int(info.sliceCount), int(info.memorySizeMB), total_bytes, suffix)

    def _sku_profiles(self, index: int, h: Any) -> list[PartitionProfile]:
        name = str(self._nv(index, "nvmlDeviceGetName", h))
        pci = f"0x{int(self._nv(index, 'nvmlDeviceGetPciInfo', h).pciDeviceId):08X}"
        for spec in SKUS.values():
            if spec.name == name or (spec.pci_device_id and spec.pci_device_id == pci):
                return list(spec.mig_profiles)
        return []

    def nvml_partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        """Only what NVML itself lists: [] while MIG mode is off or without MIG."""
        h = self._handle(node, index)
        if self._mig_mode(index, h) is None:
            return []
        return [g.profile for g in self._gi_profiles(index, h)]

    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        h = self._handle(node, index)
        mode = self._mig_mode(index, h)
        if mode is None:
            return []
        profiles = [g.profile for g in self._gi_profiles(index, h)]
        if not profiles and not mode[0]:
            # NVML lists profiles only with MIG on; to plan before enabling it, use the
            # published table for this SKU (matched by NVML name or PCI device id).
            return self._sku_profiles(index, h)
        return profiles

    # -- MIG instances ---------------------------------------------------------------
    def _ci_profile_info(self, index: int, gi: Any, enum: int) -> Any | None:
        engine = int(getattr(self._nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        return self._nv_or(
            index,
            None,
            ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT"),
            "nvmlGpuInstanceGetComputeInstanceProfileInfo",
            gi,
            enum,
            engine,
        )

    def _ci_enums(self) -> range:
        return range(int(getattr(self._nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 8)))

    def _compute_instances(self, index: int, gi: Any) -> tuple[_ComputeInstance, ...]:
        out = []
        for enum in self._ci_enums():
            info = self._ci_profile_info(index, gi, enum)
            if info is None or int(info.instanceCount) == 0:
                continue
            n = int(info.instanceCount)
            arr = (self._nvml.c_nvmlComputeInstance_t * n)()
            count = ctypes.c_uint(n)
            self._nv(
                index,
                "nvmlGpuInstanceGetComputeInstances",
                gi,
                int(info.id),
                arr,
                ctypes.byref(count),
            )
            for k in range(count.value):
                ci_info = self._nv(index, "nvmlComputeInstanceGetInfo", arr[k])
                out.append(_ComputeInstance(arr[k], int(ci_info.id), int(info.sliceCount)))
        return tuple(out)

    def _gpu_instances(self, index: int, h: Any, profiles: list[_GiProfile]) -> list[_GpuInstance]:
        out = []
        for gp in profiles:
            if gp.instance_count == 0:
                continue
            arr = (self._nvml.c_nvmlGpuInstance_t * gp.instance_count)()
            count = ctypes.c_uint(gp.instance_count)
            self._nv(index, "nvmlDeviceGetGpuInstances", h, gp.profile_id, arr, ctypes.byref(count))
            for k in range(count.value):
                info = self._nv(index, "nvmlGpuInstanceGetInfo", arr[k])
                out.append(
                    _GpuInstance(
                        handle=arr[k],
                        gi_id=int(info.id),
                        profile=gp,
                        start=int(info.placement.start),
                        size=int(info.placement.size),
                        cis=self._compute_instances(index, arr[k]),
                    )
                )
        return out

    def _mig_uuids(self, index: int, h: Any) -> dict[tuple[int, int], str]:
        """(GI id, CI id) -> MIG device UUID."""
        out: dict[tuple[int, int], str] = {}
        n = int(self._opt(index, 0, "nvmlDeviceGetMaxMigDeviceCount", h))
        for i in range(n):
            m = self._nv_or(
                index, None, ("NVML_ERROR_NOT_FOUND",), "nvmlDeviceGetMigDeviceHandleByIndex", h, i
            )
            if m is None:  # an empty slot
                continue
            gi_id = int(self._nv(index, "nvmlDeviceGetGpuInstanceId", m))
            ci_id = int(self._nv(index, "nvmlDeviceGetComputeInstanceId", m))
            out[(gi_id, ci_id)] = str(self._nv(index, "nvmlDeviceGetUUID", m))
        return out

    def _partitions(self, index: int, h: Any) -> list[tuple[Partition, _GpuInstance]]:
        mode = self._mig_mode(index, h)
        if mode is None or not mode[0]:
            return []
        instances = self._gpu_instances(index, h, self._gi_profiles(index, h))
        uuids = self._mig_uuids(index, h)
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
                part = Partition(
                    node=self.node,
                    device_index=index,
                    uuid=uuid,
                    profile=name,
                    kind="mig",
                    memory_mb=gp.memory_mb,
                    placement_start=gi.start,
                    placement_size=gi.size,
                )
                out.append((part, gi))
        out.sort(key=lambda pg: (pg[0].placement_start or 0, pg[0].uuid))
        return out

    def partitions(self, node: str, index: int) -> list[Partition]:
        h = self._handle(node, index)
        return [p for p, _ in self._partitions(index, h)]

    def mig_mode(self, node: str, index: int) -> tuple[bool, bool]:
        """(current, pending) MIG mode; they differ while a change waits for a GPU reset."""
        h = self._handle(node, index)
        mode = self._mig_mode(index, h)
        if mode is None:
            raise UnsupportedError(f"{self._where(index)}: this GPU does not support MIG")
        return mode

    def partition_mode(self, node: str, index: int) -> bool:
        h = self._handle(node, index)
        mode = self._mig_mode(index, h)
        return bool(mode and mode[0])

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        h = self._handle(node, index)
        where = self._where(index)
        mode = self._mig_mode(index, h)
        if mode is None:
            raise UnsupportedError(f"{where}: this GPU does not support MIG")
        if mode == (enabled, enabled):
            return
        if not enabled and mode[0]:
            existing = self._partitions(index, h)
            if existing:
                raise InvalidRequestError(
                    f"{where}: {len(existing)} MIG partition(s) exist; destroy them before "
                    "disabling MIG mode"
                )
        want = self._code("NVML_DEVICE_MIG_ENABLE" if enabled else "NVML_DEVICE_MIG_DISABLE")
        status = self._nv(index, "nvmlDeviceSetMigMode", h, want)
        current, pending = self._mig_mode(index, h) or (False, False)
        if current != enabled:
            why = ""
            if status:
                why = f" (activation status: {self._nvml.nvmlErrorString(status)})"
            raise HardwareError(
                f"{where}: MIG mode {'enable' if enabled else 'disable'} is pending (current "
                f"{current}, pending {pending}): a GPU reset is needed to apply it, e.g. "
                f"nvidia-smi -r -i {index}{why}"
            )

    def _full_ci_profile(self, index: int, gi: Any, slices: int) -> Any:
        for enum in self._ci_enums():
            info = self._ci_profile_info(index, gi, enum)
            if info is not None and int(info.sliceCount) == slices:
                return info
        raise HardwareError(
            f"{self._where(index)}: no compute-instance profile spans a {slices}-slice GPU instance"
        )

    def _rollback(self, index: int, created: list[_Created]) -> None:
        for c in reversed(created):
            try:
                if c.ci is not None:
                    self._nv(index, "nvmlComputeInstanceDestroy", c.ci)
                self._nv(index, "nvmlGpuInstanceDestroy", c.gi)
            except HardwareError as e:
                log.error("%s: rollback of GI %d failed: %s", self._where(index), c.gi_id, e)

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        requests = list(requests)
        h = self._handle(node, index)
        if not requests:  # an empty layout is a no-op, even on a GPU without MIG
            return []
        where = self._where(index)
        sku_name = str(self._nv(index, "nvmlDeviceGetName", h))
        mode = self._mig_mode(index, h)
        if mode is None:
            raise UnsupportedError(f"{where} ({sku_name}) does not support MIG")
        current, pending = mode
        if not current and pending:
            raise HardwareError(
                f"{where}: MIG mode is enabled but pending: reset the GPU (nvidia-smi -r -i {index}) "
                "before creating partitions"
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
        profiles = self._gi_profiles(index, h)
        by_name = {g.profile.name: g for g in profiles}
        instances = self._gpu_instances(index, h, profiles)
        placed = fit_mig(
            f"{where} ({sku_name})",
            [g.profile for g in profiles],
            requests,
            existing=[Occupied(gi.start, gi.size, gi.profile.slice_count) for gi in instances],
            existing_counts=Counter(gi.profile.profile.name for gi in instances),
        )
        created: list[_Created] = []
        try:
            for req in placed:
                gp = by_name[req.profile]
                pl = self._nvml.c_nvmlGpuInstancePlacement_t()
                pl.start = int(req.placement_start or 0)
                pl.size = gp.profile.placement_size
                gi = self._nv(
                    index,
                    "nvmlDeviceCreateGpuInstanceWithPlacement",
                    h,
                    gp.profile_id,
                    ctypes.byref(pl),
                )
                gi_id = int(self._nv(index, "nvmlGpuInstanceGetInfo", gi).id)
                c = _Created(gi=gi, gi_id=gi_id, profile=gp, start=pl.start)
                created.append(c)
                ci_profile = self._full_ci_profile(index, gi, gp.slice_count)
                c.ci = self._nv(
                    index, "nvmlGpuInstanceCreateComputeInstance", gi, int(ci_profile.id)
                )
                c.ci_id = int(self._nv(index, "nvmlComputeInstanceGetInfo", c.ci).id)
        except HardwareError:
            self._rollback(index, created)
            raise
        uuids = self._mig_uuids(index, h)
        return [
            Partition(
                node=self.node,
                device_index=index,
                uuid=uuids.get((c.gi_id, c.ci_id or 0), f"gi:{index}:{c.gi_id}:ci:{c.ci_id}"),
                profile=c.profile.profile.name,
                kind="mig",
                memory_mb=c.profile.profile.memory_mb,
                placement_start=c.start,
                placement_size=c.profile.profile.placement_size,
            )
            for c in created
        ]

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        """Destroy partitions; a partition's whole GPU instance goes, compute instances first."""
        h = self._handle(node, index)
        existing = self._partitions(index, h)
        if uuids is None:
            targets = [gi for _, gi in existing]
        else:
            known = {p.uuid: gi for p, gi in existing}
            unknown = [u for u in uuids if u not in known]
            if unknown:
                raise InvalidRequestError(
                    f"{self._where(index)}: no partition(s) {unknown}; existing: {sorted(known) or 'none'}"
                )
            targets = [known[u] for u in uuids]
        seen: set[int] = set()
        for gi in targets:
            if gi.gi_id in seen:
                continue
            seen.add(gi.gi_id)
            for ci in gi.cis:
                self._nv(index, "nvmlComputeInstanceDestroy", ci.handle)
            self._nv(index, "nvmlGpuInstanceDestroy", gi.handle)

    # -- telemetry -------------------------------------------------------------------
    def _register_xid_events(self) -> None:
        # Register at start so XIDs between now and the first sample are kept.
        for i in range(self._count()):
            es = None
            try:
                h = self._nv(i, "nvmlDeviceGetHandleByIndex", i)
                es = self._nv(i, "nvmlEventSetCreate")
                xid = int(getattr(self._nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
                self._nv(i, "nvmlDeviceRegisterEvents", h, xid, es)
                self._event_sets[i] = es
            except HardwareError as e:
                log.info("%s: XID events unavailable: %s", self._where(i), e)
                if es is not None:
                    with contextlib.suppress(Exception):
                        self._nvml.nvmlEventSetFree(es)

    def _drain_xids(self, index: int) -> tuple[int, ...]:
        es = self._event_sets.get(index)
        if es is None:
            return ()
        xid_bit = int(getattr(self._nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))
        timeout = self._code("NVML_ERROR_TIMEOUT")
        xids = []
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                data = self._nvml.nvmlEventSetWait(es, 0)
            except self._error as e:
                if getattr(e, "value", None) != timeout:
                    log.warning("%s: reading XID events failed: %s", self._where(index), e)
                break
            if int(data.eventType) & xid_bit:
                xids.append(int(data.eventData))
        return tuple(xids)

    def _clock_events(self, index: int, h: Any) -> int:
        fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if hasattr(self._nvml, fn):
            try:
                return int(getattr(self._nvml, fn)(h))
            except self._error as e:
                code = getattr(e, "value", None)
                if code == self._code("NVML_ERROR_NOT_SUPPORTED"):
                    return 0
                if code != self._code("NVML_ERROR_FUNCTION_NOT_FOUND"):
                    raise self._translate(e, index, fn) from e
        # Drivers before r535 only have the older name of the same bits.
        return int(self._opt(index, 0, "nvmlDeviceGetCurrentClocksThrottleReasons", h))

    def _ecc_totals(self, index: int, h: Any) -> tuple[int, int]:
        counter = self._code(
            "NVML_AGGREGATE_ECC" if self.ecc_counter == "aggregate" else "NVML_VOLATILE_ECC"
        )
        fn = "nvmlDeviceGetTotalEccErrors"
        corrected = self._opt(
            index, 0, fn, h, self._code("NVML_MEMORY_ERROR_TYPE_CORRECTED"), counter
        )
        uncorrected = self._opt(
            index, 0, fn, h, self._code("NVML_MEMORY_ERROR_TYPE_UNCORRECTED"), counter
        )
        return int(corrected), int(uncorrected)

    def _retired_pages(self, index: int, h: Any) -> int:
        causes = (
            "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS",
            "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR",
        )
        return sum(
            len(self._opt(index, [], "nvmlDeviceGetRetiredPages", h, self._code(c))) for c in causes
        )

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        self._check(node, index)
        xids = self._drain_xids(index)
        now = time.time()
        try:
            h = self._nv(index, "nvmlDeviceGetHandleByIndex", index)
            mem = self._nv(index, "nvmlDeviceGetMemoryInfo", h)
            util = self._opt(index, None, "nvmlDeviceGetUtilizationRates", h)
            ecc_corr, ecc_unc = self._ecc_totals(index, h)
            remap = self._opt(index, (0, 0, 0, 0), "nvmlDeviceGetRemappedRows", h)
            return TelemetrySample(
                node=self.node,
                index=index,
                timestamp_s=now,
                present=True,
                temperature_c=float(
                    self._opt(
                        index, 0, "nvmlDeviceGetTemperature", h, self._code("NVML_TEMPERATURE_GPU")
                    )
                ),
                power_mw=int(self._opt(index, 0, "nvmlDeviceGetPowerUsage", h)),
                energy_mj=int(self._opt(index, 0, "nvmlDeviceGetTotalEnergyConsumption", h)),
                utilization_ratio=(int(util.gpu) / 100.0) if util is not None else 0.0,
                memory_used_mb=int(mem.used) // _MIB,
                memory_total_mb=int(mem.total) // _MIB,
                sm_clock_mhz=int(
                    self._opt(index, 0, "nvmlDeviceGetClockInfo", h, self._code("NVML_CLOCK_SM"))
                ),
                power_limit_mw=int(self._opt(index, 0, "nvmlDeviceGetPowerManagementLimit", h)),
                ecc_corrected_total=ecc_corr,
                ecc_uncorrected_total=ecc_unc,
                retired_pages=self._retired_pages(index, h),
                remapped_rows_correctable=int(remap[0]),
                remapped_rows_uncorrectable=int(remap[1]),
                remapped_rows_pending=bool(remap[2]),
                remapped_rows_failure=bool(remap[3]),
                clock_event_reasons=decode_clock_event_reasons(self._clock_events(index, h)),
                xids=xids,
            )
        except DeviceLostError:
            known = self._info.get(index)
            return TelemetrySample(
                node=self.node,
                index=index,
                timestamp_s=now,
                present=False,
                temperature_c=0.0,
                power_mw=0,
                energy_mj=0,
                utilization_ratio=0.0,
                memory_used_mb=0,
                memory_total_mb=known.memory_total_mb if known else 0,
                sm_clock_mhz=0,
                power_limit_mw=0,
                xids=xids,
            )

    def energy_mj(self, node: str, index: int) -> int:
        h = self._handle(node, index)
        return int(self._nv(index, "nvmlDeviceGetTotalEnergyConsumption", h))

    # -- clocks ----------------------------------------------------------------------
    def _supported_sm_clocks(self, index: int, h: Any) -> tuple[int | None, list[int]]:
        """(highest memory clock, graphics clocks supported with it); (None, []) if unknown."""
        mems = self._opt(index, [], "nvmlDeviceGetSupportedMemoryClocks", h)
        if not mems:
            return None, []
        mem = max(int(m) for m in mems)
        gfx = self._opt(index, [], "nvmlDeviceGetSupportedGraphicsClocks", h, mem)
        return mem, sorted(int(c) for c in gfx)

    def clocks(self, node: str, index: int) -> ClockState:
        h = self._handle(node, index)
        sm_type = self._code("NVML_CLOCK_SM")
        current = int(self._nv(index, "nvmlDeviceGetClockInfo", h, sm_type))
        top = int(self._nv(index, "nvmlDeviceGetMaxClockInfo", h, sm_type))
        _, supported = self._supported_sm_clocks(index, h)
        # Without a supported-clocks table the lowest clock we know of is the current one.
        bottom = min(supported) if supported else min(current, top)
        app_sm = self._opt(
            index, None, "nvmlDeviceGetApplicationsClock", h, self._code("NVML_CLOCK_GRAPHICS")
        )
        app_mem = self._opt(
            index, None, "nvmlDeviceGetApplicationsClock", h, self._code("NVML_CLOCK_MEM")
        )
        locked = self._locked.get(index)
        return ClockState(
            sm_clock_mhz=current,
            sm_clock_min_mhz=bottom,
            sm_clock_max_mhz=top,
            locked_min_mhz=locked[0] if locked else None,
            locked_max_mhz=locked[1] if locked else None,
            applications_sm_clock_mhz=int(app_sm) if app_sm is not None else None,
            applications_mem_clock_mhz=int(app_mem) if app_mem is not None else None,
        )

    @staticmethod
    def _int(name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
        return value

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        lo, hi = self._int("min_mhz", min_mhz), self._int("max_mhz", max_mhz)
        state = self.clocks(node, index)
        if lo > hi:
            raise InvalidRequestError(f"{self._where(index)}: min_mhz {lo} is above max_mhz {hi}")
        if lo < state.sm_clock_min_mhz or hi > state.sm_clock_max_mhz:
            raise InvalidRequestError(
                f"{self._where(index)}: locked clocks {lo}-{hi} MHz outside the GPU's "
                f"{state.sm_clock_min_mhz}-{state.sm_clock_max_mhz} MHz"
            )
        h = self._handle(node, index)
        self._nv(index, "nvmlDeviceSetGpuLockedClocks", h, lo, hi)
        self._locked[index] = (lo, hi)

    def reset_locked_clocks(self, node: str, index: int) -> None:
        h = self._handle(node, index)
        self._nv(index, "nvmlDeviceResetGpuLockedClocks", h)
        self._locked.pop(index, None)

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        mem = self._int("mem_clock_mhz", mem_clock_mhz)
        sm = self._int("sm_clock_mhz", sm_clock_mhz)
        h = self._handle(node, index)
        where = self._where(index)
        mems = sorted(int(m) for m in self._opt(index, [], "nvmlDeviceGetSupportedMemoryClocks", h))
        if not mems:
            raise UnsupportedError(
                f"{where}: the GPU lists no supported clocks (no application clocks)"
            )
        if mem not in mems:
            raise InvalidRequestError(
                f"{where}: memory clock {mem} MHz not supported; supported: {mems}"
            )
        gfx = sorted(
            int(c) for c in self._opt(index, [], "nvmlDeviceGetSupportedGraphicsClocks", h, mem)
        )
        if sm not in gfx:
            nearest = min(gfx, key=lambda c: abs(c - sm)) if gfx else None
            raise InvalidRequestError(
                f"{where}: SM clock {sm} MHz not supported with memory at {mem} MHz "
                f"(supported {gfx[0] if gfx else '?'}-{gfx[-1] if gfx else '?'} MHz; nearest {nearest})"
            )
        self._nv(index, "nvmlDeviceSetApplicationsClocks", h, mem, sm)

    # -- power -----------------------------------------------------------------------
    def power_limits(self, node: str, index: int) -> PowerLimits:
        h = self._handle(node, index)
        lo, hi = self._nv(index, "nvmlDeviceGetPowerManagementLimitConstraints", h)
        return PowerLimits(
            limit_mw=int(self._nv(index, "nvmlDeviceGetPowerManagementLimit", h)),
            min_limit_mw=int(lo),
            max_limit_mw=int(hi),
            default_limit_mw=int(self._nv(index, "nvmlDeviceGetPowerManagementDefaultLimit", h)),
        )

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        limit = self._int("limit_mw", limit_mw)
        lim = self.power_limits(node, index)
        if not lim.min_limit_mw <= limit <= lim.max_limit_mw:
            raise InvalidRequestError(
                f"{self._where(index)}: power limit {limit} mW outside "
                f"{lim.min_limit_mw}-{lim.max_limit_mw} mW"
            )
        h = self._handle(node, index)
        self._nv(index, "nvmlDeviceSetPowerManagementLimit", h, limit)
