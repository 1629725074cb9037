"""The scheduler service's state and its writes: what it read of the inventory (kept
up to date by refresh.py), and decisions written back through the job lifecycle
(compare-and-swap on the (state, attempt) read) and leases owned by (job, attempt). The
pass logic is in reap.py and service.py; the vocabulary they share is here."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.hardware.inventory import (
    ControlRequest,
    Inventory,
    JobRecord,
    JobState,
    Lease,
    LeaseError,
)
from gpuflow.hardware.inventory.feed import ChangeFeed
from gpuflow.tasks.scheduling.engine import Engine, Job
from gpuflow.tasks.scheduling.lease_cache import LeaseCache
from gpuflow.tasks.scheduling.model import DONE_STATES, JobRequest, SchedulerConfig

log = logging.getLogger(__name__)

SPEC_KIND = "gpuflow.schedule/v1"
STOP = "checkpoint-and-stop"
ACK_GRACE_S = 30.0  # a stop acknowledged this long ago is done even without its last write
PASS_LOCK = "scheduler-pass"
PASS_LOCK_TTL_S = 120.0  # one round of a pass is far shorter; a crashed holder frees it
PASS_LOCK_WAIT_S = 30.0  # how long a pass waits for another one before reporting it
STOP_GRACE_S = 300.0  # a victim silent this long after a stop request is force-stopped
SEQ_COUNTER = "scheduler-seq"
STOPPED_STATES = (JobState.STOPPED, JobState.LOST)  # waiting to be re-queued by a pass
QUARANTINED = "quarantined"  # the phase of a job whose stored request no longer validates
RENEW_AFTER = 1 / 3  # of its TTL gone, a lease the service keeps is renewed (as keepers do)


def is_scheduled(record: JobRecord) -> bool:
    return record.spec.get("kind") == SPEC_KIND


def checkpoint_step(checkpoint_id: str | None) -> int | None:
    """The step of a checkpoint id like ``step-000000030`` (None for other names)."""
    if not checkpoint_id or not checkpoint_id.startswith("step-"):
        return None
    try:
        return int(checkpoint_id.split("-", 1)[1])
    except ValueError:
        return None


def invalid_message(exc: Exception) -> str:
    return f"stored request does not validate: {' '.join(str(exc).split())[:300]}"


@dataclass
class PassReport:
    placed: list[dict[str, Any]] = field(default_factory=list)
    preemptions: list[dict[str, Any]] = field(default_factory=list)
    requeued: list[str] = field(default_factory=list)
    repartitioned: list[dict[str, Any]] = field(default_factory=list)
    growths: list[dict[str, Any]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    stopping: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)  # victims stopped without an answer
    quarantined: list[dict[str, Any]] = field(default_factory=list)  # {job_id, error}
    errors: list[str] = field(default_factory=list)
    decide_s: float = 0.0

    @property
    def to_start(self) -> list[str]:
        return [p["job_id"] for p in self.placed]

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items()}


@dataclass(frozen=True)
class JobView:
    """One scheduled job as the CLI and artifacts show it."""

    job_id: str
    state: str  # engine vocabulary
    priority: int
    request: str
    pool: str
    resource_ids: tuple[str, ...]
    last_checkpoint_id: str | None
    preemptions: int
    submitted_at_s: float
    position: int | None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class ServiceState:
    """Engine, snapshot and writes of one SchedulerService (see service.py)."""

    def __init__(
        self,
        inventory: Inventory,
        backend: Backend | None = None,
        config: SchedulerConfig | None = None,
        now: Callable[[], float] = time.time,
        *,
        stop_grace_s: float = STOP_GRACE_S,
        lock_wait_s: float = PASS_LOCK_WAIT_S,
    ) -> None:
        if not stop_grace_s > 0 or not lock_wait_s >= 0:
            raise InvalidRequestError(
                f"stop_grace_s must be > 0 and lock_wait_s >= 0, got {stop_grace_s!r}, "
                f"{lock_wait_s!r}"
            )
        self.stop_grace_s = float(stop_grace_s)
        self.lock_wait_s = float(lock_wait_s)
        self.inventory = inventory
        self.backend = backend
        self.config = config or SchedulerConfig.from_env()
        self._now = now
        self.engine: Engine = Engine(self.config)
        self._records: dict[str, JobRecord] = {}
        self._owned: dict[str, set[str]] = {}  # owner -> resource ids it leases (snapshot)
        self._lease_of: dict[str, Lease] = {}
        self._stale: list[Lease] = []  # leases of an older attempt: fenced in the reap
        self._stale_of: dict[str, Lease] = {}
        self._cache = LeaseCache()  # the leases as last read
        self._feed = ChangeFeed(inventory)
        self._built = False  # whether self.engine reflects the inventory (a refresh ran)
        self._passes_since_prune = 0
        self._dirty: set[str] = set()  # jobs a pass decided on: restored anew next time
        self._reap_all = True  # the next reap looks at every record (after a rebuild)
        self._to_reap: set[str] = set()  # else these (touched by the last refresh)
        self._controls: dict[int, ControlRequest] = {}  # stop requests the reap read
        self.rebuilds = 0  # refreshes that read the whole inventory (the first, fleet changes)
        self._invalid: dict[str, str] = {}  # job id -> why its stored request is invalid
        self._requests: dict[str, tuple[Any, JobRequest]] = {}  # job id -> (stored, valid)
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    # ================================================================= reading
    @staticmethod
    def _sched(record: JobRecord) -> dict[str, Any]:
        return dict(record.info.get("sched") or {})

    @staticmethod
    def _request(record: JobRecord) -> JobRequest:
        return JobRequest.model_validate(record.spec["request"])

    def _validated(self, record: JobRecord) -> JobRequest:
        """The record's request, validated the first time this service sees it as stored
        now (JobRequest is frozen: one instance serves every pass)."""
        stored = record.spec["request"]
        cached = self._requests.get(record.job_id)
        if cached is not None and cached[0] == stored:
            return cached[1]
        request = self._request(record)
        self._requests[record.job_id] = (stored, request)
        return request

    @classmethod
    def _invalid_request(cls, record: JobRecord) -> str | None:
        """Why a stored request no longer validates (a newer/older gpuflow wrote it, or
        someone edited the row), or None when it does."""
        try:
            cls._request(record)
        except (ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError too
            return invalid_message(exc)
        return None

    # ================================================================= writing
    def _write(
        self,
        job_id: str,
        state: str | None,
        *,
        resource_ids: list[str] | None = None,
        attempt: int | None = None,
        via: str = JobState.STOPPED,
        **sched: Any,
    ) -> JobRecord:
        """Write a job through the lifecycle, compare-and-swap on what this pass read:
        ``state`` None (or the state read) updates fields only; ``placed`` starts
        ``attempt``; ``queued`` from an active attempt goes there ``via`` stopped or lost."""
        snap = self._records.get(job_id) or self.inventory.job(job_id)
        merged = {**self._sched(self.inventory.job(job_id)), **sched}
        fields: dict[str, Any] = {"sched": merged}
        if resource_ids is not None:
            fields["resource_ids"] = resource_ids
        inv = self.inventory
        target = snap.state if state is None else JobState(state)
        if target == snap.state:
            out = inv.transition_job(job_id, expect_attempt=snap.attempt, **fields)
        elif target == JobState.PLACED:
            assert attempt is not None and resource_ids is not None
            fields.pop("resource_ids")
            out = inv.place_job(
                job_id, resource_ids, attempt=attempt, expect_state=snap.state, **fields
            )
        elif target == JobState.QUEUED:
            out = inv.requeue_job(job_id, via, expect_attempt=snap.attempt, **fields)
        else:
            out = inv.transition_job(
                job_id, target, expect_state=snap.state, expect_attempt=snap.attempt, **fields
            )
        self._records[job_id] = out
        return out

    def _attempt(self, job_id: str) -> int:
        record = self._records.get(job_id)
        return record.attempt if record is not None else 0

    def _lease(self, rid: str, owner: str, attempt: int) -> None:
        self.inventory.acquire_lease(rid, owner, self.config.lease_ttl_s, attempt=attempt)
        self._owned.setdefault(owner, set()).add(rid)

    def _unlease_all(self, rids: set[str] | list[str], owner: str) -> None:
        """Give back several of ``owner``'s leases in one statement."""
        self.inventory.release_leases(sorted(rids), owner)
        for rid in rids:
            self._owned.get(owner, set()).discard(rid)

    def _unlease(self, rid: str, owner: str) -> None:
        self.inventory.release_lease(rid, owner)
        self._owned.get(owner, set()).discard(rid)

    def _sync_leases(self, job: Job, report: PassReport, attempt: int | None = None) -> bool:
        """Make the job's leases exactly its allocation and holds, for ``attempt`` (default
        its current one; a newer one moves the leases it already has to that attempt).
        False if one could not be taken (someone raced us); what was taken for it here is
        then given back."""
        current = self._attempt(job.job_id)
        at = current if attempt is None else attempt
        want = set(job.allocation) | set(job.holds)
        have = set(self._owned.get(job.job_id, set()))
        if have - want:
            self._unlease_all(have - want, job.job_id)
        todo = sorted(want if at != current else want - have)
        if todo:
            try:
                self.inventory.acquire_leases(todo, job.job_id, self.config.lease_ttl_s, attempt=at)
            except (LeaseError, InvalidRequestError):
                pass  # nothing written: one at a time below names the one and keeps the rest
            else:
                self._owned.setdefault(job.job_id, set()).update(todo)
                return True
        taken: list[str] = []
        for rid in todo:
            try:
                self._lease(rid, job.job_id, at)
                if rid not in have:
                    taken.append(rid)
            except (LeaseError, InvalidRequestError) as exc:
                report.errors.append(f"{job.job_id}: could not lease {rid}: {exc}")
                for t in taken:
                    self._unlease(t, job.job_id)
                return False
        return True

    def _renew_all(self, engine: Engine) -> None:
        """Keep what the service holds for jobs (see _to_renew), each lease once a third of
        its TTL has gone as this service last read or renewed it, all due ones in one
        inventory write: not every lease every pass."""
        now = self._now()
        ttl = self.config.lease_ttl_s
        renewals: dict[tuple[str, int], list[str]] = {}
        for job in engine.jobs.values():
            if not job.holds or job.state in DONE_STATES:
                continue
            renew = sorted(r for r in self._to_renew(job) if self._renewal_due(r, now, ttl))
            if renew:
                renewals[(job.job_id, self._attempt(job.job_id))] = renew
        if not renewals:
            return
        renewed = self.inventory.renew_leases_of(renewals, ttl)
        for (job_id, attempt), renew in renewals.items():
            if renewed[(job_id, attempt)] < len(renew):
                log.warning(
                    "renewed %d of %d lease(s) of %s attempt %d; the rest lapsed",
                    renewed[(job_id, attempt)],
                    len(renew),
                    job_id,
                    attempt,
                )
                continue  # which ones lapsed, the next refresh reads (their expiry is due)
            for rid in renew:
                lease = self._cache.get(rid)
                if lease is not None:
                    self._cache.put(replace(lease, renewed_at_s=now, expires_at_s=now + ttl))

    def _renewal_due(self, rid: str, now: float, ttl: float) -> bool:
        lease = self._cache.get(rid)
        return lease is None or lease.expires_at_s - now <= ttl * (1 - RENEW_AFTER)

    def _to_renew(self, job: Job) -> list[str]:
        """What of a live job's leases the service keeps: what it holds for the job (a
        reservation, a preemptor's units, a growth). What a job runs on, its runner keeps
        (every unit of its attempt: tasks/training/binding.attempt_resources)."""
        owned = self._owned.get(job.job_id, set())
        return [r for r in job.holds if r in owned]
