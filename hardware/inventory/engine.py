"""Engines and transactions that stay correct when several processes share the store.

SQLite: WAL (readers never block the writer), a busy timeout (writers queue instead of
failing), foreign keys on, and every write transaction opened with BEGIN IMMEDIATE so the
write lock is taken up front. A deferred BEGIN that reads and then writes can fail to
upgrade its lock under contention ("database is locked", without waiting); IMMEDIATE
serialises writers at the start, which is what makes read-check-write inside one
transaction safe. pysqlite's own implicit BEGIN is switched off so ours is the one used.

PostgreSQL (or any other server): default isolation; correctness comes from primary keys,
unique constraints and compare-and-swap updates, with the transaction retried on a
unique-key race, a serialisation failure or a deadlock.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.home import gpuflow_home
from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.triggers import install_triggers
from sqlalchemy import (
    Connection,
    Engine,
    MetaData,
    create_engine,
    event,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

BUSY_TIMEOUT_S = 30.0
SQLITE_BEGIN = "gpuflow_sqlite_begin"  # execution option: "IMMEDIATE" (default) or "DEFERRED"
_RETRY_SQLSTATES = {"40001", "40P01"}  # serialization_failure, deadlock_detected
WRITE_ATTEMPTS = 8

T = TypeVar("T")


def default_url() -> str:
    """SQLite file inventory.db in GPUFLOW_HOME."""
    return f"sqlite:///{gpuflow_home() / 'inventory.db'}"


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and BEGIN IMMEDIATE writes."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # ArgumentError and friends: say which URL was wrong
        raise InvalidRequestError(f"inventory URL {url!r} is not a database URL: {exc}") from exc
    if parsed.get_backend_name() != "sqlite":
        # pre_ping: a PostgreSQL restart must not poison the pool for a long-lived worker.
        return create_engine(parsed, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see module doc)
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            # Persistent in the file once set; a no-op for later connections. Switching a
            # fresh file to WAL takes an exclusive lock, and SQLite answers "database is
            # locked" at once (no busy wait) when processes open it together: retry.
            deadline = time.monotonic() + BUSY_TIMEOUT_S
            while True:
                try:
                    cursor.execute("PRAGMA journal_mode = WAL")
                    break
                except sqlite3.OperationalError as exc:
                    if "locked" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        mode = conn.get_execution_options().get(SQLITE_BEGIN, "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _retryable(exc: DBAPIError) -> bool:
    if isinstance(exc, IntegrityError):
        return True  # a concurrent insert of the same key: re-read and decide again
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return code in _RETRY_SQLSTATES


def run_write(engine: Engine, work: Callable[[Connection], T], attempts: int = WRITE_ATTEMPTS) -> T:
    """Run ``work`` in one write transaction; retry it whole on a lost race.

    ``work`` must be re-runnable: it reads what it needs inside the transaction.
    Errors it raises on purpose (InvalidRequestError, LeaseConflictError...) roll the
    transaction back and propagate unchanged.
    """
    for attempt in range(attempts):
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as exc:
            if attempt + 1 >= attempts or not _retryable(exc):
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def create_tables(
    engine: Engine, tables: MetaData, then: Callable[[Connection], None] | None = None
) -> None:
    """Create ``tables`` if missing (then run ``then`` in the same transaction), once, even
    when several processes or hosts start together on a fresh database."""

    def create(conn: Connection) -> None:
        tables.create_all(conn, checkfirst=True)
        if then is not None:
            then(conn)

    for attempt in range(3):
        try:
            run_write(engine, create)
            return
        except (ProgrammingError, OperationalError):
            # PostgreSQL: two processes creating the same table race in the catalogue
            # (duplicate type/relation). The loser retries and then finds the tables.
            if is_sqlite(engine) or attempt == 2:
                raise


# Version n -> n + 1: statements run in order inside the schema transaction.
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "ALTER TABLE gf_jobs ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE gf_leases ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE gf_leases ADD COLUMN token INTEGER NOT NULL DEFAULT 0",
        # The old "checkpointed" (stopped on request, waiting to be re-queued) is "stopped".
        "UPDATE gf_jobs SET state = 'stopped' WHERE state = 'checkpointed'",
    ),
    2: (),  # gf_changes is a new table (create_all made it); its triggers follow
}


def migrate(conn: Connection, version: int) -> None:
    """Bring a database at ``version`` up to schema.SCHEMA_VERSION (new tables were made
    by create_all already; this adds columns to the old ones)."""
    for v in range(version, schema.SCHEMA_VERSION):
        for statement in MIGRATIONS[v]:
            conn.execute(text(statement))
    install_triggers(conn)
    conn.execute(
        update(schema.meta)
        .where(schema.meta.c.key == "schema_version")
        .values(value=str(schema.SCHEMA_VERSION))
    )


def ensure_schema(engine: Engine) -> None:
    """Create the inventory's tables on first use, check the schema version and migrate
    an older database."""

    def check_version(conn: Connection) -> None:
        version = conn.execute(
            select(schema.meta.c.value)
            .where(schema.meta.c.key == "schema_version")
            .with_for_update()  # PostgreSQL: one process migrates, the others then see it
        ).scalar_one_or_none()
        if version is None:
            conn.execute(
                insert(schema.meta).values(key="schema_version", value=str(schema.SCHEMA_VERSION))
            )
            install_triggers(conn)  # after the insert: a process that lost the race retries
        elif int(version) > schema.SCHEMA_VERSION:
            raise InvalidRequestError(
                f"inventory schema version {version} is newer than this gpuflow "
                f"understands ({schema.SCHEMA_VERSION}); upgrade gpuflow"
            )
        elif int(version) < schema.SCHEMA_VERSION:
            migrate(conn, int(version))

    create_tables(engine, schema.metadata, check_version)
