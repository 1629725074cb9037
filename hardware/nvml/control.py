"""Clocks and power limits of one GPU: read them, and validate a change before making it.

Every setter checks its input against what the GPU reports (supported clocks, limit
range) first, so a bad request is an InvalidRequestError and nothing is changed.
"""

from __future__ import annotations

from typing import Any

from gpuflow.hardware.backend import (
    ClockState,
    InvalidRequestError,
    PowerLimits,
    UnsupportedError,
)
from gpuflow.hardware.nvml.device import NvmlDevice
from gpuflow.hardware.nvml.errors import optional


def require_int(name: str, value: Any) -> int:
    """``value`` if it is an int (not a bool), else an InvalidRequestError naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequestError(f"{name} must be an integer, got {value!r}")
    return value


def _supported_sm_clocks_mhz(dev: NvmlDevice) -> list[int]:
    """Graphics clocks supported with the highest memory clock; [] if the GPU lists none."""
    mems = optional([], dev.supported_memory_clocks_mhz)
    if not mems:
        return []
    return sorted(optional([], dev.supported_graphics_clocks_mhz, max(mems)))


def clock_state(dev: NvmlDevice, locked_mhz: tuple[int, int] | None) -> ClockState:
    """The SM clock, its range and the applications clocks.

    NVML has no getter for locked clocks: ``locked_mhz`` is what this process set.
    """
    current = dev.sm_clock_mhz()
    top = dev.max_sm_clock_mhz()
    supported = _supported_sm_clocks_mhz(dev)
    # Without a supported-clocks table the lowest clock we know of is the current one.
    bottom = min(supported) if supported else min(current, top)
    return ClockState(
        sm_clock_mhz=current,
        sm_clock_min_mhz=bottom,
        sm_clock_max_mhz=top,
        locked_min_mhz=locked_mhz[0] if locked_mhz else None,
        locked_max_mhz=locked_mhz[1] if locked_mhz else None,
        applications_sm_clock_mhz=optional(None, dev.applications_sm_clock_mhz),
        applications_mem_clock_mhz=optional(None, dev.applications_mem_clock_mhz),
    )


def check_locked_clocks(where: str, state: ClockState, min_mhz: int, max_mhz: int) -> None:
    if min_mhz > max_mhz:
        raise InvalidRequestError(f"{where}: min_mhz {min_mhz} is above max_mhz {max_mhz}")
    if min_mhz < state.sm_clock_min_mhz or max_mhz > state.sm_clock_max_mhz:
        raise InvalidRequestError(
            f"{where}: locked clocks {min_mhz}-{max_mhz} MHz outside the GPU's "
            f"{state.sm_clock_min_mhz}-{state.sm_clock_max_mhz} MHz"
        )


def set_applications_clocks(dev: NvmlDevice, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
    """Set the applications clocks after checking them against the supported-clocks table."""
    where = dev.where
    mems = sorted(optional([], dev.supported_memory_clocks_mhz))
    if not mems:
        raise UnsupportedError(
            f"{where}: the GPU lists no supported clocks (no application clocks)"
        )
    if mem_clock_mhz not in mems:
        raise InvalidRequestError(
            f"{where}: memory clock {mem_clock_mhz} MHz not supported; supported: {mems}"
        )
    gfx = sorted(optional([], dev.supported_graphics_clocks_mhz, mem_clock_mhz))
    if sm_clock_mhz not in gfx:
        nearest = min(gfx, key=lambda c: abs(c - sm_clock_mhz)) if gfx else None
        raise InvalidRequestError(
            f"{where}: SM clock {sm_clock_mhz} MHz not supported with memory at "
            f"{mem_clock_mhz} MHz (supported {gfx[0] if gfx else '?'}-"
            f"{gfx[-1] if gfx else '?'} MHz; nearest {nearest})"
        )
    dev.set_applications_clocks_mhz(mem_clock_mhz, sm_clock_mhz)


def power_limits(dev: NvmlDevice) -> PowerLimits:
    lo, hi = dev.power_limit_constraints_mw()
    return PowerLimits(
        limit_mw=dev.power_limit_mw(),
        min_limit_mw=lo,
        max_limit_mw=hi,
        default_limit_mw=dev.default_power_limit_mw(),
    )


def set_power_limit(dev: NvmlDevice, limit_mw: int) -> None:
    """Set the power limit after checking it is in the GPU's range."""
    lim = power_limits(dev)
    if not lim.min_limit_mw <= limit_mw <= lim.max_limit_mw:
        raise InvalidRequestError(
            f"{dev.where}: power limit {limit_mw} mW outside "
            f"{lim.min_limit_mw}-{lim.max_limit_mw} mW"
        )
    dev.set_power_limit_mw(limit_mw)
