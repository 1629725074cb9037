"""The store's plumbing shared by every part of the inventory: engine, clock, input checks,
row-to-record conversion and resource look-up."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.engine import (
    SQLITE_BEGIN,
    default_url,
    ensure_schema,
    make_engine,
    run_write,
)
from gpuflow.hardware.inventory.records import (
    Cordon,
    DeviceRecord,
    Lease,
    NodeRecord,
)
from sqlalchemy import Connection, Engine, Row, and_, case, insert, or_, select, update

T = TypeVar("T")
MAX_NAME_LEN = 255
_MIG_SLICES = re.compile(r"^(\d+)g\.")


def check_name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequestError(f"{what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_NAME_LEN:
        raise InvalidRequestError(f"{what} is longer than {MAX_NAME_LEN} characters: {value!r}")
    return value


def check_index(value: object, what: str = "device index") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def check_seconds(value: object, what: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{what} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidRequestError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return float(value)


def check_choice(value: object, valid: tuple[str, ...], what: str) -> str:
    if value not in valid:
        raise InvalidRequestError(f"{what} {value!r} is not one of: {', '.join(valid)}")
    return str(value)


K = TypeVar("K")
IN_CHUNK = 500  # ids per IN (...) list: well inside SQLite's and PostgreSQL's limits


def in_chunks(ids: Sequence[K]) -> Iterator[Sequence[K]]:
    """``ids`` in slices short enough for one IN (...) list each."""
    for i in range(0, len(ids), IN_CHUNK):
        yield ids[i : i + IN_CHUNK]


def next_counter(conn: Connection, name: str, floor: int = 1, *, count: int = 1) -> int:
    """The next value of the store-wide counter ``name`` (1, 2, ..., never below
    ``floor``), inside ``conn``'s transaction: the UPDATE row-locks it (PostgreSQL) or runs
    under the write lock (SQLite), so no two transactions ever get the same value. With
    ``count`` (>= 1) the next ``count`` values are taken at once and the last is returned."""
    c = schema.counters
    bumped = case((c.c.value + 1 < floor, floor + count - 1), else_=c.c.value + count)
    if conn.execute(update(c).where(c.c.name == name).values(value=bumped)).rowcount:
        return int(conn.execute(select(c.c.value).where(c.c.name == name)).scalar_one())
    # The first use: a concurrent first INSERT raises IntegrityError and run_write retries.
    last = max(1, floor) + count - 1
    conn.execute(insert(c).values(name=name, value=last))
    return last


def mig_compute_slices(profile: str) -> int | None:
    """3 for "3g.20gb" (and "3g.20gb+me"); None for a name without that form."""
    m = _MIG_SLICES.match(profile)
    return int(m.group(1)) if m else None


def node_record(row: Row[Any]) -> NodeRecord:
    return NodeRecord(
        name=row.name,
        region=row.region,
        role=row.role,
        backend=row.backend,
        first_seen_s=row.first_seen,
        last_seen_s=row.last_seen,
    )


def device_record(row: Row[Any]) -> DeviceRecord:
    return DeviceRecord(
        node=row.node,
        index=row.device_index,
        vendor=row.vendor,
        sku=row.sku,
        uuid=row.uuid,
        memory_total_mb=row.memory_total_mb,
        pci_device_id=row.pci_device_id,
        partition_kinds=tuple(k for k in row.partition_kinds.split(",") if k),
        present=bool(row.present),
        healthy=bool(row.healthy),
        health_reason=row.health_reason,
        telemetry=row.telemetry,
        telemetry_at_s=row.telemetry_at,
        last_seen_s=row.last_seen,
    )


def lease_record(
    row: Row[Any], kind: str | None, node: str | None, device_index: int | None
) -> Lease:
    return Lease(
        resource_id=row.resource_id,
        owner=row.owner,
        acquired_at_s=row.acquired_at,
        renewed_at_s=row.renewed_at,
        expires_at_s=row.expires_at,
        kind=kind,
        node=node,
        device_index=device_index,
        attempt=int(row.attempt),
        token=int(row.token),
    )


class StoreBase:
    """Engine, clock and transactions. Safe to use from one thread per instance; make one
    instance per process (a forked child re-opens its own connections by itself)."""

    def __init__(self, url: str | None = None, *, now: Callable[[], float] = time.time) -> None:
        if not callable(now):
            raise InvalidRequestError(f"now must be a callable returning seconds, got {now!r}")
        self.url = url if url is not None else default_url()
        self._now = now
        self._engine = make_engine(self.url)
        self._pid = os.getpid()
        ensure_schema(self._engine)

    # -- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._engine.url.render_as_string(hide_password=True)!r})"

    # -- plumbing ----------------------------------------------------------------------
    def _engine_here(self) -> Engine:
        if os.getpid() != self._pid:
            # Connections inherited through fork belong to the parent: drop them unclosed.
            self._engine.dispose(close=False)
            self._pid = os.getpid()
        return self._engine

    def _clock(self) -> float:
        return float(self._now())

    def _write(self, work: Callable[[Connection], T]) -> T:
        return run_write(self._engine_here(), work)

    def next_sequence(self, name: str, floor: int = 1) -> int:
        """The next number of the store-wide counter ``name``: unique across processes
        and hosts, increasing, and at least ``floor``."""
        check_name(name, "counter name")
        return self._write(lambda conn: next_counter(conn, name, floor))

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        # Deferred: a read-only snapshot that never waits for the SQLite write lock.
        with self._engine_here().connect() as conn:
            conn.execution_options(**{SQLITE_BEGIN: "DEFERRED"})
            with conn.begin():
                yield conn

    # -- look-ups inside a transaction -------------------------------------------------
    @staticmethod
    def _node_row(conn: Connection, node: str) -> Row[Any]:
        check_name(node, "node")
        row = conn.execute(select(schema.nodes).where(schema.nodes.c.name == node)).first()
        if row is None:
            known = conn.execute(
                select(schema.nodes.c.name).order_by(schema.nodes.c.name).limit(12)
            ).scalars()
            raise InvalidRequestError(
                f"unknown node {node!r}; known: {', '.join(known) or 'none (run sync first)'}"
            )
        return row

    @classmethod
    def _device_row(cls, conn: Connection, node: str, index: int) -> Row[Any]:
        """The device at node:index: the present one, else the one seen there last."""
        check_index(index)
        cls._node_row(conn, node)
        d = schema.devices
        row = conn.execute(
            select(d)
            .where(d.c.node == node, d.c.device_index == index)
            .order_by(d.c.present.desc(), d.c.last_seen.desc())
        ).first()
        if row is None:
            indexes = conn.execute(
                select(d.c.device_index).where(d.c.node == node).distinct()
            ).scalars()
            raise InvalidRequestError(
                f"unknown device {node}:{index}; node {node!r} has indexes "
                f"{sorted(indexes) or 'none'}"
            )
        return row

    @staticmethod
    def _resolve(conn: Connection, resource_id: str) -> tuple[str, Row[Any], Row[Any] | None]:
        """(kind, device row, partition row or None) for a resource id."""
        d, p = schema.devices, schema.partitions
        drow = conn.execute(select(d).where(d.c.uuid == resource_id)).first()
        if drow is not None:
            return "device", drow, None
        prow = conn.execute(select(p).where(p.c.uuid == resource_id)).first()
        if prow is None:
            raise InvalidRequestError(
                f"unknown resource {resource_id!r}: neither a device uuid nor a partition uuid "
                "in the inventory"
            )
        drow = conn.execute(select(d).where(d.c.uuid == prow.device_uuid)).one()
        return prow.kind, drow, prow

    @staticmethod
    def _cordon_rows(conn: Connection, node: str, device_uuid: str) -> list[Row[Any]]:
        c = schema.cordons
        return list(
            conn.execute(
                select(c).where(
                    c.c.node == node,
                    or_(c.c.device_uuid == schema.NODE_CORDON, c.c.device_uuid == device_uuid),
                )
            )
        )

    @staticmethod
    def _lease_location(
        conn: Connection, resource_ids: list[str]
    ) -> dict[str, tuple[str, str, int]]:
        """resource id -> (kind, node, device index) for those still in the inventory."""
        if not resource_ids:
            return {}
        d, p = schema.devices, schema.partitions
        out: dict[str, tuple[str, str, int]] = {}
        for row in conn.execute(
            select(d.c.uuid, d.c.node, d.c.device_index).where(d.c.uuid.in_(resource_ids))
        ):
            out[row.uuid] = ("device", row.node, row.device_index)
        for row in conn.execute(
            select(p.c.uuid, p.c.kind, d.c.node, d.c.device_index)
            .select_from(p.join(d, and_(p.c.device_uuid == d.c.uuid)))
            .where(p.c.uuid.in_(resource_ids))
        ):
            out[row.uuid] = (row.kind, row.node, row.device_index)
        return out

    def _leases_from_rows(self, conn: Connection, rows: list[Row[Any]]) -> list[Lease]:
        where = self._lease_location(conn, [r.resource_id for r in rows])
        out = []
        for r in rows:
            kind, node, index = where.get(r.resource_id, (None, None, None))
            out.append(lease_record(r, kind, node, index))
        return out

    @staticmethod
    def _cordon_record(row: Row[Any], index: int | None) -> Cordon:
        return Cordon(
            node=row.node,
            index=index,
            device_uuid=row.device_uuid or None,
            reason=row.reason,
            created_at_s=row.created_at,
        )
