"""The change journal's triggers: every change a scheduler pass decides on is appended
to gf_changes by the database itself (what is and is not a change: journal.py)."""

from __future__ import annotations

import uuid

from gpuflow.hardware.inventory import schema
from sqlalchemy import Connection, delete, insert, text

JOB, LEASE, FLEET = "job", "lease", "fleet"
EPOCH_KEY = "journal_epoch"  # in gf_meta: new whenever the journal starts anew

# (table, entity, key column, columns whose change is a change; None: every update)
_JOURNALED: tuple[tuple[str, str, str, tuple[str, ...] | None], ...] = (
    ("gf_jobs", JOB, "job_id", None),
    ("gf_leases", LEASE, "resource_id", ("owner", "attempt", "token", "acquired_at")),
    ("gf_nodes", FLEET, "name", ("region", "role")),
    (
        "gf_devices",
        FLEET,
        "uuid",
        (
            "node",
            "device_index",
            "vendor",
            "sku",
            "memory_total_mb",
            "partition_kinds",
            "present",
            "healthy",
        ),
    ),
    ("gf_partitions", FLEET, "uuid", None),
    ("gf_cordons", FLEET, "node", None),
)


def _sqlite_triggers() -> list[str]:
    out = []
    for table, entity, key, watched in _JOURNALED:
        for op, row in (("INSERT", "NEW"), ("UPDATE", "NEW"), ("DELETE", "OLD")):
            when = ""
            if op == "UPDATE" and watched:
                when = " WHEN " + " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in watched)
            out.append(
                f"CREATE TRIGGER IF NOT EXISTS {table}_journal_{op.lower()} AFTER {op} ON "
                f"{table}{when} BEGIN INSERT INTO gf_changes (entity, key) VALUES "
                f"('{entity}', {row}.{key}); END"
            )
    return out


_PG_FUNCTION = """
CREATE OR REPLACE FUNCTION gf_journal() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO gf_changes (entity, key) VALUES (TG_ARGV[0], to_jsonb(OLD) ->> TG_ARGV[1]);
        RETURN OLD;
    END IF;
    INSERT INTO gf_changes (entity, key) VALUES (TG_ARGV[0], to_jsonb(NEW) ->> TG_ARGV[1]);
    RETURN NEW;
END $$
"""


def _postgres_triggers() -> list[str]:
    out = [_PG_FUNCTION]
    for table, entity, key, watched in _JOURNALED:
        args = f"'{entity}', '{key}'"
        when = ""
        if watched:
            when = (
                " WHEN (" + " OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in watched) + ")"
            )
        for name, event, cond in (
            (f"{table}_journal_insdel", "INSERT OR DELETE", ""),
            (f"{table}_journal_update", "UPDATE", when),
        ):
            out.append(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            out.append(
                f"CREATE TRIGGER {name} AFTER {event} ON {table} FOR EACH ROW{cond} "
                f"EXECUTE FUNCTION gf_journal({args})"
            )
    return out


def install_triggers(conn: Connection) -> None:
    """Create the journal's triggers (idempotent), inside the schema transaction, and
    give the journal a new epoch: a reader that followed an earlier journal on this URL
    (its tables dropped and made again) finds out instead of waiting for revs it saw."""
    statements = _sqlite_triggers() if conn.dialect.name == "sqlite" else _postgres_triggers()
    for statement in statements:
        conn.execute(text(statement))
    meta = schema.meta
    conn.execute(delete(meta).where(meta.c.key == EPOCH_KEY))
    conn.execute(insert(meta).values(key=EPOCH_KEY, value=uuid.uuid4().hex))
