"""Incidents and their timelines, kept in the inventory's own database.

Why there: every host that can reach the inventory sees the same ledger, and the event
ids are a primary key, so two deliveries of one event (an automation fired twice, a
retried flow run) race on an INSERT of which exactly one wins. An incident is one
device's trouble from the first signal to the job resumed elsewhere; its timeline is the
story the operators get (risk seen -> cordoned -> checkpoint written -> job resumed).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import DeviceRecord
from gpuflow.hardware.inventory.engine import create_tables, default_url, make_engine, run_write
from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

TRIGGERS = ("predicted", "reactive", "manual")
# open: work in progress; waiting: some job is not running elsewhere yet (no healthy
# capacity of its SKU: kept running in place, or checkpointed and queued; or no way to
# start it here); done: every job moved (or none to move); failed: a step failed and was
# rolled back; rejected: bad input (unknown device...), nothing changed.
STATUSES = ("open", "waiting", "done", "failed", "rejected")
ACTIVE_STATUSES = ("open", "waiting")

# Timeline vocabulary (what the operators read).
RISK_SEEN = "risk seen"
DEVICE_LOST = "device lost"
JOB_CRASHED = "job crashed"
CORDONED = "cordoned"
SPARE_ACTIVATED = "spare activated"
CHECKPOINT_REQUESTED = "checkpoint requested"
CHECKPOINT_WRITTEN = "checkpoint written"
CHECKPOINT_FALLBACK = "fell back to periodic checkpoint"
CHECKPOINT_IN_PLACE = "checkpoint taken in place"
JOB_RESUMED = "job resumed"
JOB_QUEUED = "job queued"
CORDON_UNDONE = "cordon undone"
DUPLICATE = "duplicate signal"
NOTIFIED = "operators notified"
STEP_FAILED = "step failed"

metadata = MetaData()

incidents = Table(
    "gf_remediation_incidents",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("device_uuid", String(255), nullable=False, index=True),
    Column("node", String(255), nullable=False),
    Column("device_index", Integer, nullable=False),
    Column("sku", String(255), nullable=False),
    Column("trigger", String(16), nullable=False),
    Column("status", String(24), nullable=False),
    Column("reason", Text, nullable=False),
    Column("risk", Float, nullable=True),
    Column("features", JSON, nullable=False),
    Column("timeline", JSON, nullable=False),
    Column("jobs", JSON, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # Which run works on the incident now (a claim with an expiry, like a lease): two
    # signals for one device never run the steps side by side.
    Column("claimed_by", String(255), nullable=True),
    Column("claimed_until", Float, nullable=True),
)

signals = Table(
    "gf_remediation_signals",
    metadata,
    Column("event_id", String(255), primary_key=True),
    Column("incident_id", String(64), nullable=False),
    Column("seen_at", Float, nullable=False),
)


@dataclass(frozen=True)
class Incident:
    incident_id: str
    device_uuid: str
    node: str
    index: int
    sku: str
    trigger: str
    status: str
    reason: str
    risk: float | None
    features: dict[str, Any]
    timeline: tuple[dict[str, Any], ...]
    jobs: dict[str, dict[str, Any]]
    created_at_s: float
    updated_at_s: float

    @property
    def device(self) -> str:
        return f"{self.node}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["timeline"] = list(self.timeline)
        return d


def _record(row: Any) -> Incident:
    return Incident(
        incident_id=row.id,
        device_uuid=row.device_uuid,
        node=row.node,
        index=row.device_index,
        sku=row.sku,
        trigger=row.trigger,
        status=row.status,
        reason=row.reason,
        risk=row.risk,
        features=dict(row.features or {}),
        timeline=tuple(row.timeline or ()),
        jobs={k: dict(v) for k, v in (row.jobs or {}).items()},
        created_at_s=row.created_at,
        updated_at_s=row.updated_at,
    )


def _check_choice(value: object, valid: tuple[str, ...], what: str) -> str:
    if value not in valid:
        raise InvalidRequestError(f"{what} {value!r} is not one of: {', '.join(valid)}")
    return str(value)


class Ledger:
    """The remediation ledger over a SQLAlchemy URL (default: the inventory's SQLite)."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url if url is not None else default_url()
        self._engine = make_engine(self.url)
        create_tables(self._engine, metadata)

    def close(self) -> None:
        self._engine.dispose()

    def _write(self, work: Any) -> Any:
        return run_write(self._engine, work)

    @staticmethod
    def _row(conn: Connection, incident_id: str) -> Any:
        row = conn.execute(select(incidents).where(incidents.c.id == incident_id)).first()
        if row is None:
            raise InvalidRequestError(f"unknown remediation incident {incident_id!r}")
        return row

    # -- opening -----------------------------------------------------------------------
    def open_incident(
        self,
        device: DeviceRecord,
        trigger: str,
        reason: str,
        *,
        risk: float | None = None,
        features: dict[str, Any] | None = None,
        event_id: str | None = None,
        first_entry: tuple[str, str] | None = None,
        claim_by: str | None = None,
        claim_ttl_s: float = 900.0,
    ) -> tuple[Incident, str | None]:
        """(incident, duplicate): a new incident, or the one that already covers the signal.

        ``duplicate`` is None for a new incident, "event" when this very event id was
        seen before (nothing more must happen), "device" when the device already has an
        active incident (the signal joins it; its steps re-run idempotently).
        """
        _check_choice(trigger, TRIGGERS, "remediation trigger")
        now = time.time()

        def work(conn: Connection) -> tuple[Incident, str | None]:
            if event_id:
                seen = conn.execute(
                    select(signals.c.incident_id).where(signals.c.event_id == event_id)
                ).first()
                if seen is not None:
                    return _record(self._row(conn, seen.incident_id)), "event"
            active = conn.execute(
                select(incidents)
                .where(
                    incidents.c.device_uuid == device.uuid,
                    incidents.c.status.in_(ACTIVE_STATUSES),
                )
                .order_by(incidents.c.created_at.desc())
            ).first()
            if active is not None:
                incident_id, duplicate = active.id, "device"
                timeline = list(active.timeline) + [
                    _entry(DUPLICATE, f"{trigger}: {reason}".strip(": "), at_s=now)
                ]
                conn.execute(
                    update(incidents)
                    .where(incidents.c.id == incident_id)
                    .values(timeline=timeline, updated_at=now)
                )
            else:
                incident_id, duplicate = f"inc-{uuid.uuid4().hex[:12]}", None
                timeline = [_entry(*first_entry, at_s=now)] if first_entry else []
                conn.execute(
                    insert(incidents).values(
                        id=incident_id,
                        device_uuid=device.uuid,
                        node=device.node,
                        device_index=device.index,
                        sku=device.sku,
                        trigger=trigger,
                        status="open",
                        reason=reason,
                        risk=risk,
                        features=dict(features or {}),
                        timeline=timeline,
                        jobs={},
                        created_at=now,
                        updated_at=now,
                        claimed_by=claim_by,
                        claimed_until=now + claim_ttl_s if claim_by else None,
                    )
                )
            if event_id:
                # A concurrent delivery of the same event raises IntegrityError here;
                # run_write retries the whole transaction, which then finds it above.
                conn.execute(
                    insert(signals).values(event_id=event_id, incident_id=incident_id, seen_at=now)
                )
            return _record(self._row(conn, incident_id)), duplicate

        try:
            return self._write(work)
        except IntegrityError:  # pragma: no cover - every retry lost the race
            raise InvalidRequestError(f"event {event_id!r} is being handled concurrently") from None

    def join(self, incident_id: str, event_id: str | None, detail: str) -> str:
        """Attach a signal to an existing incident: "event" if this event id was seen
        before (nothing recorded), else "device" (the timeline notes the repeat)."""
        now = time.time()

        def work(conn: Connection) -> str:
            row = self._row(conn, incident_id)
            if event_id:
                seen = conn.execute(
                    select(signals.c.incident_id).where(signals.c.event_id == event_id)
                ).first()
                if seen is not None:
                    return "event"
                conn.execute(
                    insert(signals).values(event_id=event_id, incident_id=incident_id, seen_at=now)
                )
            timeline = list(row.timeline) + [_entry(DUPLICATE, detail, at_s=now)]
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(timeline=timeline, updated_at=now)
            )
            return "device"

        return self._write(work)

    def incident_for_event(self, event_id: str) -> Incident | None:
        with self._engine.connect() as conn:
            seen = conn.execute(
                select(signals.c.incident_id).where(signals.c.event_id == event_id)
            ).first()
            return None if seen is None else _record(self._row(conn, seen.incident_id))

    def claim(self, incident_id: str, owner: str, ttl_s: float = 900.0) -> bool:
        """Take the incident for ``owner`` (a flow run) unless another live claim holds it;
        the same owner claiming again extends its claim."""
        now = time.time()
        c = incidents.c

        def work(conn: Connection) -> bool:
            self._row(conn, incident_id)
            result = conn.execute(
                update(incidents)
                .where(
                    c.id == incident_id,
                    (c.claimed_by.is_(None)) | (c.claimed_until < now) | (c.claimed_by == owner),
                )
                .values(claimed_by=owner, claimed_until=now + ttl_s)
            )
            return result.rowcount == 1

        return self._write(work)

    def release_claim(self, incident_id: str, owner: str) -> None:
        c = incidents.c
        self._write(
            lambda conn: conn.execute(
                update(incidents)
                .where(c.id == incident_id, c.claimed_by == owner)
                .values(claimed_by=None, claimed_until=None)
            )
        )

    # -- recording ---------------------------------------------------------------------
    def add(
        self,
        incident_id: str,
        what: str,
        detail: str = "",
        *,
        job_id: str | None = None,
        at_s: float | None = None,
    ) -> Incident:
        """Append one entry to the timeline."""

        def work(conn: Connection) -> Incident:
            row = self._row(conn, incident_id)
            timeline = list(row.timeline) + [_entry(what, detail, job_id=job_id, at_s=at_s)]
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(timeline=timeline, updated_at=time.time())
            )
            return _record(self._row(conn, incident_id))

        return self._write(work)

    def set_job(self, incident_id: str, job_id: str, **fields: Any) -> Incident:
        """Merge ``fields`` (JSON values) into what the incident knows about a job."""

        def work(conn: Connection) -> Incident:
            row = self._row(conn, incident_id)
            jobs = {k: dict(v) for k, v in (row.jobs or {}).items()}
            jobs[job_id] = {**jobs.get(job_id, {}), **fields}
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(jobs=jobs, updated_at=time.time())
            )
            return _record(self._row(conn, incident_id))

        return self._write(work)

    def set_status(self, incident_id: str, status: str) -> Incident:
        _check_choice(status, STATUSES, "incident status")

        def work(conn: Connection) -> Incident:
            self._row(conn, incident_id)
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(status=status, updated_at=time.time())
            )
            return _record(self._row(conn, incident_id))

        return self._write(work)

    # -- reading -----------------------------------------------------------------------
    def incident(self, incident_id: str) -> Incident:
        with self._engine.connect() as conn:
            return _record(self._row(conn, incident_id))

    def incidents(self, device_uuid: str | None = None, limit: int = 100) -> list[Incident]:
        """Newest first, optionally of one device."""
        query = select(incidents).order_by(incidents.c.created_at.desc()).limit(limit)
        if device_uuid is not None:
            query = query.where(incidents.c.device_uuid == device_uuid)
        with self._engine.connect() as conn:
            return [_record(r) for r in conn.execute(query)]


def _entry(
    what: str, detail: str = "", *, job_id: str | None = None, at_s: float | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"at_s": time.time() if at_s is None else float(at_s), "what": what}
    if detail:
        entry["detail"] = detail
    if job_id:
        entry["job_id"] = job_id
    return entry
