"""Telemetry of one GPU: the sample, ECC and memory health, clock events, XID events.

Which optional fields (hardware.backend.TELEMETRY_FIELDS) a GPU has is probed once per
device (``probe_fields``): what NVML answers NOT_SUPPORTED for (ECC counters with ECC off,
nvmlDeviceGetRemappedRows before Ampere, nvmlDeviceGetRetiredPages from Ampere on), and
XIDs when no event set could be registered, is None in every sample, not 0. Utilization
with MIG on reads 0 (nvidia-smi shows N/A). Any other NVML error propagates, and a lost
GPU (DeviceLostError) is turned into a ``present=False`` sample by the backend so a
monitor loop keeps going.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Literal

from gpuflow.hardware.backend import (
    CLOCK_EVENT_REASONS,
    HardwareError,
    TelemetrySample,
    UnsupportedError,
)
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.errors import NvmlFunctionNotFoundError, NvmlTimeoutError, optional
from gpuflow.hardware.nvml.session import NvmlSession
from gpuflow.hardware.telemetry_fields import (
    ECC_FIELDS,
    PAGE_RETIREMENT_FIELDS,
    ROW_REMAP_FIELDS,
)

log = logging.getLogger(__name__)

_MIB = 1024 * 1024

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

_XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError
_MAX_EVENTS_PER_DRAIN = 10_000  # a driver that never says TIMEOUT must not hang us

EccCounter = Literal["volatile", "aggregate"]


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """Names (hardware.backend.CLOCK_EVENT_REASONS) of the bits set in an NVML mask."""
    return tuple(name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit)


class XidEvents:
    """One NVML event set per GPU, registered for critical XIDs, drained by each sample."""

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._sets: dict[int, Any] = {}
        self._xid_bit = int(getattr(session.nvml, "nvmlEventTypeXidCriticalError", _XID_EVENT))

    def register(self, node: str, index: int) -> None:
        """Start collecting a GPU's XIDs; a GPU that cannot is logged and left out."""
        es = None
        where = f"{node}:{index}"
        try:
            dev = NvmlDevice(self._session.nvml, node, index)
            es = self._session.create_event_set()
            dev.register_events(self._xid_bit, es)
            self._sets[index] = es
        except HardwareError as e:
            log.info("%s: XID events unavailable: %s", where, e)
            if es is not None:
                self._free(es)

    def registered(self, index: int) -> bool:
        """Whether GPU ``index`` has an event set, i.e. whether its XIDs can be read."""
        return index in self._sets

    def drain(self, index: int) -> tuple[int, ...]:
        """The XIDs seen on GPU ``index`` since the last drain."""
        es = self._sets.get(index)
        if es is None:
            return ()
        xids = []
        for _ in range(_MAX_EVENTS_PER_DRAIN):
            try:
                data = self._session.wait_event(es, 0)
            except NvmlTimeoutError:  # nothing pending
                break
            except HardwareError as e:
                log.warning("%s:%d: reading XID events failed: %s", self._session.where, index, e)
                break
            if int(data.eventType) & self._xid_bit:
                xids.append(int(data.eventData))
        return tuple(xids)

    def close(self) -> None:
        for es in self._sets.values():
            self._free(es)
        self._sets.clear()

    def _free(self, es: Any) -> None:
        with contextlib.suppress(Exception):  # freeing is best effort, on the way out
            self._session.free_event_set(es)


def _clock_event_mask(dev: NvmlDevice) -> int | None:
    """The clock-event bits, None where the GPU cannot report them."""
    try:
        return dev.clocks_event_reasons_mask()
    except NvmlFunctionNotFoundError:
        # Drivers before r535 (and nvidia-ml-py before 12.535) only have the older name.
        return optional(None, dev.clocks_throttle_reasons_mask)
    except UnsupportedError:
        return None


def _ecc_totals(dev: NvmlDevice, counter: EccCounter) -> tuple[int | None, int | None]:
    nvml = dev.nvml
    kind = nvml.NVML_AGGREGATE_ECC if counter == "aggregate" else nvml.NVML_VOLATILE_ECC
    corrected = optional(None, dev.total_ecc_errors, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, kind)
    uncorrected = optional(
        None, dev.total_ecc_errors, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, kind
    )
    return corrected, uncorrected


