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

from collections.abc import Mapping, Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import (
    StoreBase,
    check_index,
    check_name,
    check_seconds,
    in_chunks,
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
from sqlalchemy import Connection, Row, delete, func, insert, select, update

FENCE_COUNTER = "fence"


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
        taken = self._acquire_items([(r, owner, attempt) for r in dict.fromkeys(ids)], ttl)
        by_rid = {lease.resource_id: lease for lease in taken}
        return [by_rid[r] for r in ids]

    def acquire_leases_of(
        self, requests: Mapping[tuple[str, int], Sequence[str]], ttl_s: float
    ) -> dict[tuple[str, int], list[Lease]]:
        """acquire_leases for several (owner, attempt)s in ONE transaction, all or none (a
        scheduler pass starts all its placements at once). Raises what the first lease
        that cannot be taken would, and nothing is written."""
        ttl = check_seconds(ttl_s, "ttl_s")
        items = []
        for (owner, attempt), ids in requests.items():
            check_name(owner, "lease owner")
            check_index(attempt, "lease attempt")
            items += [(check_name(r, "resource id"), owner, attempt) for r in dict.fromkeys(ids)]
        asked: dict[str, tuple[str, int]] = {}
        for rid, owner, attempt in items:
            if rid in asked:
                raise InvalidRequestError(
                    f"resource {rid!r} asked for by both {asked[rid]} and {(owner, attempt)}"
                )
            asked[rid] = (owner, attempt)
        out: dict[tuple[str, int], list[Lease]] = {key: [] for key in requests}
        for lease in self._acquire_items(items, ttl) if items else []:
            out[(lease.owner, lease.attempt)].append(lease)
        return out

    def _acquire_items(self, items: list[tuple[str, str, int]], ttl: float) -> list[Lease]:
        for _ in range(WRITE_ATTEMPTS):
            try:
                return self._write(lambda conn: self._acquire_all(conn, items, ttl))
            except _LostRace:
                continue
        raise LeaseConflictError(items[0][0], "<contended>", self._clock(), "lost every retry")

    def _acquire_all(
        self, conn: Connection, items: list[tuple[str, str, int]], ttl: float
    ) -> list[Lease]:
        """Take every lease of ``ids`` inside ``conn``'s transaction, in a handful of
        statements whatever their number (a gang's units, every placement of a pass): what
        each check needs is read for all of them at once, then checked one id at a time
        in order, so the first that cannot be taken raises, before anything is written."""
        now = self._clock()
        facts = _LeaseFacts.read(conn, [rid for rid, _, _ in items])
        l_t = schema.leases
        plans: list[tuple[str, dict[str, Any], Row[Any] | None, str, Row[Any]]] = []
        fresh_tokens = 0
        taken_whole: set[str] = set()  # devices leased whole earlier in this batch
        for rid, owner, attempt in items:
            kind, drow, prow = facts.resolve(rid)
            facts.check_leasable(rid, drow, prow, now, taken_whole)
            if prow is None:
                taken_whole.add(drow.uuid)
            row = facts.leases.get(rid)
            if row is None:
                values: dict[str, Any] = {"acquired_at": now, "token": None}
            else:
                live = row.expires_at > now
                if live and row.owner != owner:
                    raise LeaseConflictError(rid, row.owner, row.expires_at)
                if live and row.attempt > attempt:
                    raise LeaseConflictError(
                        rid,
                        row.owner,
                        row.expires_at,
                        f"held for attempt {row.attempt}; attempt {attempt} is stale",
                    )
                same = live and row.owner == owner and row.attempt == attempt
                values = {
                    "acquired_at": row.acquired_at if same else now,
                    "token": row.token if same else None,
                }
            fresh_tokens += values["token"] is None
            values.update(owner=owner, renewed_at=now, expires_at=now + ttl, attempt=attempt)
            plans.append((rid, values, row, kind, drow))
        # Fencing tokens for new holders: one bump of the counter, handed out in id order.
        token = 0
        if fresh_tokens:
            token = next_counter(conn, FENCE_COUNTER, count=fresh_tokens) - fresh_tokens + 1
        inserts = []
        for rid, values, row, _, _ in plans:
            if values["token"] is None:
                values["token"], token = token, token + 1
            if row is None:
                inserts.append({"resource_id": rid, **values})
                continue
            result = conn.execute(
                update(l_t)
                .where(
                    l_t.c.resource_id == rid,
                    l_t.c.owner == row.owner,
                    l_t.c.attempt == row.attempt,
                    l_t.c.expires_at == row.expires_at,
                )
                .values(**values)
            )
            if result.rowcount != 1:
                raise _LostRace()
        if inserts:
            # A concurrent INSERT of the same id raises IntegrityError; run_write retries
            # the transaction, which then reads the winner's row and reports the conflict.
            conn.execute(insert(l_t), inserts)
        # What was just written, without reading it back.
        return [
            Lease(
                resource_id=rid,
                owner=values["owner"],
                acquired_at_s=values["acquired_at"],
                renewed_at_s=now,
                expires_at_s=now + ttl,
                kind=kind,
                node=drow.node,
                device_index=drow.device_index,
                attempt=values["attempt"],
                token=int(values["token"]),
            )
            for rid, values, _, kind, drow in plans
        ]

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
            for chunk in in_chunks(sorted(wanted)):
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
            for chunk in in_chunks(matched):
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

    def release_leases(self, resource_ids: Sequence[str], owner: str) -> int:
        """release_lease for several resources of ``owner`` in ONE statement; returns how
        many were ended (those held by someone else are left alone)."""
        check_name(owner, "lease owner")
        ids = sorted({check_name(r, "resource id") for r in resource_ids})
        l_t = schema.leases

        def work(conn: Connection) -> int:
            ended = 0
            for chunk in in_chunks(ids):
                query = delete(l_t).where(l_t.c.resource_id.in_(chunk), l_t.c.owner == owner)
                ended += int(conn.execute(query).rowcount)
            return ended

        return self._write(work) if ids else 0

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


class _LeaseFacts:
    """What taking leases on some resource ids checks, read for all of them at once: the
    devices and partitions they name, their nodes and cordons, the partitions of devices
    asked for whole, the whole-device leases over partitions asked for, their leases."""

    def __init__(self) -> None:
        self.devices: dict[str, Row[Any]] = {}
        self.partitions: dict[str, Row[Any]] = {}
        self.nodes: dict[str, Row[Any]] = {}
        self.cordons: dict[str, list[Row[Any]]] = {}
        self.parts_on: dict[str, int] = {}
        self.leases: dict[str, Row[Any]] = {}

    @classmethod
    def read(cls, conn: Connection, ids: list[str]) -> _LeaseFacts:
        d_t, p_t, n_t = schema.devices, schema.partitions, schema.nodes
        c_t, l_t = schema.cordons, schema.leases
        out = cls()
        # FOR SHARE: a reservation for a partition apply (maintenance.py) locks these rows
        # FOR UPDATE, so a lease and a reservation of one device never both succeed.
        for chunk in in_chunks(ids):
            out.devices.update(
                (r.uuid, r)
                for r in conn.execute(
                    select(d_t).where(d_t.c.uuid.in_(chunk)).with_for_update(read=True)
                )
            )
        rest = [r for r in ids if r not in out.devices]
        for chunk in in_chunks(rest):
            out.partitions.update(
                (r.uuid, r) for r in conn.execute(select(p_t).where(p_t.c.uuid.in_(chunk)))
            )
        parents = sorted({p.device_uuid for p in out.partitions.values()} - set(out.devices))
        for chunk in in_chunks(parents):
            out.devices.update(
                (r.uuid, r)
                for r in conn.execute(
                    select(d_t).where(d_t.c.uuid.in_(chunk)).with_for_update(read=True)
                )
            )
        names = sorted({d.node for d in out.devices.values()})
        for chunk in in_chunks(names):
            out.nodes.update(
                (r.name, r) for r in conn.execute(select(n_t).where(n_t.c.name.in_(chunk)))
            )
            for r in conn.execute(select(c_t).where(c_t.c.node.in_(chunk))):
                out.cordons.setdefault(r.node, []).append(r)
        whole = [r for r in ids if r in out.devices]
        for chunk in in_chunks(whole):
            counted = conn.execute(
                select(p_t.c.device_uuid, func.count())
                .where(p_t.c.device_uuid.in_(chunk))
                .group_by(p_t.c.device_uuid)
            )
            out.parts_on.update((r[0], int(r[1])) for r in counted)
        for chunk in in_chunks(sorted(set(ids) | set(parents))):
            out.leases.update(
                (r.resource_id, r)
                for r in conn.execute(select(l_t).where(l_t.c.resource_id.in_(chunk)))
            )
        return out

    def resolve(self, rid: str) -> tuple[str, Row[Any], Row[Any] | None]:
        """(kind, device row, partition row or None), as StoreBase._resolve."""
        drow = self.devices.get(rid)
        if drow is not None and rid not in self.partitions:
            return "device", drow, None
        prow = self.partitions.get(rid)
        if prow is None:
            raise InvalidRequestError(
                f"unknown resource {rid!r}: neither a device uuid nor a partition uuid "
                "in the inventory"
            )
        return prow.kind, self.devices[prow.device_uuid], prow

    def check_leasable(
        self, rid: str, drow: Row[Any], prow: Row[Any] | None, now: float, taken_whole: set[str]
    ) -> None:
        """ResourceUnavailableError (or LeaseConflictError) when ``rid`` may not be leased:
        absent, unhealthy, on a spare node, cordoned, a device split into partitions, or a
        partition of a device leased whole."""
        where = f"{drow.node}:{drow.device_index}"
        if not drow.present:
            raise ResourceUnavailableError(rid, f"device {where} is not present")
        if not drow.healthy:
            why = f" ({drow.health_reason})" if drow.health_reason else ""
            raise ResourceUnavailableError(rid, f"device {where} is unhealthy{why}")
        node = self.nodes[drow.node]
        if node.role != "active":
            raise ResourceUnavailableError(
                rid,
                f"node {drow.node!r} is in the spare pool; promote it with "
                f"set_node_role({drow.node!r}, 'active') first",
            )
        cordons = [
            c
            for c in self.cordons.get(drow.node, [])
            if c.device_uuid in (schema.NODE_CORDON, drow.uuid)
        ]
        if cordons:
            raise ResourceUnavailableError(
                rid, f"{where} is cordoned: {'; '.join(c.reason for c in cordons)}"
            )
        if prow is None:
            count = self.parts_on.get(drow.uuid, 0)
            if count:
                raise ResourceUnavailableError(
                    rid, f"device {where} has {count} partition(s); lease one of them"
                )
            return
        whole = self.leases.get(drow.uuid)
        if drow.uuid in taken_whole:
            raise LeaseConflictError(rid, "this batch", now, f"device {where} is leased whole")
        if whole is not None and whole.expires_at > now:
            raise LeaseConflictError(
                rid, whole.owner, whole.expires_at, f"device {where} is leased whole"
            )
