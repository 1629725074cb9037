"""The scheduler service's view of the inventory: reading the fleet, the jobs and their
leases into an engine (``refresh``), and writing decisions back through the job
lifecycle (compare-and-swap on the (state, attempt) read) and leases owned by (job,
attempt). The pass logic is in reap.py and service.py; the vocabulary shared by all three
is here."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    Inventory,
    JobRecord,
    JobState,
    Lease,
    LeaseError,
)
from gpuflow.tasks.scheduling.engine import Engine, Job
from gpuflow.tasks.scheduling.model import (
    QUEUED,
    RESERVED,
    RUNNING,
    STOPPING,
    JobRequest,
    SchedulerConfig,
)

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


def _invalid_message(exc: Exception) -> str:
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
        self._invalid: dict[str, str] = {}  # job id -> why its stored request is invalid
        self._requests: dict[str, tuple[Any, JobRequest]] = {}  # job id -> (stored, valid)
        self._holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"

    # ================================================================= loading
    def refresh(self) -> Engine:
        """Rebuild the engine from the inventory."""
        now = self._now()
        snap = self.inventory.snapshot()  # one read of everything below
        engine = Engine(self.config)
        fleet = engine.fleet
        cordoned_nodes: set[str] = set()
        cordoned_devices: set[str] = set()
        for c in snap.cordons:
            if c.device_uuid is None:
                cordoned_nodes.add(c.node)
            else:
                cordoned_devices.add(c.device_uuid)
        for n in snap.nodes:
            fleet.add_node(
                n.name, n.region, active=n.role == "active", cordoned=n.name in cordoned_nodes
            )
        for d in snap.devices:
            fleet.add_device(
                d.node,
                d.index,
                d.uuid,
                d.sku,
                d.vendor,
                d.memory_total_mb,
                d.partition_kinds,
                healthy=d.healthy,
                cordoned=d.uuid in cordoned_devices,
            )
        for p in snap.partitions:
            if p.device_uuid in fleet.devices:
                fleet.add_partition(
                    p.device_uuid,
                    p.uuid,
                    p.profile,
                    p.kind,
                    p.memory_mb,
                    p.compute_units,
                    p.placement_start,
                    p.placement_size,
                )
        records = [r for r in snap.jobs if is_scheduled(r)]
        self._records = {r.job_id: r for r in records}
        # A lease of an older attempt of a scheduled job is fenced: given back in the reap.
        attempt_of = {r.job_id: r.attempt for r in records}
        leases: list[Lease] = []
        self._stale = []
        for x in snap.leases:
            stale = x.owner in attempt_of and x.attempt != attempt_of[x.owner]
            (self._stale if stale else leases).append(x)
        self._lease_of = {lease.resource_id: lease for lease in leases}
        self._owned = {}
        for lease in leases:
            self._owned.setdefault(lease.owner, set()).add(lease.resource_id)
        live = [
            r
            for r in records
            if r.state == JobState.QUEUED or r.state in ACTIVE_STATES or r.state in STOPPED_STATES
        ]
        self._invalid = {}
        requests: dict[str, JobRequest] = {}
        for r in live:
            try:
                requests[r.job_id] = self._validated(r)
            except (ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError too
                self._invalid[r.job_id] = _invalid_message(exc)
        # Validated once per request, across passes: the stored request is compared, not
        # validated again (pydantic for every live job, every pass, adds up at 10,000 GPUs).
        self._requests = {k: v for k, v in self._requests.items() if k in requests}
        live = [r for r in live if r.job_id not in self._invalid]
        live.sort(key=lambda r: self._sched(r).get("seq", 0))
        # Running jobs first: their leases are facts; holds of queued jobs come after.
        for r in live:
            if r.state == "queued":
                continue
            s = self._sched(r)
            units = [rid for rid in r.resource_ids if rid in self._owned.get(r.job_id, set())]
            units += sorted(self._owned.get(r.job_id, set()) - set(units))
            try:
                restored = engine.restore_running(
                    requests[r.job_id],
                    s.get("seq", 0),
                    units,
                    now,
                    started_at_s=s.get("started_at_s"),
                    checkpoint_at_s=r.updated_at_s,
                )
                restored.preemptions = int(s.get("preemptions", 0))
                restored.last_checkpoint_id = r.last_checkpoint_id
            except InvalidRequestError as exc:
                log.warning("cannot restore job %s: %s", r.job_id, exc)
        for r in live:
            if r.state != "queued":
                continue
            s = self._sched(r)
            engine_job = self._restore_queued(engine, requests[r.job_id], s, now)
            engine_job.preemptions = int(s.get("preemptions", 0))
            engine_job.last_checkpoint_id = r.last_checkpoint_id
            engine.restore_holds(engine_job.job_id, sorted(self._owned.get(r.job_id, set())))
        # Stopping victims: link them to whom they stop for (earmarks and waiting_for).
        for r in live:
            s = self._sched(r)
            job = engine.jobs.get(r.job_id)
            if job is None or s.get("phase") != "stopping" or job.state != RUNNING:
                continue
            job.state = STOPPING
            job.stop_action = s.get("stop_action") or "preempt"
            job.stop_for = s.get("stop_for")
            job.release_on_stop = tuple(s.get("release") or job.allocation)
            beneficiary = engine.jobs.get(job.stop_for or "")
            for rid in job.release_on_stop:
                unit = job.allocation.get(rid)
                if unit is not None and beneficiary is not None:
                    unit.earmark = beneficiary.job_id
            if beneficiary is not None:
                beneficiary.waiting_for.add(job.job_id)
        known = {r.job_id for r in records}
        for lease in leases:
            job = engine.jobs.get(lease.owner)
            if job is not None:
                continue
            if lease.owner in known:
                continue  # a finished scheduled job's lease: reaped in this pass
            engine.mark_external(lease.resource_id, lease.owner)
        self.engine = engine
        return engine

    def _restore_queued(
        self, engine: Engine, req: JobRequest, s: dict[str, Any], now: float
    ) -> Job:
        try:
            return engine.submit(
                req, s.get("submitted_at_s", now), seq=s.get("seq"), enforce_depth=False
            )
        except InvalidRequestError:
            # Admitted once, infeasible now (the fleet shrank): keep it waiting, never drop it.
            job = Job(request=req, seq=int(s.get("seq", 0)), state=QUEUED, submitted_at_s=now)
            engine.jobs[req.job_id] = job
            engine.queue.add(req.job_id, req.priority, job.seq, req.pool)
            return job

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
            return _invalid_message(exc)
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
        for rid in sorted(have - want):
            self._unlease(rid, job.job_id)
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

    def _renew_all(self, jobs: list[Job]) -> None:
        """Keep live jobs' leases (see _to_renew), all of them in one inventory write."""
        renewals: dict[tuple[str, int], list[str]] = {}
        for job in jobs:
            renew = self._to_renew(job)
            if renew:
                renewals[(job.job_id, self._attempt(job.job_id))] = renew
        if not renewals:
            return
        renewed = self.inventory.renew_leases_of(renewals, self.config.lease_ttl_s)
        for (job_id, attempt), renew in renewals.items():
            if renewed[(job_id, attempt)] < len(set(renew)):
                log.warning(
                    "renewed %d of %d lease(s) of %s attempt %d; the rest lapsed",
                    renewed[(job_id, attempt)],
                    len(set(renew)),
                    job_id,
                    attempt,
                )

    def _to_renew(self, job: Job) -> list[str]:
        """What of a live job's leases the service keeps: holds always; a running job's
        secondary units only while its primary (renewed by the runner) lives."""
        owned = self._owned.get(job.job_id, set())
        if job.state in (QUEUED, RESERVED):
            return [r for r in job.holds if r in owned]
        record = self._records.get(job.job_id)
        primary = record.resource_ids[0] if record and record.resource_ids else None
        if primary is None or primary not in owned:
            return []
        renew = [r for r in job.allocation if r in owned and r != primary]
        return renew + [r for r in job.holds if r in owned]
