"""SimBackend's clock and power-limit calls: read the ranges, lock / set / reset clocks,
set the power limit. The effect on the device is hardware.sim.physics's job."""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import ClockState, InvalidRequestError, PowerLimits
from gpuflow.hardware.sim import fleet
from gpuflow.hardware.sim.core import SimCore, is_int


class ClocksApi(SimCore):
    """Clocks and power limits of the twin's devices, validated against their SKU."""

    def clocks(self, node: str, index: int) -> ClockState:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            return ClockState(
                sm_clock_mhz=fleet.operating(state, dev).clock_mhz,
                sm_clock_min_mhz=s.sm_clock_min_mhz,
                sm_clock_max_mhz=s.sm_clock_max_mhz,
                locked_min_mhz=dev["locked_min_mhz"],
                locked_max_mhz=dev["locked_max_mhz"],
                applications_sm_clock_mhz=dev["applications_sm_mhz"],
                applications_mem_clock_mhz=dev["applications_mem_mhz"],
            )

    def _check_clock(self, dev: dict[str, Any], what: str, value: object) -> int:
        s = fleet.sku_of(dev)
        if not is_int(value) or not s.sm_clock_min_mhz <= value <= s.sm_clock_max_mhz:  # type: ignore[operator]
            raise InvalidRequestError(
                f"{self._label(dev)}: {what} {value!r} MHz is outside the supported range "
                f"{s.sm_clock_min_mhz}..{s.sm_clock_max_mhz} MHz"
            )
        return int(value)  # type: ignore[arg-type]

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            lo = self._check_clock(dev, "locked min clock", min_mhz)
            hi = self._check_clock(dev, "locked max clock", max_mhz)
            if lo > hi:
                raise InvalidRequestError(
                    f"{self._label(dev)}: locked clock range {lo}..{hi} MHz has min > max"
                )
            dev["locked_min_mhz"], dev["locked_max_mhz"] = lo, hi

    def reset_locked_clocks(self, node: str, index: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            dev["locked_min_mhz"] = dev["locked_max_mhz"] = None

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if mem_clock_mhz != s.mem_clock_mhz or not is_int(mem_clock_mhz):
                raise InvalidRequestError(
                    f"{self._label(dev)}: memory clock {mem_clock_mhz!r} MHz is not supported; "
                    f"supported: [{s.mem_clock_mhz}]"
                )
            sm = self._check_clock(dev, "application SM clock", sm_clock_mhz)
            dev["applications_mem_mhz"], dev["applications_sm_mhz"] = mem_clock_mhz, sm

    def reset_applications_clocks(self, node: str, index: int) -> None:
        """Back to the default application clocks (NVML nvmlDeviceResetApplicationsClocks)."""
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            dev["applications_mem_mhz"] = dev["applications_sm_mhz"] = None

    def power_limits(self, node: str, index: int) -> PowerLimits:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            return PowerLimits(
                limit_mw=dev["power_limit_mw"],
                min_limit_mw=s.power_min_limit_mw,
                max_limit_mw=s.power_max_limit_mw,
                default_limit_mw=s.power_default_limit_mw,
            )

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        with self._txn() as (state, _):
            dev = self._live(state, node, index)
            s = fleet.sku_of(dev)
            if not is_int(limit_mw) or not s.power_min_limit_mw <= limit_mw <= s.power_max_limit_mw:
                raise InvalidRequestError(
                    f"{self._label(dev)}: power limit {limit_mw!r} mW is outside the supported range "
                    f"{s.power_min_limit_mw}..{s.power_max_limit_mw} mW"
                )
            dev["power_limit_mw"] = int(limit_mw)
