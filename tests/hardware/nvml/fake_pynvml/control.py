"""The fake's clock and power calls."""

from __future__ import annotations

from typing import Any

from tests.hardware.nvml.fake_pynvml.base import FakeNvmlBase
from tests.hardware.nvml.fake_pynvml.model import (
    C,
    api,
    nvml_error,
)


class FakeControl(FakeNvmlBase):
    """Clocks and power limits."""

    # -- clocks ----------------------------------------------------------------------------
    @api()
    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (C["NVML_CLOCK_SM"], C["NVML_CLOCK_GRAPHICS"]):
            return d.sm_clock_mhz
        if type == C["NVML_CLOCK_MEM"]:
            return d.mem_clock_mhz
        raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")

    @api()
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (C["NVML_CLOCK_SM"], C["NVML_CLOCK_GRAPHICS"]):
            return d.spec.sm_clock_max_mhz
        if type == C["NVML_CLOCK_MEM"]:
            return d.spec.mem_clock_mhz
        raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")

    @api()
    def nvmlDeviceGetApplicationsClock(self, handle: Any, type: int) -> int:
        d = self._dev(handle)
        if type in (C["NVML_CLOCK_SM"], C["NVML_CLOCK_GRAPHICS"]):
            return d.app_sm_clock_mhz
        if type == C["NVML_CLOCK_MEM"]:
            return d.app_mem_clock_mhz
        raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")

    @api()
    def nvmlDeviceGetSupportedMemoryClocks(self, handle: Any) -> list[int]:
        return [self._dev(handle).spec.mem_clock_mhz]

    @api()
    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: Any, memoryClockMHz: int) -> list[int]:
        d = self._dev(handle)
        if memoryClockMHz != d.spec.mem_clock_mhz:
            raise nvml_error("NVML_ERROR_NOT_FOUND")
        return list(d.graphics_clocks_mhz)

    @api()
    def nvmlDeviceSetGpuLockedClocks(
        self, handle: Any, minGpuClockMHz: int, maxGpuClockMHz: int
    ) -> None:
        d = self._dev(handle)
        self._privileged()
        lo, hi = min(d.graphics_clocks_mhz), max(d.graphics_clocks_mhz)
        if minGpuClockMHz > maxGpuClockMHz or minGpuClockMHz < lo or maxGpuClockMHz > hi:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        d.locked_clocks_mhz = (minGpuClockMHz, maxGpuClockMHz)
        d.sm_clock_mhz = min(max(d.sm_clock_mhz, minGpuClockMHz), maxGpuClockMHz)

    @api()
    def nvmlDeviceResetGpuLockedClocks(self, handle: Any) -> None:
        d = self._dev(handle)
        self._privileged()
        d.locked_clocks_mhz = None

    @api()
    def nvmlDeviceSetApplicationsClocks(
        self, handle: Any, maxMemClockMHz: int, maxGraphicsClockMHz: int
    ) -> None:
        d = self._dev(handle)
        self._privileged()
        if (
            maxMemClockMHz != d.spec.mem_clock_mhz
            or maxGraphicsClockMHz not in d.graphics_clocks_mhz
        ):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        d.app_mem_clock_mhz = maxMemClockMHz
        d.app_sm_clock_mhz = maxGraphicsClockMHz

    # -- power -----------------------------------------------------------------------------
    @api()
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any) -> list[int]:
        d = self._dev(handle)
        return [d.power_min_limit_mw, d.power_max_limit_mw]

    @api()
    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        return self._dev(handle).power_default_limit_mw

    @api()
    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._dev(handle).power_limit_mw

    @api()
    def nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: int) -> None:
        d = self._dev(handle)
        self._privileged()
        if not d.power_min_limit_mw <= limit <= d.power_max_limit_mw:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        d.power_limit_mw = limit
