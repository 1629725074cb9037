"""Simulated time: wall time plus a persisted fast-forward offset, never going back.

Live runs see the twin move with the wall clock; ``advance`` adds to a persisted offset,
so every process that shares the state jumps together. Sim time is in Unix-like seconds
(``epoch_s`` is the wall time the state was created), so telemetry timestamps look like
wall timestamps that run ahead after a fast-forward. ``last_now_s`` keeps it monotonic
even if the wall clock steps back (NTP).
"""

from __future__ import annotations

import time
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError


def new_clock(wall_s: float | None = None) -> dict[str, float]:
    wall = time.time() if wall_s is None else wall_s
    return {"epoch_s": wall, "offset_s": 0.0, "last_now_s": wall}


def now_s(clock: dict[str, Any]) -> float:
    """Current sim time; also records it so the clock never runs backwards."""
    t = max(time.time() + clock["offset_s"], clock["last_now_s"])
    clock["last_now_s"] = t
    return t


def advance(clock: dict[str, Any], seconds: float) -> float:
    """Fast-forward by ``seconds`` (>= 0); returns the new sim time."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds >= 0:
        raise InvalidRequestError(f"advance needs a number of seconds >= 0, got {seconds!r}")
    if seconds == float("inf"):
        raise InvalidRequestError("advance needs a finite number of seconds")
    clock["offset_s"] += float(seconds)
    return now_s(clock)


def elapsed_s(clock: dict[str, Any], t: float) -> float:
    """Seconds since the fleet's epoch (what the hazard model's schedules count)."""
    return t - clock["epoch_s"]
