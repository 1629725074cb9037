"""LeaseKeeper: renew a runner's leases on a timer, from a background thread.

The renewal cadence is TTL/3 of wall time, whatever the work does meanwhile: a 10 s
training step, a slow start, a large resume or a long synchronous checkpoint no longer
decide whether a lease lapses. All leases of one (job, attempt) are renewed in one
statement. When a renewal finds fewer leases than it holds (they lapsed, were fenced by
remediation or taken over by a newer attempt), or the store stays unreachable until the
leases would have expired, the keeper marks itself lost and stops: the runner checks
``check()`` every step and before every write, which raises LeaseLostError, so nothing more
is written by this attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory.records import LeaseLostError

log = logging.getLogger(__name__)


class Renewer(Protocol):
    """What the keeper needs of the inventory."""

    def renew_leases(
        self, owner: str, attempt: int, resource_ids: Sequence[str], ttl_s: float
    ) -> int: ...


def _event_wait(stop: threading.Event, seconds: float) -> bool:
    return stop.wait(seconds)


class LeaseKeeper:
    """Keep (``owner``, ``attempt``)'s leases on ``resource_ids`` alive while it runs.

    ``clock`` is the time the keeper schedules by (the inventory's clock in tests);
    ``wait(stop_event, seconds)`` sleeps until ``seconds`` of that clock passed or the
    event is set (returns whether it was set). Use as a context manager around the work.
    """

    def __init__(
        self,
        inventory: Renewer,
        owner: str,
        attempt: int,
        resource_ids: Sequence[str],
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.time,
        wait: Callable[[threading.Event, float], bool] = _event_wait,
    ) -> None:
        ids = tuple(dict.fromkeys(resource_ids))
        if not ids:
            raise InvalidRequestError(f"LeaseKeeper for {owner!r} needs at least one resource id")
        if not ttl_s > 0:
            raise InvalidRequestError(f"LeaseKeeper ttl_s must be > 0, got {ttl_s!r}")
        self.inventory = inventory
        self.owner = owner
        self.attempt = attempt
        self.resource_ids = ids
        self.ttl_s = float(ttl_s)
        self.interval_s = self.ttl_s / 3.0
        self._clock = clock
        self._wait = wait
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._reason = ""
        self._thread: threading.Thread | None = None
        self.renewals = 0
        self.renewed_at_s = clock()  # the leases were just taken or renewed by the caller
        self.expires_at_s = self.renewed_at_s + self.ttl_s

    # -- the runner's side -------------------------------------------------------------
    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def check(self) -> None:
        """Raise LeaseLostError once the leases are gone; a no-op while they live."""
        if self._lost.is_set():
            raise LeaseLostError(self._reason)

    def start(self) -> LeaseKeeper:
        self.renew_now()  # a fresh expiry from the start...
        self.check()  # ...and an attempt whose leases are already gone never starts
        thread = threading.Thread(
            target=self._run, name=f"gpuflow-lease-{self.owner}-{self.attempt}", daemon=True
        )
        self._thread = thread
        thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def __enter__(self) -> LeaseKeeper:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- the timer ---------------------------------------------------------------------
    def renew_now(self) -> bool:
        """One renewal of every lease; False (and marked lost) when any is gone."""
        if self._lost.is_set():
            return False
        now = self._clock()
        try:
            renewed = self.inventory.renew_leases(
                self.owner, self.attempt, self.resource_ids, self.ttl_s
            )
        except Exception as exc:  # noqa: BLE001 - a store outage: retry until expiry
            if now >= self.expires_at_s:
                self._mark_lost(f"could not renew before the leases expired: {exc}")
                return False
            log.warning("lease renewal of %s attempt %d failed: %s", self.owner, self.attempt, exc)
            return True
        if renewed < len(self.resource_ids):
            self._mark_lost(
                f"{len(self.resource_ids) - renewed} of {len(self.resource_ids)} lease(s) of "
                f"job {self.owner!r} attempt {self.attempt} lapsed or were taken over"
            )
            return False
        self.renewals += 1
        self.renewed_at_s = now
        self.expires_at_s = now + self.ttl_s
        return True

    def _mark_lost(self, reason: str) -> None:
        self._reason = reason
        self._lost.set()
        log.error("job %s: %s; stopping this attempt", self.owner, reason)

    def _run(self) -> None:
        while not self._wait(self._stop, self.interval_s):
            if not self.renew_now():
                return
