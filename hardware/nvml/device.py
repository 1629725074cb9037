"""One NVIDIA GPU as thin, typed NVML calls (units in the names), like Zeus's NVIDIAGPU.

Each method is one NVML function called directly on the pynvml module, under
``@nvml_call`` so its errors arrive as HardwareErrors. The logic above (MIG layouts,
telemetry samples, clock/power validation) lives in mig.py, telemetry.py and control.py.
"""

from __future__ import annotations

import ctypes
from typing import Any

from gpuflow.hardware.nvml.errors import nvml_call

_MIB = 1024 * 1024


class NvmlDevice:
    """The GPU at NVML ``index``; opening it asks NVML for its handle."""

    def __init__(self, nvml: Any, node: str, index: int) -> None:
        self.nvml = nvml
        self.node = node
        self.index = index
        self.where = f"{node}:{index}"
        self.handle: Any = None
        self.handle = self._handle_by_index()

    @nvml_call("opening the GPU")
    def _handle_by_index(self) -> Any:
        return self.nvml.nvmlDeviceGetHandleByIndex(self.index)

    # -- identity --------------------------------------------------------------------
    @nvml_call("reading the name")
    def name(self) -> str:
        return str(self.nvml.nvmlDeviceGetName(self.handle))

    @nvml_call("reading the UUID")
    def uuid(self) -> str:
        return str(self.nvml.nvmlDeviceGetUUID(self.handle))

    @nvml_call("reading the PCI info")
    def pci_device_id(self) -> int:
        """The PCI device id with the vendor in its low half (0x20B010DE: A100-SXM4-40GB)."""
        return int(self.nvml.nvmlDeviceGetPciInfo(self.handle).pciDeviceId)

    @nvml_call("reading the PCI info")
    def pci_bus_id(self) -> str:
        """The PCI bus id as nvidia-smi takes it ("00000000:07:00.0")."""
        raw = self.nvml.nvmlDeviceGetPciInfo(self.handle).busId
        return (raw.decode() if isinstance(raw, bytes) else str(raw)).strip("\x00")

    @nvml_call("listing compute processes")
    def compute_processes(self) -> list[tuple[int, int | None]]:
        """(pid, memory used in MiB or None) of every compute process on the GPU or its
        MIG instances (NVML lists a MIG device's processes under its parent GPU)."""
        out = []
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            used = getattr(p, "usedGpuMemory", None)
            # NVML_VALUE_NOT_AVAILABLE (2**64 - 1) where the driver cannot tell (in a VM).
            mib = None if used is None or used >= (1 << 63) else int(used) // _MIB
            out.append((int(p.pid), mib))
        return out

    @nvml_call("reading a process name")
    def process_name(self, pid: int) -> str:
        raw = self.nvml.nvmlSystemGetProcessName(pid)
        return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)

    @nvml_call("reading memory info")
    def memory_bytes(self) -> tuple[int, int]:
        """(used, total) bytes of device memory."""
        mem = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return int(mem.used), int(mem.total)

    def memory_total_mb(self) -> int:
        return self.memory_bytes()[1] // _MIB

    @nvml_call("reading an NVML status")
    def error_string(self, status: int) -> str:
        return str(self.nvml.nvmlErrorString(status))

    # -- telemetry -------------------------------------------------------------------
    @nvml_call("reading the temperature")
    def temperature_c(self) -> int:
        return int(self.nvml.nvmlDeviceGetTemperature(self.handle, self.nvml.NVML_TEMPERATURE_GPU))

    @nvml_call("reading power usage")
    def power_usage_mw(self) -> int:
        return int(self.nvml.nvmlDeviceGetPowerUsage(self.handle))

    @nvml_call("reading the energy counter")
    def energy_mj(self) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))

    @nvml_call("reading utilization")
    def utilization_gpu_pct(self) -> int:
        return int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)

    @nvml_call("reading ECC error counts")
    def total_ecc_errors(self, error_type: int, counter_type: int) -> int:
        return int(self.nvml.nvmlDeviceGetTotalEccErrors(self.handle, error_type, counter_type))

    @nvml_call("reading retired pages")
    def retired_pages(self, cause: int) -> list[int]:
        """Addresses of the pages retired for ``cause`` (NVML_PAGE_RETIREMENT_CAUSE_*)."""
        return [int(a) for a in self.nvml.nvmlDeviceGetRetiredPages(self.handle, cause)]

    @nvml_call("reading remapped rows")
    def remapped_rows(self) -> tuple[int, int, bool, bool]:
        """(correctable, uncorrectable, remapping pending, remapping failed)."""
        corr, unc, pending, failure = self.nvml.nvmlDeviceGetRemappedRows(self.handle)
        return int(corr), int(unc), bool(pending), bool(failure)

    @nvml_call("reading clock event reasons")
    def clocks_event_reasons_mask(self) -> int:
        return int(self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle))

    @nvml_call("reading clock throttle reasons")
    def clocks_throttle_reasons_mask(self) -> int:
        """The same bits under their pre-r535 name."""
        return int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))

    @nvml_call("registering for events")
    def register_events(self, event_types: int, event_set: Any) -> None:
        self.nvml.nvmlDeviceRegisterEvents(self.handle, event_types, event_set)

    # -- clocks ----------------------------------------------------------------------
    @nvml_call("reading the SM clock")
    def sm_clock_mhz(self) -> int:
        return int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))

    @nvml_call("reading the highest SM clock")
    def max_sm_clock_mhz(self) -> int:
        return int(self.nvml.nvmlDeviceGetMaxClockInfo(self.handle, self.nvml.NVML_CLOCK_SM))

    @nvml_call("reading the applications SM clock")
    def applications_sm_clock_mhz(self) -> int:
        clock = self.nvml.NVML_CLOCK_GRAPHICS
        return int(self.nvml.nvmlDeviceGetApplicationsClock(self.handle, clock))

    @nvml_call("reading the applications memory clock")
    def applications_mem_clock_mhz(self) -> int:
        clock = self.nvml.NVML_CLOCK_MEM
        return int(self.nvml.nvmlDeviceGetApplicationsClock(self.handle, clock))

    @nvml_call("reading supported memory clocks")
    def supported_memory_clocks_mhz(self) -> list[int]:
        return [int(c) for c in self.nvml.nvmlDeviceGetSupportedMemoryClocks(self.handle)]

    @nvml_call("reading supported graphics clocks")
    def supported_graphics_clocks_mhz(self, mem_clock_mhz: int) -> list[int]:
        clocks = self.nvml.nvmlDeviceGetSupportedGraphicsClocks(self.handle, mem_clock_mhz)
        return [int(c) for c in clocks]

    @nvml_call("locking clocks")
    def set_locked_clocks_mhz(self, min_mhz: int, max_mhz: int) -> None:
        self.nvml.nvmlDeviceSetGpuLockedClocks(self.handle, min_mhz, max_mhz)

    @nvml_call("resetting locked clocks")
    def reset_locked_clocks(self) -> None:
        self.nvml.nvmlDeviceResetGpuLockedClocks(self.handle)

    @nvml_call("setting applications clocks")
    def set_applications_clocks_mhz(self, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        self.nvml.nvmlDeviceSetApplicationsClocks(self.handle, mem_clock_mhz, sm_clock_mhz)

    # -- power -----------------------------------------------------------------------
    @nvml_call("reading the power limit")
    def power_limit_mw(self) -> int:
        return int(self.nvml.nvmlDeviceGetPowerManagementLimit(self.handle))

    @nvml_call("reading the power limit range")
    def power_limit_constraints_mw(self) -> tuple[int, int]:
        """(lowest, highest) power limit the GPU accepts."""
        lo, hi = self.nvml.nvmlDeviceGetPowerManagementLimitConstraints(self.handle)
        return int(lo), int(hi)

    @nvml_call("reading the default power limit")
    def default_power_limit_mw(self) -> int:
        return int(self.nvml.nvmlDeviceGetPowerManagementDefaultLimit(self.handle))

    @nvml_call("setting the power limit")
    def set_power_limit_mw(self, limit_mw: int) -> None:
        self.nvml.nvmlDeviceSetPowerManagementLimit(self.handle, limit_mw)

    # -- MIG mode --------------------------------------------------------------------
    @nvml_call("reading the MIG mode")
    def mig_mode_enabled(self) -> tuple[bool, bool]:
        """(current, pending): they differ while a change waits for a GPU reset."""
        current, pending = self.nvml.nvmlDeviceGetMigMode(self.handle)
        enable = self.nvml.NVML_DEVICE_MIG_ENABLE
        return current == enable, pending == enable

    @nvml_call("setting the MIG mode")
    def set_mig_mode(self, enabled: bool) -> int:
        """Ask for MIG on or off; returns NVML's activation status (0: applied now)."""
        mode = self.nvml.NVML_DEVICE_MIG_ENABLE if enabled else self.nvml.NVML_DEVICE_MIG_DISABLE
        return int(self.nvml.nvmlDeviceSetMigMode(self.handle, mode) or 0)

    # -- GPU instances ---------------------------------------------------------------
    @nvml_call("reading a GPU-instance profile")
    def gi_profile_info(self, enum: int) -> Any:
        """The v2 profile info (with the driver's name) for an NVML_GPU_INSTANCE_PROFILE_* enum."""
        return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, enum)

    @nvml_call("reading a GPU-instance profile (v1)")
    def gi_profile_info_v1(self, enum: int) -> Any:
        """The version-1 info, all that drivers without the versioned call answer."""
        return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(self.handle, enum, version=1)

    @nvml_call("listing GPU-instance placements")
    def gi_possible_placements(self, profile_id: int) -> list[tuple[int, int]]:
        """(start, size) in memory slices where a GI of ``profile_id`` may be created."""
        count = ctypes.c_uint(0)
        nvml = self.nvml
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            self.handle, profile_id, None, ctypes.byref(count)
        )  # the size query
        if count.value == 0:
            return []
        arr = (nvml.c_nvmlGpuInstancePlacement_t * count.value)()
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            self.handle, profile_id, arr, ctypes.byref(count)
        )
        return [(int(arr[i].start), int(arr[i].size)) for i in range(count.value)]

    @nvml_call("listing GPU instances")
    def gpu_instances(self, profile_id: int, capacity: int) -> list[Any]:
        """Handles of the GIs of ``profile_id`` (at most ``capacity``, its instance count)."""
        arr = (self.nvml.c_nvmlGpuInstance_t * capacity)()
        count = ctypes.c_uint(capacity)
        self.nvml.nvmlDeviceGetGpuInstances(self.handle, profile_id, arr, ctypes.byref(count))
        return [arr[k] for k in range(count.value)]

    @nvml_call("reading a GPU instance")
    def gi_info(self, gi: Any) -> Any:
        """The GI's info: ``id``, ``placement.start``, ``placement.size``."""
        return self.nvml.nvmlGpuInstanceGetInfo(gi)

    @nvml_call("creating a GPU instance")
    def create_gpu_instance(self, profile_id: int, start: int, size: int) -> Any:
        placement = self.nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, size
        return self.nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            self.handle, profile_id, ctypes.byref(placement)
        )

    @nvml_call("destroying a GPU instance")
    def destroy_gpu_instance(self, gi: Any) -> None:
        self.nvml.nvmlGpuInstanceDestroy(gi)

    # -- compute instances -----------------------------------------------------------
    @nvml_call("reading a compute-instance profile")
    def ci_profile_info(self, gi: Any, enum: int) -> Any:
        """Info of an NVML_COMPUTE_INSTANCE_PROFILE_* enum on a GI (shared engines)."""
        engine = int(getattr(self.nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
        return self.nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, enum, engine)

    @nvml_call("listing compute instances")
    def compute_instances(self, gi: Any, profile_id: int, capacity: int) -> list[Any]:
        arr = (self.nvml.c_nvmlComputeInstance_t * capacity)()
        count = ctypes.c_uint(capacity)
        self.nvml.nvmlGpuInstanceGetComputeInstances(gi, profile_id, arr, ctypes.byref(count))
        return [arr[k] for k in range(count.value)]

    @nvml_call("reading a compute instance")
    def ci_id(self, ci: Any) -> int:
        return int(self.nvml.nvmlComputeInstanceGetInfo(ci).id)

    @nvml_call("creating a compute instance")
    def create_compute_instance(self, gi: Any, profile_id: int) -> Any:
        return self.nvml.nvmlGpuInstanceCreateComputeInstance(gi, profile_id)

    @nvml_call("destroying a compute instance")
    def destroy_compute_instance(self, ci: Any) -> None:
        self.nvml.nvmlComputeInstanceDestroy(ci)

    # -- MIG devices -----------------------------------------------------------------
    @nvml_call("counting MIG device slots")
    def max_mig_device_count(self) -> int:
        return int(self.nvml.nvmlDeviceGetMaxMigDeviceCount(self.handle))

    @nvml_call("opening a MIG device")
    def mig_device_handle(self, slot: int) -> Any:
        """The MIG device in ``slot``; an empty slot is an NvmlNotFoundError."""
        return self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(self.handle, slot)

    @nvml_call("reading a MIG device's GPU instance")
    def mig_gi_id(self, mig: Any) -> int:
        return int(self.nvml.nvmlDeviceGetGpuInstanceId(mig))

    @nvml_call("reading a MIG device's compute instance")
    def mig_ci_id(self, mig: Any) -> int:
        return int(self.nvml.nvmlDeviceGetComputeInstanceId(mig))

    @nvml_call("reading a MIG device's UUID")
    def mig_uuid(self, mig: Any) -> str:
        return str(self.nvml.nvmlDeviceGetUUID(mig))
