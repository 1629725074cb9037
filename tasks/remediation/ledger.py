"""Incidents and their timelines, kept in the inventory's own database.

Why there: every host that can reach the inventory sees the same ledger, and the event
ids are a primary key, so two deliveries of one event (an automation fired twice, a
retried flow run) race on an INSERT of which exactly one wins. An incident is one
device's trouble from the first signal to the job resumed elsewhere; its timeline is the
story the operators get (risk seen -> cordoned -> checkpoint written -> job resumed).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import DeviceRecord, LeaseLostError
from gpuflow.hardware.inventory.engine import create_tables, default_url, make_engine, run_write
from gpuflow.hardware.inventory.keeper import LeaseKeeper
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
    inspect,
    select,
    text,
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

# Where an open incident's run is: each step moves it forward, so a run that takes over an
# abandoned incident (the reconciler, a redelivered event) knows how far the dead one got.
# Every step is idempotent; the phase decides between finishing and rolling back.
OPENED, ISOLATED, CHECKPOINTING, MIGRATING, CLOSED = (
    "opened",
    "isolated",
    "checkpointing",
    "migrating",
    "closed",
)
PHASES = (OPENED, ISOLATED, CHECKPOINTING, MIGRATING, CLOSED)

# A run holds its incident by a claim renewed every TTL / 3 (a LeaseKeeper over
# ``ClaimRenewer``): a run that dies lets go within the TTL, not after a fixed 15 min.
CLAIM_TTL_S = 60.0
CLAIM_TTL_ENV = "GPUFLOW_INCIDENT_CLAIM_TTL_S"


def incident_claim_ttl_s() -> float:
    """The claim TTL: CLAIM_TTL_S, or GPUFLOW_INCIDENT_CLAIM_TTL_S where set."""
    raw = os.environ.get(CLAIM_TTL_ENV)
    if raw is None:
        return CLAIM_TTL_S
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 0.5 <= ttl <= 3600:
        raise InvalidRequestError(f"{CLAIM_TTL_ENV}={raw!r}: a number of seconds in [0.5, 3600]")
    return ttl


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
JOB_ENDED = "job ended"
TAKEN_OVER = "taken over"
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
    Column("phase", String(16), nullable=False, server_default=OPENED),
    Column("takeovers", Integer, nullable=False, server_default="0"),
)
# Ledgers written before phases existed get the two columns (each added if missing).
_ADDED_COLUMNS = (
    ("phase", f"VARCHAR(16) NOT NULL DEFAULT '{OPENED}'"),
    ("takeovers", "INTEGER NOT NULL DEFAULT 0"),
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
    phase: str = OPENED
    claimed_by: str | None = None
    claimed_until_s: float | None = None
    takeovers: int = 0

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
        phase=row.phase,
        claimed_by=row.claimed_by,
        claimed_until_s=row.claimed_until,
        takeovers=row.takeovers,
    )


def _check_choice(value: object, valid: tuple[str, ...], what: str) -> str:
    if value not in valid:
        raise InvalidRequestError(f"{what} {value!r} is not one of: {', '.join(valid)}")
    return str(value)


class Ledger:
    """The remediation ledger over a SQLAlchemy URL (default: the inventory's SQLite)."""

    def __init__(self, url: str | None = None, clock: Any = time.time) -> None:
        self.url = url if url is not None else default_url()
        self._engine = make_engine(self.url)
        self._clock = clock  # claims expire by it (a test moves it forward)
        create_tables(self._engine, metadata, then=_add_missing_columns)

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
        claim_ttl_s: float | None = None,
    ) -> tuple[Incident, str | None]:
        """(incident, duplicate): a new incident, or the one that already covers the signal.

        ``duplicate`` is None for a new incident, "event" when this very event id was
        seen before (nothing more must happen), "device" when the device already has an
        active incident (the signal joins it; its steps re-run idempotently).
        """
        _check_choice(trigger, TRIGGERS, "remediation trigger")
        now = self._clock()
        ttl_s = claim_ttl_s or incident_claim_ttl_s()

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
                        claimed_until=now + ttl_s if claim_by else None,
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

    def claim(self, incident_id: str, owner: str, ttl_s: float | None = None) -> bool:
        """Take the incident for ``owner`` (a flow run) unless another live claim holds it;
        the same owner claiming again extends its claim."""
        return self._claim(incident_id, owner, ttl_s or incident_claim_ttl_s(), takeover=False)

    def take_over(self, incident_id: str, owner: str, detail: str) -> bool:
        """Claim an open incident whose run is gone (its claim lapsed or was let go), count
        the takeover and note it on the timeline; False when a live run holds it or it is
        no longer open."""
        if not self._claim(incident_id, owner, incident_claim_ttl_s(), takeover=True):
            return False
        self.add(incident_id, TAKEN_OVER, detail)
        return True

    def _claim(self, incident_id: str, owner: str, ttl_s: float, *, takeover: bool) -> bool:
        now = self._clock()
        c = incidents.c

        def work(conn: Connection) -> bool:
            row = self._row(conn, incident_id)
            free = (c.claimed_by.is_(None)) | (c.claimed_until < now)
            query = update(incidents).where(c.id == incident_id)
            values: dict[str, Any] = {"claimed_by": owner, "claimed_until": now + ttl_s}
            if takeover:
                query = query.where(free, c.status == "open")
                values["takeovers"] = row.takeovers + 1
            else:
                query = query.where(free | (c.claimed_by == owner))
            return conn.execute(query.values(**values)).rowcount == 1

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

    def claimed_by(self, owner: str) -> list[Incident]:
        """The incidents ``owner`` holds now (a crash hook lets them go)."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(incidents).where(incidents.c.claimed_by == owner))
            return [_record(r) for r in rows]

    def abandoned(self) -> list[Incident]:
        """Open incidents no live run holds: their run crashed or was killed mid-way."""
        c = incidents.c
        now = self._clock()
        query = (
            select(incidents)
            .where(c.status == "open", (c.claimed_by.is_(None)) | (c.claimed_until < now))
            .order_by(c.created_at)
        )
        with self._engine.connect() as conn:
            return [_record(r) for r in conn.execute(query)]

    def set_phase(self, incident_id: str, phase: str) -> Incident:
        """Move the incident's run forward to ``phase`` (never back)."""
        _check_choice(phase, PHASES, "incident phase")

        def work(conn: Connection) -> Incident:
            row = self._row(conn, incident_id)
            if PHASES.index(phase) > PHASES.index(row.phase):
                conn.execute(
                    update(incidents)
                    .where(incidents.c.id == incident_id)
                    .values(phase=phase, updated_at=self._clock())
                )
            return _record(self._row(conn, incident_id))

        return self._write(work)

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

        # Any status but "open" ends the run's work on it.
        phase = {} if status == "open" else {"phase": CLOSED}

        def work(conn: Connection) -> Incident:
            self._row(conn, incident_id)
            conn.execute(
                update(incidents)
                .where(incidents.c.id == incident_id)
                .values(status=status, updated_at=time.time(), **phase)
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


class ClaimRenewer:
    """The ledger as a LeaseKeeper's renewer: a run's claims on its incidents are its
    "leases", renewed on the keeper's timer; a claim another run took counts as lost."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def renew_leases(
        self, owner: str, attempt: int, resource_ids: Sequence[str], ttl_s: float
    ) -> int:
        return sum(self.ledger.claim(iid, owner, ttl_s) for iid in resource_ids)


ClaimKeeper = LeaseKeeper
# What ClaimKeeper.check() raises once another run took the incident over.
ClaimLostError = LeaseLostError


def claim_keeper(ledger: Ledger, incident_id: str, owner: str) -> ClaimKeeper:
    """Keeps ``owner``'s claim on the incident alive while its run works (a context)."""
    return LeaseKeeper(ClaimRenewer(ledger), owner, 0, [incident_id], incident_claim_ttl_s())


def _add_missing_columns(conn: Connection) -> None:
    present = {col["name"] for col in inspect(conn).get_columns(incidents.name)}
    for name, ddl in _ADDED_COLUMNS:
        if name not in present:
            conn.execute(text(f"ALTER TABLE {incidents.name} ADD COLUMN {name} {ddl}"))


def _entry(
    what: str, detail: str = "", *, job_id: str | None = None, at_s: float | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"at_s": time.time() if at_s is None else float(at_s), "what": what}
    if detail:
        entry["detail"] = detail
    if job_id:
        entry["job_id"] = job_id
    return entry
