"""An in-repo fake of the ``pynvml`` module (nvidia-ml-py) that enforces NVML's rules.

Tests hand a ``FakeNvml`` to ``NvmlBackend(nvml=...)``. It offers the same function names,
parameter names, return types and constants as nvidia-ml-py (a test compares the
signatures), and it refuses what real NVML refuses, because a fake that accepts anything
lets backend bugs through:

- GPU-instance calls take the profile *id* from ``nvmlDeviceGetGpuInstanceProfileInfo``,
  not the ``NVML_GPU_INSTANCE_PROFILE_*`` enum; an enum that is no id of the device fails
  with NVML_ERROR_INVALID_ARGUMENT, and one that happens to equal another profile's id
  (enum 0 == id 0 == 7g) silently means that other profile, as on real hardware.
- Placements per profile, memory-slice overlap, per-profile counts and the 7 compute
  slices: NVML_ERROR_INSUFFICIENT_RESOURCES; remaining capacity is computed from them.
- MIG calls on a GPU without MIG mode: NVML_ERROR_NOT_SUPPORTED (the V100 always); a mode
  change still pending a reset: NVML_ERROR_INVALID_STATE for instance creation.
- A GPU instance with live compute instances cannot be destroyed: NVML_ERROR_IN_USE.
- Everything but nvmlInit/nvmlErrorString fails with NVML_ERROR_UNINITIALIZED before init.
- XIDs only reach event sets that registered nvmlEventTypeXidCriticalError for the device;
  nvmlEventSetWait raises NVML_ERROR_TIMEOUT when nothing is pending.
- ``lose_gpu(i)``: every call on that device raises NVML_ERROR_GPU_IS_LOST.

Handles are real ctypes pointers of pynvml's handle types (c_nvmlDevice_t, ...), and the
structs are pynvml's own, so the backend cannot lean on anything real NVML would not give.
Devices are built from hardware/skus.py.
"""

from __future__ import annotations

import ctypes
import functools
import uuid as _uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real
from gpuflow.hardware.skus import (
    MIG_COMPUTE_SLICES,
    MIG_MEMORY_SLICES,
    SkuSpec,
    mig_enum_names,
    sku,
)

