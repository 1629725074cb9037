"""Fleet-wide locks: at most one holder at a time, with an expiry, across processes and
hosts. The scheduler's pass lock is one: whoever starts a pass (the `schedule`
deployment, `gpuflow schedule drain`, the train flow's placement) decides alone.

A lock is a row (name, holder, token, expiry), taken like a lease: an INSERT when free
(of two racing INSERTs the primary key lets one win), a compare-and-swap over the row read
when it has expired. The token comes from the store-wide fence counter, so a holder whose
lock lapsed and was taken over cannot release its successor's (release names the token).
Works the same on SQLite and PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import StoreBase, check_name, check_seconds, next_counter
from gpuflow.hardware.inventory.leases import FENCE_COUNTER
from gpuflow.hardware.inventory.records import LockBusyError
from sqlalchemy import Connection, delete, insert, select, update

LOCK_POLL_S = 0.05


@dataclass(frozen=True)
class LockHold:
    name: str
    holder: str
    token: int
    expires_at_s: float


class LockMixin(StoreBase):
    def acquire_lock(
        self, name: str, holder: str, ttl_s: float, *, wait_s: float = 0.0
    ) -> LockHold:
        """Take lock ``name`` for ``holder`` for ``ttl_s``; wait up to ``wait_s`` for a
        live holder to let go, then raise LockBusyError naming it and its expiry."""
        check_name(name, "lock name")
        check_name(holder, "lock holder")
        ttl = check_seconds(ttl_s, "ttl_s")
        deadline = time.monotonic() + check_seconds(wait_s, "wait_s", allow_zero=True)
        while True:
            try:
                return self._write(lambda conn: self._take(conn, name, holder, ttl))
            except LockBusyError:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(min(LOCK_POLL_S, max(0.0, deadline - time.monotonic())))

    def _take(self, conn: Connection, name: str, holder: str, ttl: float) -> LockHold:
        k = schema.locks
        now = self._clock()
        row = conn.execute(select(k).where(k.c.name == name)).first()
        token = next_counter(conn, FENCE_COUNTER)
        values = {"holder": holder, "token": token, "acquired_at": now, "expires_at": now + ttl}
        if row is None:
            # A racing INSERT of the same name raises IntegrityError; run_write retries.
            conn.execute(insert(k).values(name=name, **values))
        elif row.expires_at > now:
            raise LockBusyError(name, row.holder, row.expires_at)
        else:
            taken = conn.execute(
                update(k)
                .where(k.c.name == name, k.c.token == row.token, k.c.expires_at == row.expires_at)
                .values(**values)
            )
            if taken.rowcount != 1:
                current = conn.execute(select(k).where(k.c.name == name)).one()
                raise LockBusyError(name, current.holder, current.expires_at)
        return LockHold(name, holder, token, now + ttl)

    def release_lock(self, hold: LockHold) -> bool:
        """Let go of ``hold``; False when it had lapsed and someone else holds it now."""
        k = schema.locks

        def work(conn: Connection) -> bool:
            return (
                conn.execute(
                    delete(k).where(k.c.name == hold.name, k.c.token == hold.token)
                ).rowcount
                > 0
            )

        return self._write(work)

    def lock_holder(self, name: str) -> LockHold | None:
        """The live holder of ``name``, or None."""
        k = schema.locks
        with self._read() as conn:
            row = conn.execute(select(k).where(k.c.name == check_name(name, "lock name"))).first()
        if row is None or row.expires_at <= self._clock():
            return None
        return LockHold(row.name, row.holder, row.token, row.expires_at)

    @contextmanager
    def locked(
        self, name: str, holder: str, ttl_s: float, *, wait_s: float = 0.0
    ) -> Iterator[LockHold]:
        """``with inventory.locked("scheduler-pass", me, 60, wait_s=30): ...``"""
        hold = self.acquire_lock(name, holder, ttl_s, wait_s=wait_s)
        try:
            yield hold
        finally:
            self.release_lock(hold)
