"""The fake's core: handles, test controls, library and device calls."""

from __future__ import annotations

import ctypes
import subprocess
from collections.abc import Sequence
from typing import Any

import pynvml as _real

from tests.hardware.nvml.fake_pynvml.model import (
    CONSTANTS,
    STRUCTS,
    C,
    ComputeInstance,
    EventSet,
    FakeDevice,
    GpuInstance,
    MigDevice,
    NVMLError,
    api,
    make_device,
    nvml_error,
    nvmlErrorString,
)


class FakeNvmlBase:
    """Devices, handles and the library calls; the mixins add the rest of the API."""

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
        profiles_with_mig_off: bool = True,
        driver_version: str = "550.54.15",
    ) -> None:
        self.devices = [make_device(i, name) for i, name in enumerate(devices)]
        self.driver_loaded = driver_loaded
        self.library_found = library_found
        self.privileged = privileged
        self.legacy_driver = legacy_driver  # no nvmlDeviceGetCurrentClocksEventReasons yet
        self.report_profile_names = report_profile_names  # v2 info.name filled in
        # v1 GI profile info with MIG mode off: drivers after R535 answer it, R535 does not
        self.profiles_with_mig_off = profiles_with_mig_off
        self.driver_version = driver_version
        self.calls: list[str] = []
        self.fail_next: dict[str, int] = {}  # function name -> NVML error code, once
        self._init_count = 0
        self._objects: dict[int, Any] = {}  # handle address -> object
        self._buffers: list[Any] = []  # keep the handle memory alive
        self._event_sets: list[EventSet] = []
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
        mask = C["nvmlEventTypeXidCriticalError"]
        for es in self._event_sets:
            if es.registered.get(index, 0) & mask:
                es.queue.append((d, mask, xid))

    def reset_gpu(self, index: int) -> None:
        """A GPU reset applies a pending MIG mode."""
        d = self.devices[index]
        if d.gpu_instances and d.mig_pending != d.mig_current:
            raise nvml_error("NVML_ERROR_IN_USE")
        d.mig_current = d.mig_pending

    def nvidia_smi(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """``nvidia-smi -r -i BUS[,BUS...]`` on these GPUs, as the real tool answers it:
        refused (exit 255, its wording) while a compute process or a client holds one,
        else every GPU reset: pending MIG modes applied, MIG instances gone."""
        self.calls.append("nvidia-smi " + " ".join(argv[1:]))
        if list(argv[:3]) != ["nvidia-smi", "-r", "-i"] or len(argv) != 4:
            return subprocess.CompletedProcess(list(argv), 2, "", "fake nvidia-smi: -r -i only\n")
        by_bus = {d.bus_id: d for d in self.devices}
        targets = [by_bus.get(b) for b in argv[3].split(",")]
        if any(t is None for t in targets):
            return subprocess.CompletedProcess(list(argv), 6, "No devices were found\n", "")
        busy = [d for d in targets if d is not None and (d.processes or d.holders)]
        if busy:
            lines = [f"GPU {d.bus_id} is currently in use by another process." for d in busy]
            lines.append(
                f"\n{len(busy)} device is currently being used by one or more other processes "
                "(e.g., Fabric Manager, CUDA application, graphics application such as an X "
                "server, or a monitoring application such as another instance of nvidia-smi). "
                "Please first kill all processes using this device and all compute "
                "applications running in the system."
            )
            return subprocess.CompletedProcess(list(argv), 255, "\n".join(lines) + "\n", "")
        for d in targets:
            assert d is not None
            d.gpu_instances.clear()
            d.mig_current = d.mig_pending
        out = "".join(f"GPU {d.bus_id} was successfully reset.\n" for d in targets if d)
        return subprocess.CompletedProcess(list(argv), 0, out + "All done.\n", "")

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
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        obj = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if not isinstance(obj, kinds):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        owner = obj if isinstance(obj, FakeDevice) else self._owner(obj)
        if owner.lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST")
        return obj

    @staticmethod
    def _owner(obj: Any) -> FakeDevice:
        if isinstance(obj, MigDevice):
            return obj.ci.gi.device
        if isinstance(obj, ComputeInstance):
            return obj.gi.device
        if isinstance(obj, GpuInstance):
            return obj.device
        return obj

    def _dev(self, handle: Any) -> FakeDevice:
        return self._resolve(handle, _real.c_nvmlDevice_t, (FakeDevice,))

    def _dev_or_mig(self, handle: Any) -> FakeDevice | MigDevice:
        return self._resolve(handle, _real.c_nvmlDevice_t, (FakeDevice, MigDevice))

    def _gi(self, handle: Any) -> GpuInstance:
        return self._resolve(handle, _real.c_nvmlGpuInstance_t, (GpuInstance,))

    def _ci(self, handle: Any) -> ComputeInstance:
        return self._resolve(handle, _real.c_nvmlComputeInstance_t, (ComputeInstance,))

    def _privileged(self) -> None:
        if not self.privileged:
            raise nvml_error("NVML_ERROR_NO_PERMISSION")

    # -- library ---------------------------------------------------------------------------
    @api(check_init=False)
    def nvmlInit(self) -> None:
        if not self.library_found:
            raise nvml_error("NVML_ERROR_LIBRARY_NOT_FOUND")
        if not self.driver_loaded:
            raise nvml_error("NVML_ERROR_DRIVER_NOT_LOADED")
        self._init_count += 1

    @api()
    def nvmlShutdown(self) -> None:
        self._init_count -= 1

    @api(check_init=False)
    def nvmlErrorString(self, result: int) -> str:
        return nvmlErrorString(result)

    @api()
    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver_version

    # -- devices ---------------------------------------------------------------------------
    @api()
    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    @api()
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        if not 0 <= index < len(self.devices):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        d = self.devices[index]
        if d.lost:
            raise nvml_error("NVML_ERROR_GPU_IS_LOST")
        return d.handle

    @api()
    def nvmlDeviceGetName(self, handle: Any) -> str:
        obj = self._dev_or_mig(handle)
        if isinstance(obj, MigDevice):
            return f"{obj.ci.gi.device.spec.name} MIG {obj.ci.gi.profile.name}"
        return obj.spec.name

    @api()
    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        obj = self._dev_or_mig(handle)
        return obj.ci.uuid if isinstance(obj, MigDevice) else obj.uuid

    @api()
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        d = self._dev(handle)
        info = _real.nvmlPciInfo_t()
        info.busId = d.bus_id.encode()
        info.busIdLegacy = d.bus_id.encode()
        info.bus = 0x10 + d.index
        info.pciDeviceId = int(d.spec.pci_device_id or "0x0", 16)
        info.pciSubSystemId = 0x145F10DE
        return info

    @api()
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        d = self._dev(handle)
        out = []
        for pid in d.processes:
            info = _real.c_nvmlProcessInfo_t()
            info.pid = pid
            info.usedGpuMemory = 512 * 1024 * 1024
            info.gpuInstanceId = info.computeInstanceId = 0xFFFFFFFF
            out.append(info)
        return out

    @api()
    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for d in self.devices:
            if pid in d.processes:
                return d.processes[pid]
        raise nvml_error("NVML_ERROR_NOT_FOUND")

    @api()
    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        obj = self._dev_or_mig(handle)
        mem = _real.c_nvmlMemory_t()
        if isinstance(obj, MigDevice):
            mem.total = obj.ci.gi.profile.memory_mb * 1024 * 1024
            mem.used = 0
        else:
            mem.total = obj.memory_total_mb * 1024 * 1024
            mem.used = obj.memory_used_mb * 1024 * 1024
        mem.free = mem.total - mem.used
        return mem
