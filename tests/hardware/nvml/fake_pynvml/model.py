"""The fake's model: NVML's constants and errors, the fake GPUs and their MIG state."""

from __future__ import annotations

import dataclasses
import functools
import uuid as _uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real
from gpuflow.hardware.skus import (
    MigGeometry,
    MigSlot,
    SkuSpec,
    build_mig_profiles,
    sku,
)

# Constants are taken from nvidia-ml-py itself so their values cannot drift from it.
_CONSTANT_PREFIXES = ("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason", "nvmlEventType")
CONSTANTS: dict[str, Any] = {
    n: getattr(_real, n) for n in dir(_real) if n.startswith(_CONSTANT_PREFIXES)
}

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

C = CONSTANTS  # short alias for the fake's calls

_ERROR_STRINGS = {
    C["NVML_SUCCESS"]: "Success",
    C["NVML_ERROR_UNINITIALIZED"]: "Uninitialized",
    C["NVML_ERROR_INVALID_ARGUMENT"]: "Invalid Argument",
    C["NVML_ERROR_NOT_SUPPORTED"]: "Not Supported",
    C["NVML_ERROR_NO_PERMISSION"]: "Insufficient Permissions",
    C["NVML_ERROR_NOT_FOUND"]: "Not Found",
    C["NVML_ERROR_INSUFFICIENT_SIZE"]: "Insufficient Size",
    C["NVML_ERROR_DRIVER_NOT_LOADED"]: "Driver Not Loaded",
    C["NVML_ERROR_TIMEOUT"]: "Timeout",
    C["NVML_ERROR_LIBRARY_NOT_FOUND"]: "NVML Shared Library Not Found",
    C["NVML_ERROR_FUNCTION_NOT_FOUND"]: "Function Not Found",
    C["NVML_ERROR_GPU_IS_LOST"]: "GPU is lost",
    C["NVML_ERROR_RESET_REQUIRED"]: "GPU requires restart",
    C["NVML_ERROR_IN_USE"]: "In use by another client",
    C["NVML_ERROR_INSUFFICIENT_RESOURCES"]: "Insufficient resources",
    C["NVML_ERROR_INVALID_STATE"]: "Invalid state",
    C["NVML_ERROR_UNKNOWN"]: "Unknown Error",
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

# GI profile memory (MiB, by profile id) that real cards report in `nvidia-smi mig -lgip`;
# other profiles get the 95 % estimate of _gi_profiles.
NVML_PROFILE_MEMORY_MB: dict[str, dict[int, int]] = {
    "NVIDIA A100-SXM4-40GB": {19: 4864, 20: 4864, 15: 9984, 14: 9984, 9: 20096, 5: 20096, 0: 40448},
    "NVIDIA H100 80GB HBM3": {
        19: 9984,
        20: 9984,
        15: 20096,
        14: 20096,
        9: 40448,
        5: 40448,
        0: 81152,
    },
    "NVIDIA A30": {14: 5952, 21: 5952, 5: 11968, 6: 11968, 0: 24000},
}


def _future_gpu() -> SkuSpec:
    """A made-up MIG GPU in no table (its name and PCI id are nowhere in hardware/skus.py
    or mig-parted's files), with its own geometry: 4 compute slices over 8 memory slices,
    profile ids no real card uses. Only what NVML reports can partition it.
    """
    geometry = MigGeometry(
        4,
        8,
        (
            MigSlot("1_SLICE", 30, 1, 2, 4, (0, 2, 4, 6)),
            MigSlot("1_SLICE_REV1", 31, 1, 2, 1, (0, 2, 4, 6)),
            MigSlot("2_SLICE", 32, 2, 4, 2, (0, 4)),
            MigSlot("4_SLICE", 33, 4, 8, 1, (0,)),
        ),
    )
    mem = 131072
    base = sku("h100")
    return dataclasses.replace(
        base,
        name="NVIDIA Future GPU",
        pci_device_id="0x2FF010DE",
        memory_total_mb=mem,
        mig_geometry=geometry,
        mig_profiles=build_mig_profiles(
            ("1g.32gb", "1g.32gb+me", "2g.64gb", "4g.128gb"), mem, geometry
        ),
    )


# Cards the fake models that hardware/skus.py does not know, by alias and by NVML name.
FAKE_ONLY_CARDS: dict[str, SkuSpec] = {}
for _card in (_future_gpu(),):
    FAKE_ONLY_CARDS[_card.name] = _card
FAKE_ONLY_CARDS["future-gpu"] = FAKE_ONLY_CARDS["NVIDIA Future GPU"]

# Compute-instance profile enum per slice count (NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE).
CI_ENUM_BY_SLICES = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
UINT_MAX = 0xFFFFFFFF


def nvml_error(code_name: str) -> NVMLError:
    return NVMLError(C[code_name])


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
    # What the profile info says, when a driver reports a wrong count (the A30's bug);
    # instance_count is what the GPU enforces.
    reported_instance_count: int | None = None


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
    compute_slices_total: int = 0  # the MIG geometry's slices (0 without MIG)
    memory_slices_total: int = 0
    mig_current: int = 0
    mig_pending: int = 0
    mig_needs_reset: bool = False  # True: a mode change waits for reset_gpu()
    processes: dict[int, str] = field(default_factory=dict)  # compute pid -> name
    holders: list[str] = field(default_factory=list)  # clients NVML does not list (DCGM)
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
class MigDevice:
    ci: ComputeInstance


@dataclass
class EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # device index -> event mask
    queue: list[tuple[FakeDevice, int, int]] = field(default_factory=list)
    handle: Any = None


def _gi_profiles(spec: SkuSpec, memory_total_mb: int) -> list[GiProfile]:
    geometry = spec.mig_geometry
    if not spec.mig_profiles or geometry is None:
        return []
    known = NVML_PROFILE_MEMORY_MB.get(spec.name, {})
    out = []
    for slot, p in zip(geometry.slots, spec.mig_profiles, strict=True):
        # NVML's instance memory is a little under slices x (total / memory slices): the
        # driver keeps some back. 95 % matches A100-40GB's 1g.5gb (4864 of 5120 MiB).
        estimate = int(p.placement_size * memory_total_mb / geometry.memory_slices * 0.95)
        memory_mb = known.get(p.profile_id, estimate)
        enum_name = slot.enum
        out.append(
            GiProfile(
                enum=C["NVML_GPU_INSTANCE_PROFILE_" + enum_name],
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
    spec = FAKE_ONLY_CARDS.get(sku_name) or sku(sku_name)
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
        compute_slices_total=spec.mig_geometry.compute_slices if spec.mig_geometry else 0,
        memory_slices_total=spec.mig_geometry.memory_slices if spec.mig_geometry else 0,
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


def api(check_init: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Record the call and, like NVML, refuse it before nvmlInit."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append(fn.__name__)
            if self.fail_next.get(fn.__name__):
                raise NVMLError(self.fail_next.pop(fn.__name__))
            if check_init and self._init_count == 0:
                raise nvml_error("NVML_ERROR_UNINITIALIZED")
            return fn(self, *args, **kwargs)

        wrapper.nvml_api = True  # type: ignore[attr-defined]
        return wrapper

    return deco


def deref(ref: Any) -> Any:
    """The ctypes object behind byref(x) or pointer(x)."""
    if ref is None:
        raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
