"""NVML's library-level calls: import, init/shutdown, device count, driver, event sets.

pynvml is imported lazily, so this package imports on machines without it or a driver.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from gpuflow.hardware.backend import DeviceInfo, HardwareError
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.errors import nvml_call, optional


def import_pynvml() -> Any:
    try:
        import pynvml
    except ImportError as e:  # pragma: no cover - nvidia-ml-py is a dependency
        raise HardwareError(f"nvidia-ml-py (module pynvml) is not installed: {e}") from e
    return pynvml


class NvmlSession:
    """The calls on the pynvml module itself, not on a device; ``where`` names the host."""

    def __init__(self, nvml: Any, where: str) -> None:
        self.nvml = nvml
        self.where = where

    @nvml_call("starting NVML")
    def init(self) -> None:
        self.nvml.nvmlInit()

    @nvml_call("shutting NVML down")
    def shutdown(self) -> None:
        self.nvml.nvmlShutdown()

    @nvml_call("counting GPUs")
    def device_count(self) -> int:
        return int(self.nvml.nvmlDeviceGetCount())

    @nvml_call("reading the driver version")
    def driver_version(self) -> str:
        return str(self.nvml.nvmlSystemGetDriverVersion())

    @nvml_call("creating an event set")
    def create_event_set(self) -> Any:
        return self.nvml.nvmlEventSetCreate()

    @nvml_call("waiting for an event")
    def wait_event(self, event_set: Any, timeout_ms: int) -> Any:
        """The next event's data; NvmlTimeoutError when none came within ``timeout_ms``."""
        return self.nvml.nvmlEventSetWait(event_set, timeout_ms)

    @nvml_call("freeing an event set")
    def free_event_set(self, event_set: Any) -> None:
        self.nvml.nvmlEventSetFree(event_set)


def probe(nvml: Any | None = None) -> tuple[bool, str]:
    """(True, what answered) when an NVIDIA driver answers NVML, else (False, why)."""
    try:
        session = NvmlSession(nvml if nvml is not None else import_pynvml(), socket.gethostname())
        session.init()  # its HardwareError quotes NVML ("Driver Not Loaded", ...)
    except HardwareError as e:
        return False, str(e)
    except OSError as e:  # the library loaded but could not run
        return False, f"nvmlInit failed: {e}"
    try:
        count = session.device_count()
        driver = session.driver_version()
    except HardwareError as e:
        return False, f"NVML initialised but could not list GPUs: {e}"
    finally:
        with contextlib.suppress(HardwareError):
            session.shutdown()
    if count == 0:
        return False, f"NVML (driver {driver}) sees no GPU"
    return True, f"NVML driver {driver} sees {count} GPU(s)"


def describe(dev: NvmlDevice) -> DeviceInfo:
    """The DeviceInfo of one GPU (MIG listed when NVML reports a MIG mode for it)."""
    return DeviceInfo(
        node=dev.node,
        index=dev.index,
        vendor="NVIDIA",
        sku=dev.name(),
        uuid=dev.uuid(),
        memory_total_mb=dev.memory_total_mb(),
        pci_device_id=f"0x{dev.pci_device_id():08X}",
        partition_kinds=("mig",) if optional(None, dev.mig_mode_enabled) is not None else (),
    )
