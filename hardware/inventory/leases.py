"""Leases: exclusive, expiring claims on a whole device or one partition.

Exclusivity is the database's, not ours: one row per resource id (primary key). Taking a
free resource is an INSERT, so of two racing processes exactly one succeeds and the
other, on retry, finds the winner's row. Taking over an expired lease, renewing and
releasing are compare-and-swap statements that name the row they read (owner and
expiry), so a concurrent change makes them match nothing instead of clobbering it. On
SQLite the write transaction is also BEGIN IMMEDIATE, which serialises writers outright.

A lease belongs to (owner, attempt): the owner is the job id, the attempt the job's
placement it was taken for. Every new holder, and every newer attempt of the same owner,
gets a fresh fencing token from the store-wide "fence" counter, so tokens only grow; a
checkpoint store refuses writes with a token older than its newest (tasks/training).
An older attempt can neither renew nor take back a lease a newer attempt holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_index,
    check_name,
    check_seconds,
    lease_record,
    next_counter,
)
from gpuflow.hardware.inventory.engine import WRITE_ATTEMPTS
from gpuflow.hardware.inventory.records import (
    Lease,
    LeaseConflictError,
    LeaseNotHeldError,
    ResourceUnavailableError,
)
from sqlalchemy import Connection, Row, delete, insert, select, update

FENCE_COUNTER = "fence"
IN_CHUNK = 500  # ids per IN (...) list: well inside SQLite's and PostgreSQL's limits


def _chunks(ids: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(ids), IN_CHUNK):
        yield ids[i : i + IN_CHUNK]


class _LostRace(Exception):
    """A compare-and-swap matched no row: someone changed the lease meanwhile; re-read."""


class LeaseMixin(StoreBase):
    def acquire_lease(
        self, resource_id: str, owner: str, ttl_s: float, *, attempt: int = 0
    ) -> Lease:
        """Lease a device (by uuid) or a partition (by uuid) to (``owner``, ``attempt``)
        for ``ttl_s``.

        Raises LeaseConflictError (naming the holder and expiry) if someone else, or a
        newer attempt of the same owner, holds an unexpired lease; an expired lease is
        taken over. The same (owner, attempt) asking again extends its
        lease (same token); a newer attempt of the owner takes its older attempt's lease
        over (new token). Raises ResourceUnavailableError for a resource that is cordoned,
        absent, unhealthy, on a spare node, a device split into partitions, or a partition
        of a device leased whole; InvalidRequestError for an unknown id.
        """
        return self.acquire_leases([resource_id], owner, ttl_s, attempt=attempt)[0]

    def acquire_leases(
        self, resource_ids: Sequence[str], owner: str, ttl_s: float, *, attempt: int = 0
    ) -> list[Lease]:
        """acquire_lease for several resources in ONE transaction, all or none: the first
        one that cannot be taken raises what acquire_lease would, and nothing is written."""
        ids = [check_name(r, "resource id") for r in resource_ids]
        check_name(owner, "lease owner")
        ttl = check_seconds(ttl_s, "ttl_s")
        check_index(attempt, "lease attempt")
        for _ in range(WRITE_ATTEMPTS):
            try:
                return self._write(
                    lambda conn: [self._acquire(conn, rid, owner, ttl, attempt) for rid in ids]
                )
            except _LostRace:
                continue
        raise LeaseConflictError(ids[0], "<contended>", self._clock(), "lost every retry")

    def _acquire(
        self, conn: Connection, resource_id: str, owner: str, ttl: float, attempt: int
    ) -> Lease:
        kind, drow, prow = self._resolve(conn, resource_id)
        self._check_leasable(conn, resource_id, drow, prow)
        now = self._clock()
        l_t = schema.leases
        row = conn.execute(select(l_t).where(l_t.c.resource_id == resource_id)).first()
        if row is None:
            values = {
                "owner": owner,
                "acquired_at": now,
                "renewed_at": now,
                "expires_at": now + ttl,
                "attempt": attempt,
                "token": next_counter(conn, FENCE_COUNTER),
            }
            # A concurrent INSERT of the same id raises IntegrityError; run_write retries
            # the transaction, which then reads the winner's row and reports the conflict.
            conn.execute(insert(l_t).values(resource_id=resource_id, **values))
        else:
            live = row.expires_at > now
            if live and row.owner != owner:
                raise LeaseConflictError(resource_id, row.owner, row.expires_at)
            if live and row.attempt > attempt:
                raise LeaseConflictError(
                    resource_id,
                    row.owner,
                    row.expires_at,
                    f"held for attempt {row.attempt}; attempt {attempt} is stale",
                )
            same = live and row.owner == owner and row.attempt == attempt
            values = {
                "owner": owner,
                "acquired_at": row.acquired_at if same else now,
                "renewed_at": now,
                "expires_at": now + ttl,
                "attempt": attempt,
                "token": row.token if same else next_counter(conn, FENCE_COUNTER),
            }
            result = conn.execute(
                update(l_t)
                .where(
                    l_t.c.resource_id == resource_id,
                    l_t.c.owner == row.owner,
                    l_t.c.attempt == row.attempt,
                    l_t.c.expires_at == row.expires_at,
                )
                .values(**values)
            )
            if result.rowcount != 1:
                raise _LostRace()
        # What was just written, without reading it back (three statements per lease).
        return Lease(
            resource_id=resource_id,
            owner=owner,
            acquired_at_s=values["acquired_at"],
            renewed_at_s=now,
            expires_at_s=now + ttl,
            kind=kind,
            node=drow.node,
            device_index=drow.device_index,
            attempt=attempt,
            token=int(values["token"]),
        )

    def _check_leasable(
        self, conn: Connection, resource_id: str, drow: Row[Any], prow: Row[Any] | None
    ) -> None:
        where = f"{drow.node}:{drow.device_index}"
        if not drow.present:
            raise ResourceUnavailableError(resource_id, f"device {where} is not present")
        if not drow.healthy:
            why = f" ({drow.health_reason})" if drow.health_reason else ""
            raise ResourceUnavailableError(resource_id, f"device {where} is unhealthy{why}")
        node = self._node_row(conn, drow.node)
        if node.role != "active":
            raise ResourceUnavailableError(
                resource_id,
                f"node {drow.node!r} is in the spare pool; promote it with "
                f"set_node_role({drow.node!r}, 'active') first",
            )
        cordons = self._cordon_rows(conn, drow.node, drow.uuid)
        if cordons:
            raise ResourceUnavailableError(
                resource_id, f"{where} is cordoned: {'; '.join(c.reason for c in cordons)}"
            )
        p_t, l_t = schema.partitions, schema.leases
        if prow is None:
            count = len(
                conn.execute(select(p_t.c.uuid).where(p_t.c.device_uuid == drow.uuid)).all()
            )
            if count:
                raise ResourceUnavailableError(
                    resource_id, f"device {where} has {count} partition(s); lease one of them"
                )
            return
        whole = conn.execute(select(l_t).where(l_t.c.resource_id == drow.uuid)).first()
        if whole is not None and whole.expires_at > self._clock():
            raise LeaseConflictError(
                resource_id, whole.owner, whole.expires_at, f"device {where} is leased whole"
            )

    def renew_lease(
        self, resource_id: str, owner: str, ttl_s: float, *, attempt: int | None = None
    ) -> Lease:
        """Extend ``owner``'s live lease to now + ``ttl_s`` (only if it is for ``attempt``,
        when given).

        Raises LeaseNotHeldError when there is no lease, someone else holds it, another
        attempt holds it, or it has already expired (an expired lease may have been taken
        over: acquire again).
        """
        check_name(resource_id, "resource id")
        check_name(owner, "lease owner")
        ttl = check_seconds(ttl_s, "ttl_s")
        if attempt is not None:
            check_index(attempt, "lease attempt")

        def work(conn: Connection) -> Lease:
            now = self._clock()
            l_t = schema.leases
            row = conn.execute(select(l_t).where(l_t.c.resource_id == resource_id)).first()
            if row is None:
                raise LeaseNotHeldError(f"no lease on {resource_id!r} to renew for {owner!r}")
            if row.owner != owner:
                raise LeaseNotHeldError(
                    f"lease on {resource_id!r} is held by {row.owner!r}, not {owner!r}"
                )
            if attempt is not None and row.attempt != attempt:
                raise LeaseNotHeldError(
                    f"lease on {resource_id!r} is held by {owner!r} attempt {row.attempt}, "
                    f"not attempt {attempt}"
                )
            if row.expires_at <= now:
                raise LeaseNotHeldError(
                    f"lease of {owner!r} on {resource_id!r} expired at {row.expires_at:.3f} "
                    f"(now {now:.3f}); acquire it again"
                )
            result = conn.execute(
                update(l_t)
                .where(
                    l_t.c.resource_id == resource_id,
                    l_t.c.owner == owner,
                    l_t.c.attempt == row.attempt,
                    l_t.c.expires_at > now,
                )
                .values(renewed_at=now, expires_at=now + ttl)
            )
            if result.rowcount != 1:
                raise LeaseNotHeldError(f"lease of {owner!r} on {resource_id!r} changed meanwhile")
            return self._written_lease(conn, resource_id)

        return self._write(work)

    def renew_leases(
        self, owner: str, attempt: int, resource_ids: list[str] | tuple[str, ...], ttl_s: float
    ) -> int:
        """Extend every live lease of (``owner``, ``attempt``) among ``resource_ids`` to now
        + ``ttl_s`` in ONE statement; returns how many were renewed (fewer than asked: the
        others lapsed, were taken over or belong to another attempt)."""
        check_name(owner, "lease owner")
        check_index(attempt, "lease attempt")
        ttl = check_seconds(ttl_s, "ttl_s")
        ids = sorted({check_name(r, "resource id") for r in resource_ids})
        if not ids:
            return 0
        l_t = schema.leases

        def work(conn: Connection) -> int:
            now = self._clock()
            result = conn.execute(
                update(l_t)
                .where(
                    l_t.c.owner == owner,
                    l_t.c.attempt == attempt,
                    l_t.c.resource_id.in_(ids),
                    l_t.c.expires_at > now,
                )
                .values(renewed_at=now, expires_at=now + ttl)
            )
            return int(result.rowcount)

        return self._write(work)

    def renew_leases_of(
        self, renewals: Mapping[tuple[str, int], Sequence[str]], ttl_s: float
    ) -> dict[tuple[str, int], int]:
        """renew_leases for many (owner, attempt)s in ONE transaction of a few statements
        (a scheduler pass renews every live job's leases: one commit, not one per job).
        Returns, per (owner, attempt), how many of its leases were renewed."""
        ttl = check_seconds(ttl_s, "ttl_s")
        wanted: dict[str, set[tuple[str, int]]] = {}  # resource id -> who asks for it
        for (owner, attempt), ids in renewals.items():
            check_name(owner, "lease owner")
            check_index(attempt, "lease attempt")
            for rid in ids:
                wanted.setdefault(check_name(rid, "resource id"), set()).add((owner, attempt))
        counts = dict.fromkeys(renewals, 0)
        if not wanted:
            return counts
        l_t = schema.leases

        def work(conn: Connection) -> dict[tuple[str, int], int]:
            now = self._clock()
            out = dict(counts)
            matched: list[str] = []
            for chunk in _chunks(sorted(wanted)):
                # Row locks (PostgreSQL; SQLite's write lock covers it) keep what we match
                # here exactly what the UPDATE below extends.
                rows = conn.execute(
                    select(l_t.c.resource_id, l_t.c.owner, l_t.c.attempt)
                    .where(l_t.c.resource_id.in_(chunk), l_t.c.expires_at > now)
                    .with_for_update()
                )
                for r in rows:
                    key = (r.owner, int(r.attempt))
                    if key in wanted[r.resource_id]:
                        matched.append(r.resource_id)
                        out[key] += 1
            for chunk in _chunks(matched):
                conn.execute(
                    update(l_t)
                    .where(l_t.c.resource_id.in_(chunk), l_t.c.expires_at > now)
                    .values(renewed_at=now, expires_at=now + ttl)
                )
            return out

        return self._write(work)

    def release_lease(self, resource_id: str, owner: str, *, attempt: int | None = None) -> bool:
        """End ``owner``'s lease (expired or not; only ``attempt``'s, when given, so a
        stale attempt cannot end its successor's). True if one was ended; releasing again,
        or a lease now held by someone else, is a no-op that returns False."""
        check_name(resource_id, "resource id")
        check_name(owner, "lease owner")
        if attempt is not None:
            check_index(attempt, "lease attempt")
        l_t = schema.leases

        def work(conn: Connection) -> bool:
            query = delete(l_t).where(l_t.c.resource_id == resource_id, l_t.c.owner == owner)
            if attempt is not None:
                query = query.where(l_t.c.attempt == attempt)
            return conn.execute(query).rowcount > 0

        return self._write(work)

    def leases(self, owner: str | None = None, *, include_expired: bool = False) -> list[Lease]:
        """Unexpired leases (all of them with ``include_expired``), by resource id."""
        l_t = schema.leases
        where = []
        if owner is not None:
            where.append(l_t.c.owner == check_name(owner, "lease owner"))
        if not include_expired:
            where.append(l_t.c.expires_at > self._clock())
        with self._read() as conn:
            return self._located_leases(conn, *where)

    @staticmethod
    def _located_leases(conn: Connection, *where: Any) -> list[Lease]:
        """Leases by resource id, each with where its resource is, from one outer join
        (a device's lease, a partition's lease through its device, or neither: gone)."""
        l_t, d_t, p_t = schema.leases, schema.devices, schema.partitions
        pd = d_t.alias("part_device")
        query = (
            select(
                l_t,
                d_t.c.node.label("dev_node"),
                d_t.c.device_index.label("dev_index"),
                p_t.c.kind.label("part_kind"),
                pd.c.node.label("part_node"),
                pd.c.device_index.label("part_index"),
            )
            .select_from(
                l_t.outerjoin(d_t, d_t.c.uuid == l_t.c.resource_id)
                .outerjoin(p_t, p_t.c.uuid == l_t.c.resource_id)
                .outerjoin(pd, pd.c.uuid == p_t.c.device_uuid)
            )
            .where(*where)
            .order_by(l_t.c.resource_id)
        )
        out = []
        for r in conn.execute(query):
            if r.part_kind is not None:
                out.append(lease_record(r, r.part_kind, r.part_node, r.part_index))
            elif r.dev_node is not None:
                out.append(lease_record(r, "device", r.dev_node, r.dev_index))
            else:
                out.append(lease_record(r, None, None, None))
        return out

    def lease(self, resource_id: str) -> Lease | None:
        """The unexpired lease on a resource, or None."""
        check_name(resource_id, "resource id")
        with self._read() as conn:
            found = self._lease(conn, resource_id)
        return found if found is not None and not found.expired(self._clock()) else None

    def expire_leases(self, now: float | None = None) -> list[Lease]:
        """Delete leases expired at ``now`` (default: the clock) and return them."""
        at = self._clock() if now is None else check_seconds(now, "now", allow_zero=True)
        l_t = schema.leases

        def work(conn: Connection) -> list[Lease]:
            rows = list(conn.execute(select(l_t).where(l_t.c.expires_at <= at)))
            ended = []
            for lease in self._leases_from_rows(conn, rows):
                # Only the row we read: a lease renewed meanwhile is no longer expired.
                result = conn.execute(
                    delete(l_t).where(
                        l_t.c.resource_id == lease.resource_id,
                        l_t.c.owner == lease.owner,
                        l_t.c.expires_at == lease.expires_at_s,
                    )
                )
                if result.rowcount == 1:
                    ended.append(lease)
            return ended

        return self._write(work)

    def _lease(self, conn: Connection, resource_id: str) -> Lease | None:
        l_t = schema.leases
        row = conn.execute(select(l_t).where(l_t.c.resource_id == resource_id)).first()
        return None if row is None else self._leases_from_rows(conn, [row])[0]

    def _written_lease(self, conn: Connection, resource_id: str) -> Lease:
        found = self._lease(conn, resource_id)
        if found is None:  # pragma: no cover - we wrote it in this very transaction
            raise LeaseNotHeldError(f"lease on {resource_id!r} vanished inside its transaction")
        return found
