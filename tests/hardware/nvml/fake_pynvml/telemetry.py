"""The fake's telemetry and event calls."""

from __future__ import annotations

import ctypes
from typing import Any

import pynvml as _real

from tests.hardware.nvml.fake_pynvml.base import FakeNvmlBase
from tests.hardware.nvml.fake_pynvml.model import (
    UINT_MAX,
    C,
    EventSet,
    api,
    nvml_error,
)


class FakeTelemetry(FakeNvmlBase):
    """Telemetry fields and event sets."""

    # -- telemetry -------------------------------------------------------------------------
    @api()
    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        d = self._dev(handle)
        if sensor != C["NVML_TEMPERATURE_GPU"]:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return d.temperature_c

    @api()
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._dev(handle).power_mw

    @api()
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._dev(handle).energy_mj

    @api()
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        d = self._dev(handle)
        # With MIG on, the parent GPU reports no utilization (nvidia-smi shows N/A).
        if d.mig_current == C["NVML_DEVICE_MIG_ENABLE"]:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        u = _real.c_nvmlUtilization_t()
        u.gpu = d.utilization_gpu_pct
        u.memory = 0
        return u

    @api()
    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        d = self._dev(handle)
        return [int(d.ecc_enabled), int(d.ecc_enabled)]

    @api()
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        d = self._dev(handle)
        if not d.ecc_enabled:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if errorType not in (0, 1):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        if counterType == C["NVML_VOLATILE_ECC"]:
            return d.ecc_volatile[errorType]
        if counterType == C["NVML_AGGREGATE_ECC"]:
            return d.ecc_aggregate[errorType]
        raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")

    @api()
    def nvmlDeviceGetRetiredPages(self, device: Any, sourceFilter: int) -> list[int]:
        d = self._dev(device)
        if d.row_remapping:  # A100 and newer remap rows instead of retiring pages
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        if sourceFilter not in d.retired_pages:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return list(d.retired_pages[sourceFilter])

    @api()
    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        d = self._dev(device)
        if not d.row_remapping:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        return d.remapped_rows

    @api()
    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        if self.legacy_driver:  # pynvml raises this when the symbol is missing
            raise nvml_error("NVML_ERROR_FUNCTION_NOT_FOUND")
        return self._dev(handle).clock_event_reasons

    @api()
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._dev(handle).clock_event_reasons

    # -- events ----------------------------------------------------------------------------
    @api()
    def nvmlEventSetCreate(self) -> Any:
        es = EventSet()
        es.handle = self._new_handle(_real.c_nvmlEventSet_t, es)
        self._event_sets.append(es)
        return es.handle

    def _event_set(self, handle: Any) -> EventSet:
        if not isinstance(handle, _real.c_nvmlEventSet_t) or not handle:
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        es = self._objects.get(ctypes.cast(handle, ctypes.c_void_p).value or 0)
        if not isinstance(es, EventSet):
            raise nvml_error("NVML_ERROR_INVALID_ARGUMENT")
        return es

    @api()
    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        d = self._dev(handle)
        es = self._event_set(eventSet)
        # A test may set xid_events_supported=False on a device: a GPU (or a container
        # without the capability) on which NVML refuses to register events.
        if not getattr(d, "xid_events_supported", True):
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        supported = (
            C["nvmlEventTypeXidCriticalError"]
            | C["nvmlEventTypeSingleBitEccError"]
            | C["nvmlEventTypeDoubleBitEccError"]
        )
        if eventTypes & ~supported:
            raise nvml_error("NVML_ERROR_NOT_SUPPORTED")
        es.registered[d.index] = es.registered.get(d.index, 0) | eventTypes

    @api()
    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> Any:
        es = self._event_set(eventSet)
        if not es.queue:
            raise nvml_error("NVML_ERROR_TIMEOUT")
        d, etype, xid = es.queue.pop(0)
        data = _real.c_nvmlEventData_t()
        data.device = d.handle
        data.eventType = etype
        data.eventData = xid
        data.gpuInstanceId = UINT_MAX
        data.computeInstanceId = UINT_MAX
        return data

    @api()
    def nvmlEventSetFree(self, eventSet: Any) -> None:
        es = self._event_set(eventSet)
        self._event_sets.remove(es)
        self._drop_handle(es.handle)