# Constants are taken from nvidia-ml-py itself so their values cannot drift from it.
_CONSTANT_PREFIXES = ("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "nvmlEventType")
CONSTANTS: dict[str, Any] = {
    n: getattr(_real, n) for n in dir(_real) if n.startswith(_CONSTANT_PREFIXES)
}
globals().update(CONSTANTS)

# pynvml's structs and handle types, re-exported for callers that build arrays/placements.
STRUCTS: dict[str, Any] = {
    n: getattr(_real, n)
    for n in (
        "c_nvmlDevice_t",
        "c_nvmlGpuInstance_t",
        "c_nvmlComputeInstance_t",
        "c_nvmlEventSet_t",
        "c_nvmlGpuInstancePlacement_t",
        "c_nvmlGpuInstanceProfileInfo_t",
        "c_nvmlGpuInstanceProfileInfo_v2_t",
        "c_nvmlGpuInstanceInfo_t",
        "c_nvmlComputeInstancePlacement_t",
        "c_nvmlComputeInstanceProfileInfo_t",
        "c_nvmlComputeInstanceProfileInfo_v2_t",
        "c_nvmlComputeInstanceInfo_t",
        "c_nvmlMemory_t",
        "c_nvmlUtilization_t",
        "c_nvmlEventData_t",
        "nvmlPciInfo_t",
    )
}

_C = CONSTANTS  # short alias used below

_ERROR_STRINGS = {
    _C["NVML_SUCCESS"]: "Success",
    _C["NVML_ERROR_UNINITIALIZED"]: "Uninitialized",
    _C["NVML_ERROR_INVALID_ARGUMENT"]: "Invalid Argument",
    _C["NVML_ERROR_NOT_SUPPORTED"]: "Not Supported",
    _C["NVML_ERROR_NO_PERMISSION"]: "Insufficient Permissions",
    _C["NVML_ERROR_NOT_FOUND"]: "Not Found",
    _C["NVML_ERROR_INSUFFICIENT_SIZE"]: "Insufficient Size",
    _C["NVML_ERROR_DRIVER_NOT_LOADED"]: "Driver Not Loaded",
    _C["NVML_ERROR_TIMEOUT"]: "Timeout",
    _C["NVML_ERROR_LIBRARY_NOT_FOUND"]: "NVML Shared Library Not Found",
    _C["NVML_ERROR_FUNCTION_NOT_FOUND"]: "Function Not Found",
    _C["NVML_ERROR_GPU_IS_LOST"]: "GPU is lost",
    _C["NVML_ERROR_RESET_REQUIRED"]: "GPU requires restart",
    _C["NVML_ERROR_IN_USE"]: "In use by another client",
    _C["NVML_ERROR_INSUFFICIENT_RESOURCES"]: "Insufficient resources",
    _C["NVML_ERROR_INVALID_STATE"]: "Invalid state",
    _C["NVML_ERROR_UNKNOWN"]: "Unknown Error",
}


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: ``.value`` holds the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _ERROR_STRINGS.get(self.value, f"NVML Error with code {self.value}")


def nvmlErrorString(result: int) -> str:
    return _ERROR_STRINGS.get(result, f"Unknown error {result}")


# What NVML reports as total memory differs from the marketing size on Hopper; MIG names
# (1g.18gb on an H200) are computed from the reported total, so the fake reports it too.
NVML_MEMORY_TOTAL_MB = {
    "NVIDIA H100 80GB HBM3": 81559,
    "NVIDIA H200": 143771,
}

# Compute-instance profile enum per slice count (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE).
_CI_ENUM_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
_UINT_MAX = 0xFFFFFFFF


def _err(code_name: str) -> NVMLError:
    return NVMLError(_C[code_name])


@dataclass
class GiProfile:
    enum: int
    id: int
    name: str
    compute_slices: int
    memory_slices: int
    instance_count: int
    memory_mb: int
    starts: tuple[int, ...]


@dataclass
class ComputeInstance:
    id: int
    profile_id: int
    slices: int
    start: int
    uuid: str
    gi: GpuInstance
    handle: Any = None
    mig_handle: Any = None


@dataclass
class GpuInstance:
    id: int
    profile: GiProfile
    start: int
    device: FakeDevice
    cis: dict[int, ComputeInstance] = field(default_factory=dict)
    handle: Any = None


@dataclass
class FakeDevice:
    """One GPU's state. Tests poke the telemetry fields directly."""

    index: int
    spec: SkuSpec
    uuid: str
    memory_total_mb: int
    bus_id: str
    profiles: list[GiProfile]
    mig_current: int = 0
    mig_pending: int = 0
    mig_needs_reset: bool = False  # True: a mode change waits for reset_gpu()
    gpu_instances: dict[int, GpuInstance] = field(default_factory=dict)
    lost: bool = False
    handle: Any = None
    # telemetry
    temperature_c: int = 34
    power_mw: int = 0
    energy_mj: int = 1_000_000
    utilization_gpu_pct: int = 0
    memory_used_mb: int = 0
    ecc_enabled: bool = True
    ecc_volatile: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    ecc_aggregate: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    retired_pages: dict[int, list[int]] = field(default_factory=lambda: {0: [], 1: []})
    row_remapping: bool = True  # A100 and newer remap rows; the V100 retires pages
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    clock_event_reasons: int = 0
    # clocks and power
    sm_clock_mhz: int = 0
    mem_clock_mhz: int = 0
    graphics_clocks_mhz: list[int] = field(default_factory=list)
    app_sm_clock_mhz: int = 0
    app_mem_clock_mhz: int = 0
    locked_clocks_mhz: tuple[int, int] | None = None
    power_limit_mw: int = 0
    power_min_limit_mw: int = 0
    power_max_limit_mw: int = 0
    power_default_limit_mw: int = 0

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    def profile_by_id(self, profile_id: int) -> GiProfile | None:
        return next((p for p in self.profiles if p.id == profile_id), None)


@dataclass
class _MigDevice:
    ci: ComputeInstance


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # device index -> event mask
    queue: list[tuple[FakeDevice, int, int]] = field(default_factory=list)
    handle: Any = None


def _gi_profiles(spec: SkuSpec, memory_total_mb: int) -> list[GiProfile]:
    if not spec.mig_profiles:
        return []
    out = []
    for enum_name, p in zip(mig_enum_names(), spec.mig_profiles, strict=True):
        # NVML's instance memory is a little under slices x (total / 8): the driver keeps
        # some back. 95 % matches A100-40GB's 1g.5gb (4864 of 5120 MiB).
        memory_mb = int(p.placement_size * memory_total_mb / MIG_MEMORY_SLICES * 0.95)
        out.append(
            GiProfile(
                enum=_C["NVML_GPU_INSTANCE_PROFILE_" + enum_name],
                id=p.profile_id,
                name=p.name,
                compute_slices=p.compute_slices,
                memory_slices=p.placement_size,
                instance_count=p.max_count,
                memory_mb=memory_mb,
                starts=p.placement_starts,
            )
        )
    return out


def _graphics_clocks(spec: SkuSpec) -> list[int]:
    # Real tables step down from the max clock in 15 MHz steps to the idle clock,
    # highest first (nvidia-smi -q -d SUPPORTED_CLOCKS).
    clocks = list(range(spec.sm_clock_max_mhz, spec.sm_clock_min_mhz - 1, -15))
    if clocks[-1] != spec.sm_clock_min_mhz:
        clocks.append(spec.sm_clock_min_mhz)
    return clocks


def make_device(index: int, sku_name: str) -> FakeDevice:
    spec = sku(sku_name)
    if spec.vendor != "NVIDIA":
        raise ValueError(f"{sku_name}: NVML only sees NVIDIA GPUs")
    total = NVML_MEMORY_TOTAL_MB.get(spec.name, spec.memory_total_mb)
    return FakeDevice(
        index=index,
        spec=spec,
        uuid="GPU-" + str(_uuid.uuid5(_uuid.NAMESPACE_DNS, f"fake-gpu-{index}-{spec.name}")),
        memory_total_mb=total,
        bus_id=f"00000000:{0x10 + index:02X}:00.0",
        profiles=_gi_profiles(spec, total),
        row_remapping=spec.supports_mig,
        power_mw=spec.power_idle_mw,
        sm_clock_mhz=spec.sm_clock_min_mhz,
        mem_clock_mhz=spec.mem_clock_mhz,
        graphics_clocks_mhz=_graphics_clocks(spec),
        app_sm_clock_mhz=spec.sm_clock_default_app_mhz,
        app_mem_clock_mhz=spec.mem_clock_mhz,
        power_limit_mw=spec.power_default_limit_mw,
        power_min_limit_mw=spec.power_min_limit_mw,
        power_max_limit_mw=spec.power_max_limit_mw,
        power_default_limit_mw=spec.power_default_limit_mw,
    )


def _api(check_init: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record the call and, like NVML, refuse it before nvmlInit."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(self: FakeNvml, *args: Any, **kwargs: Any) -> Any:
            self.calls.append(fn.__name__)
            if self.fail_next.get(fn.__name__):
                raise NVMLError(self.fail_next.pop(fn.__name__))
            if check_init and self._init_count == 0:
                raise _err("NVML_ERROR_UNINITIALIZED")
            return fn(self, *args, **kwargs)

        wrapper.nvml_api = True  # type: ignore[attr-defined]
        return wrapper

    return deco


def _out(ref: Any) -> Any:
    """The ctypes object behind byref(x) or pointer(x)."""
    if ref is None:
        raise _err("NVML_ERROR_INVALID_ARGUMENT")
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    raise _err("NVML_ERROR_INVALID_ARGUMENT")


class FakeNvml:
    """A pynvml stand-in for ``devices`` (SKU names or aliases from hardware/skus.py)."""

    NVMLError = NVMLError

    def __init__(
        self,
        devices: Sequence[str] = ("a100-40gb",),
        *,
        driver_loaded: bool = True,
        library_found: bool = True,
        privileged: bool = True,
        legacy_driver: bool = False,
        report_profile_names: bool = True,
        driver_version: str = "550.54.15",
    ) -> None:
        self.devices = [make_device(i, name) for i, name in enumerate(devices)]
        self.driver_loaded = driver_loaded
        self.library_found = library_found
        self.privileged = privileged
        self.legacy_driver = legacy_driver  # no nvmlDeviceGetCurrentClocksEventReasons yet
        self.report_profile_names = report_profile_names  # v2 info.name filled in
        self.driver_version = driver_version
        self.calls: list[str] = []
        self.fail_next: dict[str, int] = {}  # function name -> NVML error code, once
        self._init_count = 0
        self._objects: dict[int, Any] = {}  # handle address -> object
        self._buffers: list[Any] = []  # keep the handle memory alive
        self._event_sets: list[_EventSet] = []
        self._next_gi_id = 1
        for d in self.devices:
            d.handle = self._new_handle(_real.c_nvmlDevice_t, d)

    # -- attribute fallback: constants and structs like the module has -------------------
    def __getattr__(self, name: str) -> Any:
        if name in CONSTANTS:
            return CONSTANTS[name]
        if name in STRUCTS:
            return STRUCTS[name]
        raise AttributeError(f"fake pynvml has no {name!r}")

    # -- test controls ---------------------------------------------------------------------
    def device(self, index: int) -> FakeDevice:
        return self.devices[index]

    def lose_gpu(self, index: int) -> None:
        """The GPU falls off the bus (XID 79): every call on it now fails GPU_IS_LOST."""
        self.devices[index].lost = True

    def inject_xid(self, index: int, xid: int) -> None:
        """A critical XID on a device, delivered to every event set registered for it."""
        d = self.devices[index]
        mask = _C["nvmlEventTypeXidCriticalError"]
        for es in self._event_sets:
            if es.registered.get(index, 0) & mask:
                es.queue.append((d, mask, xid))

    def reset_gpu(self, index: int) -> None:
        """A GPU reset applies a pending MIG mode."""
        d = self.devices[index]
        if d.gpu_instances and d.mig_pending != d.mig_current:
            raise _err("NVML_ERROR_IN_USE")
        d.mig_current = d.mig_pending

    def advance(self, seconds: float) -> None:
        """Let time pass: the energy counter grows by power x time."""
        for d in self.devices:
            d.energy_mj += int(d.power_mw * seconds)

    # -- handles ---------------------------------------------------------------------------
    def _new_handle(self, ptr_type: Any, obj: Any) -> Any:
        buf = ctypes.create_string_buffer(8)
        self._buffers.append(buf)
        self._objects[ctypes.addressof(buf)] = obj
        return ctypes.cast(buf, ptr_type)

    def _drop_handle(self, handle: Any) -> None:
        self._objects.pop(ctypes.cast(handle, ctypes.c_void_p).value or 0, None)

    def _resolve(self, handle: Any, ptr_type: Any, kinds: tuple[type, ...]) -> Any:
        if not isinstance(handle, ptr_type) or not handle:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        obj = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if not isinstance(obj, kinds):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        owner = obj if isinstance(obj, FakeDevice) else self._owner(obj)
        if owner.lost:
            raise _err("NVML_ERROR_GPU_IS_LOST")
        return obj

    @staticmethod
    def _owner(obj: Any) -> FakeDevice:
        if isinstance(obj, _MigDevice):
            return obj.ci.gi.device
        if isinstance(obj, ComputeInstance):
            return obj.gi.device
        if isinstance(obj, GpuInstance):
            return obj.device
        return obj

    def _dev(self, handle: Any) -> FakeDevice:
        return self._resolve(handle, _real.c_nvmlDevice_t, (FakeDevice,))

    def _dev_or_mig(self, handle: Any) -> FakeDevice | _MigDevice:
        return self._resolve(handle, _real.c_nvmlDevice_t, (FakeDevice, _MigDevice))

    def _gi(self, handle: Any) -> GpuInstance:
        return self._resolve(handle, _real.c_nvmlGpuInstance_t, (GpuInstance,))

    def _ci(self, handle: Any) -> ComputeInstance:
        return self._resolve(handle, _real.c_nvmlComputeInstance_t, (ComputeInstance,))

    def _privileged(self) -> None:
        if not self.privileged:
            raise _err("NVML_ERROR_NO_PERMISSION")

    # -- library ---------------------------------------------------------------------------
    @_api(check_init=False)
    def nvmlInit(self) -> None:
        if not self.library_found:
            raise _err("NVML_ERROR_LIBRARY_NOT_FOUND")
        if not self.driver_loaded:
            raise _err("NVML_ERROR_DRIVER_NOT_LOADED")
        self._init_count += 1

    @_api()
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @_api(check_init=False)
    def nvmlErrorString(self, result: int) -> str:
        return nvmlErrorString(result)

    @_api()
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    # -- devices ---------------------------------------------------------------------------
    @_api()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    @_api()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.devices):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        d = self.devices[index]
        if d.lost:
            raise _err("NVML_ERROR_GPU_IS_LOST")
        return d.handle

    @_api()
    def nvmlDeviceGetName(self, handle: Any) -> str:
        obj = self._dev_or_mig(handle)
        if isinstance(obj, _MigDevice):
            return f"{obj.ci.gi.device.spec.name} MIG {obj.ci.gi.profile.name}"
        return obj.spec.name

    @_api()
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        obj = self._dev_or_mig(handle)
        return obj.ci.uuid if isinstance(obj, _MigDevice) else obj.uuid

    @_api()
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        d = self._dev(handle)
        info = _real.nvmlPciInfo_t()
        info.busId = d.bus_id.encode()
        info.busIdLegacy = d.bus_id.encode()
        info.bus = 0x10 + d.index
        info.pciDeviceId = int(d.spec.pci_device_id or "0x0", 16)
        info.pciSubSystemId = 0x145F10DE
        return info

    @_api()
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        obj = self._dev_or_mig(handle)
        mem = _real.c_nvmlMemory_t()
        if isinstance(obj, _MigDevice):
            mem.total = obj.ci.gi.profile.memory_mb * 1024 * 1024
            mem.used = 0
        else:
            mem.total = obj.memory_total_mb * 1024 * 1024
            mem.used = obj.memory_used_mb * 1024 * 1024
        mem.free = mem.total - mem.used
        return mem

    # -- MIG mode --------------------------------------------------------------------------
    @_api()
    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        d = self._dev(device)
        if not d.mig_capable:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        return [d.mig_current, d.mig_pending]

    @_api()
    def nvmlDeviceSetMigMode(self, device: Any, mode: int) -> int:
        d = self._dev(device)
        if not d.mig_capable:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        if mode not in (_C["NVML_DEVICE_MIG_DISABLE"], _C["NVML_DEVICE_MIG_ENABLE"]):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        self._privileged()
        if d.gpu_instances:
            raise _err("NVML_ERROR_IN_USE")
        d.mig_pending = mode
        if d.mig_needs_reset:
            return _C["NVML_ERROR_RESET_REQUIRED"]
        d.mig_current = mode
        return _C["NVML_SUCCESS"]

    def _mig_enabled(self, d: FakeDevice) -> None:
        if not d.mig_capable or d.mig_current != _C["NVML_DEVICE_MIG_ENABLE"]:
            raise _err("NVML_ERROR_NOT_SUPPORTED")

    def _profile(self, d: FakeDevice, profile_id: int) -> GiProfile:
        self._mig_enabled(d)
        p = d.profile_by_id(profile_id)
        if p is None:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return p

    # -- GPU instance profiles and placements ----------------------------------------------
    @_api()
    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        d = self._dev(device)
        # NVML: NOT_SUPPORTED "if device doesn't have MIG mode enabled or profile isn't
        # supported"; an enum outside the NVML_GPU_INSTANCE_PROFILE_* range is invalid.
        self._mig_enabled(d)
        if not 0 <= profile < _C["NVML_GPU_INSTANCE_PROFILE_COUNT"]:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        p = next((x for x in d.profiles if x.enum == profile), None)
        if p is None:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        if version == 2:
            info = _real.c_nvmlGpuInstanceProfileInfo_v2_t()
            if self.report_profile_names:
                info.name = f"MIG {p.name}".encode()
        elif version == 1:
            info = _real.c_nvmlGpuInstanceProfileInfo_t()
        else:
            raise _err("NVML_ERROR_FUNCTION_NOT_FOUND")
        info.id = p.id
        info.isP2pSupported = 0
        info.sliceCount = p.compute_slices
        info.instanceCount = p.instance_count
        info.multiprocessorCount = 14 * p.compute_slices
        info.copyEngineCount = p.compute_slices
        info.memorySizeMB = p.memory_mb
        return info

    @_api()
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: Any, profileId: int, placementsRef: Any, countRef: Any
    ) -> int:
        d = self._dev(device)
        p = self._profile(d, profileId)
        count = _out(countRef)
        if placementsRef is None:  # the documented size query
            count.value = len(p.starts)
            return _C["NVML_SUCCESS"]
        if (
            not isinstance(placementsRef, ctypes.Array)
            or placementsRef._type_ is not _real.c_nvmlGpuInstancePlacement_t
        ):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if len(placementsRef) < len(p.starts):
            count.value = len(p.starts)
            raise _err("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, s in enumerate(p.starts):
            placementsRef[i].start = s
            placementsRef[i].size = p.memory_slices
        count.value = len(p.starts)
        return _C["NVML_SUCCESS"]

    def _used_slices(self, d: FakeDevice) -> list[bool]:
        used = [False] * MIG_MEMORY_SLICES
        for gi in d.gpu_instances.values():
            for s in range(gi.start, gi.start + gi.profile.memory_slices):
                used[s] = True
        return used

    def _compute_used(self, d: FakeDevice) -> int:
        return sum(gi.profile.compute_slices for gi in d.gpu_instances.values())

    def _count_of(self, d: FakeDevice, p: GiProfile) -> int:
        return sum(1 for gi in d.gpu_instances.values() if gi.profile.id == p.id)

    @_api()
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        d = self._dev(device)
        p = self._profile(d, profileId)
        used = self._used_slices(d)
        compute_left = MIG_COMPUTE_SLICES - self._compute_used(d)
        left = p.instance_count - self._count_of(d, p)
        n = 0
        for s in p.starts:
            if n >= left or compute_left < p.compute_slices:
                break
            if s + p.memory_slices <= MIG_MEMORY_SLICES and not any(used[s : s + p.memory_slices]):
                for k in range(s, s + p.memory_slices):
                    used[k] = True
                compute_left -= p.compute_slices
                n += 1
        return n

    def _create_gi(self, d: FakeDevice, p: GiProfile, start: int) -> Any:
        if d.mig_pending != d.mig_current:
            raise _err("NVML_ERROR_INVALID_STATE")
        self._privileged()
        used = self._used_slices(d)
        if (
            self._count_of(d, p) >= p.instance_count
            or self._compute_used(d) + p.compute_slices > MIG_COMPUTE_SLICES
            or any(used[start : start + p.memory_slices])
        ):
            raise _err("NVML_ERROR_INSUFFICIENT_RESOURCES")
        gi = GpuInstance(id=self._next_gi_id, profile=p, start=start, device=d)
        self._next_gi_id += 1
        gi.handle = self._new_handle(_real.c_nvmlGpuInstance_t, gi)
        d.gpu_instances[gi.id] = gi
        return gi.handle

    @_api()
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: Any, profileId: int, placement: Any
    ) -> Any:
        d = self._dev(device)
        p = self._profile(d, profileId)
        # The C function takes a pointer: a struct passed by value is garbage to it.
        pl = _out(placement) if placement is not None else None
        if not isinstance(pl, _real.c_nvmlGpuInstancePlacement_t):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if pl.start not in p.starts or pl.size != p.memory_slices:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return self._create_gi(d, p, pl.start)

    @_api()
    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        d = self._dev(device)
        p = self._profile(d, profileId)
        used = self._used_slices(d)
        for s in p.starts:
            if not any(used[s : s + p.memory_slices]):
                return self._create_gi(d, p, s)
        raise _err("NVML_ERROR_INSUFFICIENT_RESOURCES")

    @_api()
    def nvmlDeviceGetGpuInstances(
        self, device: Any, profileId: int, gpuInstancesRef: Any, countRef: Any
    ) -> int:
        d = self._dev(device)
        p = self._profile(d, profileId)
        count = _out(countRef)
        gis = sorted(
            (gi for gi in d.gpu_instances.values() if gi.profile.id == p.id), key=lambda g: g.id
        )
        if (
            not isinstance(gpuInstancesRef, ctypes.Array)
            or gpuInstancesRef._type_ is not _real.c_nvmlGpuInstance_t
        ):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if len(gpuInstancesRef) < len(gis):
            count.value = len(gis)
            raise _err("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, gi in enumerate(gis):
            gpuInstancesRef[i] = gi.handle
        count.value = len(gis)
        return _C["NVML_SUCCESS"]

    @_api()
    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        d = self._dev(device)
        self._mig_enabled(d)
        gi = d.gpu_instances.get(gpuInstanceId)
        if gi is None:
            raise _err("NVML_ERROR_NOT_FOUND")
        return gi.handle

    @_api()
    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gi = self._gi(gpuInstance)
        info = _real.c_nvmlGpuInstanceInfo_t()
        info.device = gi.device.handle
        info.id = gi.id
        info.profileId = gi.profile.id
        info.placement.start = gi.start
        info.placement.size = gi.profile.memory_slices
        return info

    @_api()
    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> int:
        gi = self._gi(gpuInstance)
        self._privileged()
        if gi.cis:
            raise _err("NVML_ERROR_IN_USE")
        del gi.device.gpu_instances[gi.id]
        self._drop_handle(gi.handle)
        return _C["NVML_SUCCESS"]

    # -- compute instances -----------------------------------------------------------------
    @staticmethod
    def _ci_slices_for(gi: GpuInstance, profile: int) -> int | None:
        slices = next((s for s, e in _CI_ENUM_BY_SLICES.items() if e == profile), None)
        g = gi.profile.compute_slices
        # CI sizes a GI offers: up to its own size; 3-slice CIs only on 3g and 7g GIs.
        if slices is None or slices > g or slices in (6, 8) or (slices == 3 and g not in (3, 7)):
            return None
        return slices

    @_api()
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: Any, profile: int, engProfile: int, version: int = 2
    ) -> Any:
        gi = self._gi(device)  # pynvml names it "device"; it is a GPU-instance handle
        if not 0 <= profile < _C["NVML_COMPUTE_INSTANCE_PROFILE_COUNT"]:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if engProfile != _C["NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"]:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        slices = self._ci_slices_for(gi, profile)
        if slices is None:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        if version == 2:
            info = _real.c_nvmlComputeInstanceProfileInfo_v2_t()
            info.name = f"MIG {slices}c.{gi.profile.name}".encode()
        elif version == 1:
            info = _real.c_nvmlComputeInstanceProfileInfo_t()
        else:
            raise _err("NVML_ERROR_FUNCTION_NOT_FOUND")
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

    @_api()
    def nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
        self, gpuInstance: Any, profileId: int
    ) -> int:
        gi = self._gi(gpuInstance)
        slices = self._ci_slices_for(gi, profileId)
        if slices is None:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        left = gi.profile.compute_slices - sum(ci.slices for ci in gi.cis.values())
        return left // slices

    @_api()
    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        gi = self._gi(gpuInstance)
        slices = self._ci_slices_for(gi, profileId)
        if slices is None:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        self._privileged()
        start = self._ci_free_start(gi, slices)
        if start is None:
            raise _err("NVML_ERROR_INSUFFICIENT_RESOURCES")
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
        ci.mig_handle = self._new_handle(_real.c_nvmlDevice_t, _MigDevice(ci))
        gi.cis[ci_id] = ci
        return ci.handle

    @_api()
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: Any, profileId: int, computeInstancesRef: Any, countRef: Any
    ) -> int:
        gi = self._gi(gpuInstance)
        if self._ci_slices_for(gi, profileId) is None:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        count = _out(countRef)
        cis = sorted((c for c in gi.cis.values() if c.profile_id == profileId), key=lambda c: c.id)
        if (
            not isinstance(computeInstancesRef, ctypes.Array)
            or computeInstancesRef._type_ is not _real.c_nvmlComputeInstance_t
        ):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if len(computeInstancesRef) < len(cis):
            count.value = len(cis)
            raise _err("NVML_ERROR_INSUFFICIENT_SIZE")
        for i, ci in enumerate(cis):
            computeInstancesRef[i] = ci.handle
        count.value = len(cis)
        return _C["NVML_SUCCESS"]

    @_api()
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

    @_api()
    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> int:
        ci = self._ci(computeInstance)
        self._privileged()
        del ci.gi.cis[ci.id]
        self._drop_handle(ci.handle)
        self._drop_handle(ci.mig_handle)
        return _C["NVML_SUCCESS"]

    # -- MIG devices -----------------------------------------------------------------------
    def _mig_devices(self, d: FakeDevice) -> list[ComputeInstance]:
        return [
            ci
            for gi in sorted(d.gpu_instances.values(), key=lambda g: g.id)
            for ci in sorted(gi.cis.values(), key=lambda c: c.id)
        ]

    @_api()
    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        d = self._dev(device)
        return MIG_COMPUTE_SLICES if d.mig_capable else 0

    @_api()
    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        d = self._dev(device)
        self._mig_enabled(d)
        if not 0 <= index < MIG_COMPUTE_SLICES:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        migs = self._mig_devices(d)
        if index >= len(migs):
            raise _err("NVML_ERROR_NOT_FOUND")
        return migs[index].mig_handle

    @_api()
    def nvmlDeviceIsMigDeviceHandle(self, device: Any) -> Any:
        return ctypes.c_uint(int(isinstance(self._dev_or_mig(device), _MigDevice)))

    @_api()
    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        obj = self._dev_or_mig(device)
        if not isinstance(obj, _MigDevice):
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        return obj.ci.gi.id

    @_api()
    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        obj = self._dev_or_mig(device)
        if not isinstance(obj, _MigDevice):
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        return obj.ci.id

    @_api()
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: Any) -> Any:
        obj = self._dev_or_mig(migDevice)
        if not isinstance(obj, _MigDevice):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return obj.ci.gi.device.handle

    # -- telemetry -------------------------------------------------------------------------
    @_api()
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        d = self._dev(handle)
        if sensor != _C["NVML_TEMPERATURE_GPU"]:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return d.temperature_c

    @_api()
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle).power_mw

    @_api()
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._dev(handle).energy_mj

    @_api()
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        d = self._dev(handle)
        # With MIG on, the parent GPU reports no utilization (nvidia-smi shows N/A).
        if d.mig_current == _C["NVML_DEVICE_MIG_ENABLE"]:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        u = _real.c_nvmlUtilization_t()
        u.gpu = d.utilization_gpu_pct
        u.memory = 0
        return u

    @_api()
    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        d = self._dev(handle)
        return [int(d.ecc_enabled), int(d.ecc_enabled)]

    @_api()
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        d = self._dev(handle)
        if not d.ecc_enabled:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        if errorType not in (0, 1):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        if counterType == _C["NVML_VOLATILE_ECC"]:
            return d.ecc_volatile[errorType]
        if counterType == _C["NVML_AGGREGATE_ECC"]:
            return d.ecc_aggregate[errorType]
        raise _err("NVML_ERROR_INVALID_ARGUMENT")

    @_api()
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        d = self._dev(device)
        if d.row_remapping:  # A100 and newer remap rows instead of retiring pages
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        if sourceFilter not in d.retired_pages:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return list(d.retired_pages[sourceFilter])

    @_api()
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        d = self._dev(device)
        if not d.row_remapping:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        return d.remapped_rows

    @_api()
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        if self.legacy_driver:  # pynvml raises this when the symbol is missing
            raise _err("NVML_ERROR_FUNCTION_NOT_FOUND")
        return self._dev(handle).clock_event_reasons

    @_api()
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._dev(handle).clock_event_reasons

    # -- events ----------------------------------------------------------------------------
    @_api()
    def nvmlEventSetCreate(self) -> Any:
        es = _EventSet()
        es.handle = self._new_handle(_real.c_nvmlEventSet_t, es)
        self._event_sets.append(es)
        return es.handle

    def _event_set(self, handle: Any) -> _EventSet:
        if not isinstance(handle, _real.c_nvmlEventSet_t) or not handle:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        es = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if not isinstance(es, _EventSet):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        return es

    @_api()
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        d = self._dev(handle)
        es = self._event_set(eventSet)
        supported = (
            _C["nvmlEventTypeXidCriticalError"]
            | _C["nvmlEventTypeSingleBitEccError"]
            | _C["nvmlEventTypeDoubleBitEccError"]
        )
        if eventTypes & ~supported:
            raise _err("NVML_ERROR_NOT_SUPPORTED")
        es.registered[d.index] = es.registered.get(d.index, 0) | eventTypes

    @_api()
    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        es = self._event_set(eventSet)
        if not es.queue:
            raise _err("NVML_ERROR_TIMEOUT")
        d, etype, xid = es.queue.pop(0)
        data = _real.c_nvmlEventData_t()
        data.device = d.handle
        data.eventType = etype
        data.eventData = xid
        data.gpuInstanceId = _UINT_MAX
        data.computeInstanceId = _UINT_MAX
        return data

    @_api()
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        es = self._event_set(eventSet)
        self._event_sets.remove(es)
        self._drop_handle(es.handle)

    # -- clocks ----------------------------------------------------------------------------
    @_api()
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (_C["NVML_CLOCK_SM"], _C["NVML_CLOCK_GRAPHICS"]):
            return d.sm_clock_mhz
        if type == _C["NVML_CLOCK_MEM"]:
            return d.mem_clock_mhz
        raise _err("NVML_ERROR_INVALID_ARGUMENT")

    @_api()
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (_C["NVML_CLOCK_SM"], _C["NVML_CLOCK_GRAPHICS"]):
            return d.spec.sm_clock_max_mhz
        if type == _C["NVML_CLOCK_MEM"]:
            return d.spec.mem_clock_mhz
        raise _err("NVML_ERROR_INVALID_ARGUMENT")

    @_api()
    def nvmlDeviceGetApplicationsClock(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (_C["NVML_CLOCK_SM"], _C["NVML_CLOCK_GRAPHICS"]):
            return d.app_sm_clock_mhz
        if type == _C["NVML_CLOCK_MEM"]:
            return d.app_mem_clock_mhz
        raise _err("NVML_ERROR_INVALID_ARGUMENT")

    @_api()
    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return [self._dev(handle).spec.mem_clock_mhz]

    @_api()
    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        d = self._dev(handle)
        if memoryClockMHz != d.spec.mem_clock_mhz:
            raise _err("NVML_ERROR_NOT_FOUND")
        return list(d.graphics_clocks_mhz)

    @_api()
    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        d = self._dev(handle)
        self._privileged()
        lo, hi = min(d.graphics_clocks_mhz), max(d.graphics_clocks_mhz)
        if minGpuClockMHz > maxGpuClockMHz or minGpuClockMHz < lo or maxGpuClockMHz > hi:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        d.locked_clocks_mhz = (minGpuClockMHz, maxGpuClockMHz)
        d.sm_clock_mhz = min(max(d.sm_clock_mhz, minGpuClockMHz), maxGpuClockMHz)

    @_api()
    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        d = self._dev(handle)
        self._privileged()
        d.locked_clocks_mhz = None

    @_api()
    def nvmlDeviceSetApplicationsClocks(
        self, handle: Any, maxMemClockMHz: int, maxGraphicsClockMHz: int
    ) -> None:
        d = self._dev(handle)
        self._privileged()
        if (
            maxMemClockMHz != d.spec.mem_clock_mhz
            or maxGraphicsClockMHz not in d.graphics_clocks_mhz
        ):
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        d.app_mem_clock_mhz = maxMemClockMHz
        d.app_sm_clock_mhz = maxGraphicsClockMHz

    # -- power -----------------------------------------------------------------------------
    @_api()
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        d = self._dev(handle)
        return [d.power_min_limit_mw, d.power_max_limit_mw]

    @_api()
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._dev(handle).power_default_limit_mw

    @_api()
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._dev(handle).power_limit_mw

    @_api()
    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        d = self._dev(handle)
        self._privileged()
        if not d.power_min_limit_mw <= limit <= d.power_max_limit_mw:
            raise _err("NVML_ERROR_INVALID_ARGUMENT")
        d.power_limit_mw = limit


def api_names() -> list[str]:
    """Names of the pynvml functions the fake implements (for the signature test)."""
    return sorted(n for n, v in vars(FakeNvml).items() if getattr(v, "nvml_api", False))
