"""Clocks the test moves by hand: ManualClock for the inventory's ``now``, GatedClock
also for a LeaseKeeper (or anything that waits on ``wait(stop_event, seconds)``), which
then follows it instead of wall time."""

from __future__ import annotations

import threading
import time
from typing import Any


class ManualClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class GatedClock(ManualClock):
    def __init__(self, t: float = 1000.0) -> None:
        super().__init__(t)
        self.cv = threading.Condition()

    def advance(self, dt: float) -> None:
        with self.cv:
            self.t += dt
            self.cv.notify_all()

    def wait(self, stop: threading.Event, seconds: float) -> bool:
        """Until ``seconds`` of this clock passed or ``stop`` is set; whether it was set."""
        with self.cv:
            due = self.t + seconds
            while self.t < due and not stop.is_set():
                self.cv.wait(0.02)  # also wakes for stop.set(), which does not notify us
        return stop.is_set()

    def keeper(self, made: list[Any]) -> Any:
        """A LeaseKeeper factory on this clock that appends what it makes to ``made``."""
        from gpuflow.hardware.inventory.keeper import LeaseKeeper

        def make(*args: Any, **kwargs: Any) -> LeaseKeeper:
            keeper = LeaseKeeper(*args, clock=self, wait=self.wait, **kwargs)
            made.append(keeper)
            return keeper

        return make


def caught_up(keeper: Any, clock: GatedClock, timeout_s: float = 10.0) -> bool:
    """Wait until ``keeper`` has renewed for the clock's current time, or lost its lease;
    False when neither happened within ``timeout_s`` of wall time (a stuck keeper)."""
    deadline = time.monotonic() + timeout_s
    with clock.cv:
        while not (keeper.lost or clock.t - keeper.renewed_at_s < keeper.interval_s):
            if time.monotonic() > deadline:
                return False
            clock.cv.wait(0.02)
    return True
