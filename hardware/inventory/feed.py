"""Following the change journal (journal.py): what changed since this reader last looked.

A ChangeFeed is started just before its owner reads the inventory whole; each ``poll``
then says which jobs, leases and pieces of the fleet changed since, or None when it
cannot say (the journal was pruned past it), and the owner reads everything again.

Revs are read in order, but on PostgreSQL one can become visible after a later one (its
transaction drew it first and committed last), and a rolled-back transaction's rev never
appears. The feed keeps the highest rev below which it has seen every rev (``low``), and
reads from there each time: a late rev is picked up when it appears, and a gap that has
not filled within ``gap_wait_s`` is taken for a rollback. Revs already reported above a
gap are not reported twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory.journal import JournalMixin
from gpuflow.hardware.inventory.triggers import FLEET, JOB, LEASE

GAP_WAIT_S = 30.0  # an inventory write transaction is milliseconds; a gap this old is gone
START_WINDOW = 10_000  # revs looked at on start, to know which recent ones are still due


@dataclass(frozen=True)
class Changes:
    """What changed since the last poll: job ids, resource ids, fleet keys."""

    jobs: frozenset[str] = field(default_factory=frozenset)
    leases: frozenset[str] = field(default_factory=frozenset)
    fleet: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.leases or self.fleet)


class ChangeFeed:
    def __init__(
        self,
        inventory: JournalMixin,
        *,
        gap_wait_s: float = GAP_WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not gap_wait_s >= 0:
            raise InvalidRequestError(f"gap_wait_s must be >= 0, got {gap_wait_s!r}")
        self.inventory = inventory
        self.gap_wait_s = float(gap_wait_s)
        self._clock = clock
        self.low: int | None = None  # None: not started
        self._seen: set[int] = set()  # revs above ``low`` already reported
        self._gaps: dict[int, float] = {}  # rev missing above ``low`` -> when first missed
        self.epoch = ""  # the journal followed (its tables made again: another one)

    @property
    def started(self) -> bool:
        return self.low is not None

    def start(self) -> None:
        """Follow from now: call it right before reading the inventory whole. Recent revs
        not yet visible (PostgreSQL) are waited for like any other gap."""
        newest, present, pruned, self.epoch = self.inventory.journal_tail(START_WINDOW)
        self.low = max(newest - START_WINDOW, pruned, 0)
        self._seen = {r for r in present if r > self.low}
        self._gaps = {}
        self._advance()

    def stop(self) -> None:
        self.low = None
        self._seen, self._gaps = set(), {}

    def poll(self) -> Changes | None:
        """What changed since the last poll (or start); None when the feed lost track
        (not started, the journal pruned past it, or made anew): read everything and
        start again."""
        if self.low is None:
            return None
        batch = self.inventory.journal_since(self.low)
        if batch.pruned_through > self.low or batch.epoch != self.epoch:
            self.stop()
            return None
        found: dict[str, set[str]] = {JOB: set(), LEASE: set(), FLEET: set()}
        for rev, entity, key in batch.rows:
            if rev in self._seen:
                continue
            self._seen.add(rev)
            self._gaps.pop(rev, None)
            found.setdefault(entity, set()).add(key)
        self._advance()
        return Changes(frozenset(found[JOB]), frozenset(found[LEASE]), frozenset(found[FLEET]))

    def _advance(self) -> None:
        """Move ``low`` over every rev seen or given up on, up to the first live gap."""
        assert self.low is not None
        top = max(self._seen, default=self.low)
        now = self._clock()
        rev = self.low + 1
        while rev <= top:
            if rev in self._seen:
                self._seen.discard(rev)
            else:
                missed = self._gaps.setdefault(rev, now)
                if now - missed < self.gap_wait_s:
                    break
                del self._gaps[rev]  # rolled back: it will never appear
            self.low = rev
            rev += 1