def _retired_pages(dev: NvmlDevice) -> int | None:
    causes = (
        dev.nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
        dev.nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
    )
    pages = [optional(None, dev.retired_pages, cause) for cause in causes]
    if any(p is None for p in pages):
        return None
    return sum(len(p) for p in pages if p is not None)


def probe_fields(dev: NvmlDevice, ecc_counter: EccCounter, xids_registered: bool) -> frozenset[str]:
    """The optional fields this GPU answers for: each read once, NOT_SUPPORTED -> absent.

    What NVML documents per architecture (docs/hardware.md, "Telemetry per backend"):
    row remapping from Ampere on, page retirement before it, ECC counters where ECC is on.
    """
    fields: set[str] = set()
    if None not in _ecc_totals(dev, ecc_counter):
        fields |= ECC_FIELDS
    if _retired_pages(dev) is not None:
        fields |= PAGE_RETIREMENT_FIELDS
    if optional(None, dev.remapped_rows) is not None:
        fields |= ROW_REMAP_FIELDS
    if _clock_event_mask(dev) is not None:
        fields.add("clock_event_reasons")
    if xids_registered:
        fields.add("xids")
    return frozenset(fields)


def read_sample(
    dev: NvmlDevice,
    ecc_counter: EccCounter,
    xids: tuple[int, ...],
    now_s: float,
    fields: frozenset[str],
) -> TelemetrySample:
    """One sample of a present GPU; ``xids`` are those drained for it, ``fields`` what
    probe_fields found (the rest is None, and is not asked for again)."""
    used_bytes, total_bytes = dev.memory_bytes()
    utilization_pct = optional(None, dev.utilization_gpu_pct)
    ecc_corrected, ecc_uncorrected = (
        _ecc_totals(dev, ecc_counter) if ECC_FIELDS <= fields else (None, None)
    )
    remap: tuple[int | None, int | None, bool | None, bool | None] = (None, None, None, None)
    if ROW_REMAP_FIELDS <= fields:
        remap = optional((None, None, None, None), dev.remapped_rows)
    mask = _clock_event_mask(dev) if "clock_event_reasons" in fields else None
    return TelemetrySample(
        node=dev.node,
        index=dev.index,
        timestamp_s=now_s,
        present=True,
        temperature_c=float(optional(0, dev.temperature_c)),
        power_mw=optional(0, dev.power_usage_mw),
        energy_mj=optional(0, dev.energy_mj),
        utilization_ratio=utilization_pct / 100.0 if utilization_pct is not None else 0.0,
        memory_used_mb=used_bytes // _MIB,
        memory_total_mb=total_bytes // _MIB,
        sm_clock_mhz=optional(0, dev.sm_clock_mhz),
        power_limit_mw=optional(0, dev.power_limit_mw),
        ecc_corrected_total=ecc_corrected,
        ecc_uncorrected_total=ecc_uncorrected,
        retired_pages=_retired_pages(dev) if "retired_pages" in fields else None,
        remapped_rows_correctable=remap[0],
        remapped_rows_uncorrectable=remap[1],
        remapped_rows_pending=remap[2],
        remapped_rows_failure=remap[3],
        clock_event_reasons=decode_clock_event_reasons(mask) if mask is not None else None,
        xids=xids if "xids" in fields else None,
    )


def lost_sample(
    node: str, index: int, memory_total_mb: int, xids: tuple[int, ...] | None, now_s: float
) -> TelemetrySample:
    """The sample of a GPU that no longer answers: ``present=False``, what we knew of it.

    Its counters cannot be read (None); the XIDs drained for it (79) are what it left."""
    return TelemetrySample(
        node=node,
        index=index,
        timestamp_s=now_s,
        present=False,
        temperature_c=0.0,
        power_mw=0,
        energy_mj=0,
        utilization_ratio=0.0,
        memory_used_mb=0,
        memory_total_mb=memory_total_mb,
        sm_clock_mhz=0,
        power_limit_mw=0,
        ecc_corrected_total=None,
        ecc_uncorrected_total=None,
        retired_pages=None,
        remapped_rows_correctable=None,
        remapped_rows_uncorrectable=None,
        remapped_rows_pending=None,
        remapped_rows_failure=None,
        clock_event_reasons=None,
        xids=xids,
    )
