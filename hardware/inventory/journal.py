"""The change journal: what changed in the inventory, in the order it committed.

A scheduler pass used to read the whole inventory (10,000 devices, every lease and job)
to learn that a handful of rows had changed. Triggers in the database append one
gf_changes row per change a pass decides on, so a reader can ask what changed since
``rev`` and read only that (feed.py follows it):

- ``job``: a jobs-registry row inserted, updated or deleted (key: the job id);
- ``lease``: a lease taken, taken over, moved to another attempt or ended (key: the
  resource id). A renewal only moves the expiry and is not journaled: a reader that
  cached a lease checks it again when the expiry it knows has passed;
- ``fleet``: a node, device, partition or cordon appeared, went, or changed what
  placement reads (health, presence, role, shape). Telemetry and last-seen stamps are
  not changes: every sync and every monitor sample would be one.

Triggers and not calls in each writer: every write path, present and future (a
migration, an operator's UPDATE by hand), is journaled, or none is.

On SQLite writers are serialised, so revs commit in order and never leave gaps. On
PostgreSQL a rev is drawn from a sequence when the row is written, so a transaction can
commit after a later rev is visible, and a rolled-back one leaves a gap for good: the
feed waits for gaps a while before it gives up on them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuflow.hardware.inventory import schema
from gpuflow.hardware.inventory.base import StoreBase, check_index, in_chunks
from gpuflow.hardware.inventory.jobs import job_record
from gpuflow.hardware.inventory.leases import LeaseMixin
from gpuflow.hardware.inventory.records import JobRecord, Lease
from gpuflow.hardware.inventory.triggers import EPOCH_KEY
from sqlalchemy import Connection, delete, func, insert, select, update

PRUNED_COUNTER = "journal-pruned"  # revs up to its value were deleted by prune_journal


@dataclass(frozen=True)
class JournalBatch:
    """Journal rows after a rev, ascending, and how far the journal was pruned."""

    rows: tuple[tuple[int, str, str], ...]  # (rev, entity, key)
    pruned_through: int
    epoch: str  # the journal's identity (triggers.EPOCH_KEY)


class JournalMixin(StoreBase):
    def journal_since(self, after: int) -> JournalBatch:
        """Every journal row with a rev above ``after``."""
        check_index(after, "journal rev")
        c = schema.changes
        with self._read() as conn:
            rows = conn.execute(
                select(c.c.rev, c.c.entity, c.c.key).where(c.c.rev > after).order_by(c.c.rev)
            )
            batch = tuple((int(r.rev), r.entity, r.key) for r in rows)
            return JournalBatch(batch, self._pruned_through(conn), self._epoch(conn))

    def journal_tail(self, window: int) -> tuple[int, frozenset[int], int, str]:
        """(newest rev, the revs present among the ``window`` newest, pruned-through,
        epoch): where a reader that is about to read everything starts following from."""
        check_index(window, "journal window")
        c = schema.changes
        with self._read() as conn:
            newest = int(conn.execute(select(func.max(c.c.rev))).scalar() or 0)
            revs = conn.execute(select(c.c.rev).where(c.c.rev > newest - window)).scalars()
            present = frozenset(int(r) for r in revs)
            return newest, present, self._pruned_through(conn), self._epoch(conn)

    def prune_journal(self, keep: int) -> int:
        """Delete all but the ``keep`` newest revs' rows; returns how many went. A reader
        that had not read the deleted ones finds out (pruned-through) and reads anew."""
        check_index(keep, "journal rows to keep")
        c, k = schema.changes, schema.counters

        def work(conn: Connection) -> int:
            newest = int(conn.execute(select(func.max(c.c.rev))).scalar() or 0)
            through = newest - keep
            if through <= self._pruned_through(conn):
                return 0
            gone = int(conn.execute(delete(c).where(c.c.rev <= through)).rowcount)
            moved = conn.execute(
                update(k).where(k.c.name == PRUNED_COUNTER).values(value=through)
            ).rowcount
            if not moved:  # the first prune; a concurrent first one: run_write retries
                conn.execute(insert(k).values(name=PRUNED_COUNTER, value=through))
            return gone

        return self._write(work)

    @staticmethod
    def _epoch(conn: Connection) -> str:
        m = schema.meta
        return str(conn.execute(select(m.c.value).where(m.c.key == EPOCH_KEY)).scalar() or "")

    @staticmethod
    def _pruned_through(conn: Connection) -> int:
        k = schema.counters
        value = conn.execute(select(k.c.value).where(k.c.name == PRUNED_COUNTER)).scalar()
        return int(value or 0)

    # -- what a follower reads for the keys the journal named ------------------------------
    def jobs_by_id(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        """The registry rows of ``job_ids`` that exist (a deleted job is missing)."""
        ids = sorted(set(job_ids))
        j = schema.jobs
        out: dict[str, JobRecord] = {}
        with self._read() as conn:
            for chunk in in_chunks(ids):
                for row in conn.execute(select(j).where(j.c.job_id.in_(chunk))):
                    record = job_record(row)
                    out[record.job_id] = record
        return out

    def leases_on(self, resource_ids: Iterable[str]) -> list[Lease]:
        """The unexpired leases on ``resource_ids``, located (see ``leases``)."""
        ids = sorted(set(resource_ids))
        l_t = schema.leases
        out: list[Lease] = []
        with self._read() as conn:
            now = self._clock()
            for chunk in in_chunks(ids):
                out += LeaseMixin._located_leases(
                    conn, l_t.c.resource_id.in_(chunk), l_t.c.expires_at > now
                )
        return out
