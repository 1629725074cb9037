"""The scheduler over the inventory: durable queue, leases, the control channel.

A pass brings the service's engine up to date with the inventory (refresh.py: the first
one reads nodes, devices, partitions, cordons, leases and the jobs registry whole; later
ones only what the inventory's change journal names since), lets it decide in memory,
then writes back the difference: leases for what jobs run on or hold, registry rows for
their state, control requests for the jobs that must stop. Nothing queries the database
per decision.

Durable representation (hardware.inventory, no tables of our own):
- a scheduled job is a jobs-registry row whose spec is ``{"kind": SPEC_KIND, "request":
  ..., "train": ...}``; the scheduler's bookkeeping lives in ``info["sched"]``;
- what a job runs on, and what is held for it (a reservation, a preemptor waiting for its
  victims, a job restarting after a shrink), are leases owned by (job id, attempt); a
  placement starts the next attempt and moves its leases to it;
- a running job's runner keeps every unit of its attempt leased (its LeaseKeeper renews
  them all every TTL/3: tasks/training/binding.attempt_resources); the service renews
  only what it holds for jobs, once a third of a lease's TTL has gone (all due ones in one
  write), and re-queues a running job one of whose leases lapsed (its runner is gone).

One writer: every pass (schedule_once, place_one, submit, cancel) decides under the
fleet-wide pass lock (hardware.inventory.locks), whoever runs it, and every job-state
write is a compare-and-swap on the (state, attempt) the pass read (the inventory's
lifecycle), so a write based on a stale read is refused instead of applied.

Registry states (hardware.inventory JobState): queued (phase queued or reserved), placed /
launching / running / checkpointing (phase running or stopping), stopped (the loop stopped
on request: the next pass re-queues it), lost (its runner is gone: re-queued), finished,
failed (phase failed or cancelled, or a stored request that no longer validates:
quarantined).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpuflow.hardware.backend import HardwareError, InvalidRequestError, PartitionRequest
from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    JobConflictError,
    JobRecord,
    JobState,
    JobTransitionError,
    LeaseError,
    LockBusyError,
    Resource,
)
from gpuflow.hardware.inventory.lifecycle import JobPlacement
from gpuflow.tasks.scheduling.engine import Engine, Job
from gpuflow.tasks.scheduling.env import run_environment
from gpuflow.tasks.scheduling.model import (
    CANCELLED,
    DONE_STATES,
    FAILED,
    FINISHED,
    QUEUED,
    RESERVED,
    RUNNING,
    STOPPING,
    Activation,
    Growth,
    HoldChange,
    JobRequest,
    Placement,
    Preemption,
    SchedulerConfig,
)
from gpuflow.tasks.scheduling.reap import ReapMixin
from gpuflow.tasks.scheduling.repartition import RepartitionStep
from gpuflow.tasks.scheduling.service_state import (
    PASS_LOCK,
    PASS_LOCK_TTL_S,
    QUARANTINED,
    SEQ_COUNTER,
    SPEC_KIND,
    STOP,
    JobView,
    PassReport,
    checkpoint_step,
    is_scheduled,
)

log = logging.getLogger(__name__)


# Re-exported: callers import the service's vocabulary from here.
__all__ = [
    "SPEC_KIND",
    "JobView",
    "PassReport",
    "SchedulerService",
    "checkpoint_step",
    "is_scheduled",
]


class SchedulerService(ReapMixin):
    @classmethod
    def for_cluster(cls, cluster: Any, config: SchedulerConfig | None = None) -> SchedulerService:
        """A service over a GpuCluster block's inventory and backend (synced if empty)."""
        inventory = cluster.get_inventory()
        backend = cluster.get_backend()
        if not inventory.devices():
            inventory.sync(backend)
        return cls(inventory, backend, config)

    # ================================================================= submission
    # ================================================================= the pass lock
    @contextmanager
    def _pass(self) -> Iterator[None]:
        """Decide alone: the fleet-wide pass lock, waited for up to PASS_LOCK_WAIT_S
        (LockBusyError names the holder and until when after that)."""
        with self.inventory.locked(
            PASS_LOCK, self._holder, PASS_LOCK_TTL_S, wait_s=self.lock_wait_s
        ):
            yield

    def submit(self, request: JobRequest, train: dict[str, Any] | None = None) -> JobRecord:
        """Admit a job (refusals raise before anything is written) and record it queued.
        Under the pass lock, so concurrent submits see each other: the queue depth holds
        and each gets its own sequence number (from a counter in the database)."""
        with self._pass():
            return self._submit(request, train)

    def _submit(self, request: JobRequest, train: dict[str, Any] | None) -> JobRecord:
        engine = self.refresh()
        now = self._now()
        existing = self._records.get(request.job_id)
        if existing is not None and existing.state not in ("finished", "failed"):
            raise InvalidRequestError(f"job {request.job_id!r} is already {existing.state}")
        if train is not None:
            engine.check_feasible(request)  # a fleet that cannot run it says so first
            _check_train_sizes(request, train)
        job = engine.submit(request, now)  # SubmissionRefused / QueueFullError come from here
        spec = {"kind": SPEC_KIND, "request": request.model_dump(mode="json"), "train": train}
        self.inventory.record_job(request.job_id, spec, state="queued")
        sched = {
            "seq": self._next_seq(),
            "phase": job.state,
            "pool": request.pool,
            "submitted_at_s": now,
            "preemptions": 0,
            "stop_request_id": None,
            "stop_for": None,
            "stop_action": None,
            "release": [],
            "cancel_requested": False,
        }
        job.seq = sched["seq"]
        return self._write(request.job_id, "queued", resource_ids=[], **sched)

    def _next_seq(self) -> int:
        # The counter is the truth; the floor carries on from jobs submitted before it.
        seqs = [self._sched(r).get("seq", 0) for r in self._records.values()]
        return self.inventory.next_sequence(SEQ_COUNTER, floor=max(seqs, default=0) + 1)

    def cancel(self, job_id: str) -> str:
        """Cancel a job: a waiting one at once ("cancelled"); a running one is asked to
        checkpoint and stop, and ends cancelled when it has ("stopping")."""
        with self._pass():
            return self._cancel(job_id)

    def _cancel(self, job_id: str) -> str:
        engine = self.refresh()
        job = engine.jobs.get(job_id)
        record = self._records.get(job_id)
        if record is None:
            raise InvalidRequestError(f"unknown scheduled job {job_id!r}")
        if job is None or job.state in DONE_STATES:
            return self._sched(record).get("phase", record.state)
        if job.state in (QUEUED, RESERVED):
            engine.cancel(job_id, self._now())
            self._sync_leases(job, PassReport())
            for lease in [x for x in self._stale if x.owner == job_id]:
                # Taken for another attempt (remediation's target for the next one): a
                # cancelled job holds nothing, not even until the next pass.
                self.inventory.release_lease(lease.resource_id, job_id, attempt=lease.attempt)
            self._write(job_id, "failed", phase=CANCELLED, reason="cancelled")
            return CANCELLED
        request_id = self.inventory.request_control(job_id, STOP)
        self._write(
            job_id,
            None,
            phase="stopping",
            stop_action="cancel",
            stop_request_id=request_id,
            stop_requested_at_s=self._now(),
            cancel_requested=True,
        )
        return "stopping"

    # ================================================================= the pass
    def schedule_once(self, ack_timeout_s: float = 0.0, max_rounds: int = 4) -> PassReport:
        """Reap, decide, carry out; when victims were asked to stop, wait up to
        ``ack_timeout_s`` for their acknowledgements and go round again."""
        report = PassReport()
        deadline = time.monotonic() + max(0.0, ack_timeout_s)
        for _ in range(max_rounds):
            try:
                with self._pass():
                    engine = self._round(report)
            except LockBusyError as exc:
                report.errors.append(str(exc))
                break
            pending = self._pending_stops(engine)
            if not pending or time.monotonic() >= deadline:
                break
            if not self._wait_any(pending, deadline):
                break
        engine = self.engine
        report.waiting = [j for j in engine.queue]
        report.stopping = [j.job_id for j in engine.live_jobs() if j.state == STOPPING]
        return report

    def _round(self, report: PassReport) -> Engine:
        """One round of a pass (the caller holds the pass lock): read, reap, decide,
        write, renew."""
        engine = self.refresh()
        self._reap(engine, report)
        t0 = time.perf_counter()
        decisions = engine.schedule(self._now())
        report.decide_s += time.perf_counter() - t0
        self._carry_out(engine, decisions, report)
        self._renew_all(engine)
        return engine

    def _carry_out(self, engine: Engine, decisions: list[object], report: PassReport) -> None:
        now = self._now()
        for d in decisions:
            # What the engine changed in memory for a decision is not all written (a
            # preemptor's pool, a failed write): the next refresh restores these anew.
            self._dirty.add(getattr(d, "job_id", ""))
            self._dirty.update(e.job_id for e in getattr(d, "evictions", ()))
        starts = [d for d in decisions if isinstance(d, Placement) and not d.repartition]
        self._start_all(engine, starts, report, now)
        for d in decisions:
            if d in starts:
                continue
            try:
                self._carry_out_one(engine, d, report, now)
            except JobTransitionError as exc:
                # A job moved since this pass read it: nothing written for it; next pass.
                report.errors.append(f"{getattr(d, 'job_id', '?')}: {exc}")

    def _carry_out_one(self, engine: Engine, d: object, report: PassReport, now: float) -> None:
        if isinstance(d, Placement):
            if d.repartition:
                self._repartition(engine, d, report)
                return
            self._started(engine, d, report, now)
        elif isinstance(d, Preemption):
            self._preempt(engine, d, report)
        elif isinstance(d, Growth):
            job = engine.jobs[d.job_id]
            self._sync_leases(job, report)
            rid = self.inventory.request_control(d.job_id, STOP)
            self._write(
                d.job_id,
                None,
                phase="stopping",
                stop_action="grow",
                stop_request_id=rid,
                stop_requested_at_s=now,
                stop_for=None,
                release=[],
            )
            report.growths.append({"job_id": d.job_id, "add": list(d.add)})
        elif isinstance(d, HoldChange):
            self._sync_leases(engine.jobs[d.job_id], report)
        elif isinstance(d, Activation):
            self._write(d.job_id, None, phase=QUEUED)

    def _start_all(
        self, engine: Engine, starts: list[Placement], report: PassReport, now: float
    ) -> None:
        """Start the pass's placements: every lease in one transaction, their resources in
        one read, every job row in one transaction. When the batch cannot be written
        whole (a lease taken meanwhile, a job that moved), one placement at a time, which
        says which."""
        batch = [d for d in starts if self._leases_move_whole(engine.jobs[d.job_id])]
        attempts = {d.job_id: self._attempt(d.job_id) + 1 for d in batch}
        wanted = {
            (d.job_id, attempts[d.job_id]): self._wanted(engine.jobs[d.job_id]) for d in batch
        }
        try:
            if wanted:
                self.inventory.acquire_leases_of(wanted, self.config.lease_ttl_s)
        except (LeaseError, InvalidRequestError):
            batch = []
        for (job_id, _), rids in wanted.items() if batch else ():
            self._owned.setdefault(job_id, set()).update(rids)
        for d in starts:
            if d not in batch:
                try:
                    self._started(engine, d, report, now)
                except JobTransitionError as exc:
                    report.errors.append(f"{d.job_id}: {exc}")
        if not batch:
            return
        rids = [r for d in batch for r in d.resource_ids]
        found = {r.resource_id: r for r in self.inventory.resources_by_id(rids)}
        rows = [self._placed_row(d, attempts[d.job_id], found, now) for d in batch]
        try:
            written = self.inventory.place_jobs([row for row, _ in rows])
        except JobTransitionError:
            for d, (_, env) in zip(batch, rows, strict=True):
                try:
                    self._record_start(d, attempts[d.job_id], env, report, now)
                except JobTransitionError as exc:
                    report.errors.append(f"{d.job_id}: {exc}")
            return
        for d, record, (_, env) in zip(batch, written, rows, strict=True):
            self._records[d.job_id] = record
            report.placed.append({**d.to_dict(), "env": env})

    def _leases_move_whole(self, job: Job) -> bool:
        """Whether the job's leases for its next attempt are all to take: nothing it has
        now is to be given back (else _sync_leases, one job at a time)."""
        return self._owned.get(job.job_id, set()) <= set(self._wanted(job))

    @staticmethod
    def _wanted(job: Job) -> list[str]:
        return sorted(set(job.allocation) | set(job.holds))

    def _placed_row(
        self, d: Placement, attempt: int, found: dict[str, Resource], now: float
    ) -> tuple[JobPlacement, dict[str, Any]]:
        """(the place_jobs row, the run environment) of a placement whose leases are taken."""
        resources = [found[r] for r in d.resource_ids]
        env = run_environment(resources, d.job_id, self.backend.name if self.backend else "unknown")
        record = self._records[d.job_id]
        sched = {**self._sched(record), **self._start_fields(d, env.to_dict(), now)}
        row = (d.job_id, list(d.resource_ids), attempt, record.state, {"sched": sched})
        return row, env.to_dict()

    @staticmethod
    def _start_fields(d: Placement, env: dict[str, Any], now: float) -> dict[str, Any]:
        return {
            "phase": RUNNING,
            "started_at_s": now,
            "placement": d.to_dict(),
            "env": env,
            "stop_request_id": None,
            "stop_for": None,
            "stop_action": None,
            "release": [],
        }

    def _started(self, engine: Engine, d: Placement, report: PassReport, now: float) -> None:
        job = engine.jobs[d.job_id]
        attempt = self._attempt(d.job_id) + 1  # the placement starts the next attempt
        if not self._sync_leases(job, report, attempt=attempt):
            engine.fail(d.job_id, now, requeue=True)  # back to the queue; next pass retries
            return
        resources = self.inventory.resources_by_id(d.resource_ids)
        env = run_environment(resources, d.job_id, self.backend.name if self.backend else "unknown")
        self._record_start(d, attempt, env.to_dict(), report, now)

    def _record_start(
        self, d: Placement, attempt: int, env: dict[str, Any], report: PassReport, now: float
    ) -> None:
        self._write(
            d.job_id,
            JobState.PLACED,
            resource_ids=list(d.resource_ids),
            attempt=attempt,
            **self._start_fields(d, env, now),
        )
        report.placed.append({**d.to_dict(), "env": env})

    def _preempt(self, engine: Engine, d: Preemption, report: PassReport) -> None:
        for e in d.evictions:
            rid = self.inventory.request_control(e.job_id, STOP)
            self._write(
                e.job_id,
                None,
                phase="stopping",
                stop_action=e.action,
                stop_for=d.job_id,
                release=list(e.release),
                stop_request_id=rid,
                stop_requested_at_s=self._now(),
            )
        report.preemptions.append(d.to_dict())

    def _repartition(self, engine: Engine, d: Placement, report: PassReport) -> None:
        """Carry out the proposed cuts now, then place the job on what they created."""
        job = engine.jobs[d.job_id]
        if self.backend is None:
            for step in d.repartition:
                engine.abandon_repartition(step)
            report.errors.append(f"{d.job_id}: needs repartitioning but the service has no backend")
            return
        done: list[dict[str, Any]] = []
        for step in d.repartition:
            try:
                created = self._apply_step(step)
            except HardwareError as exc:
                engine.abandon_repartition(step)
                report.errors.append(
                    f"{d.job_id}: repartition of {step.node}:{step.index} failed: {exc}"
                )
                continue
            engine.apply_repartition(step, created)
            done.append(step.to_dict())
        report.repartitioned.extend(done)
        self.inventory.sync(self.backend)
        if job.state == QUEUED:
            placement = engine.place(d.job_id, self._now())
            if placement is not None and placement.ready:
                self._started(engine, placement, report, self._now())
                return
        self._sync_leases(job, report)  # it holds what was made for it; placed next pass

    def _apply_step(
        self, step: RepartitionStep
    ) -> list[tuple[str, PartitionRequest, int, int | None]]:
        backend = self.backend
        assert backend is not None
        if step.create and step.kind == "mig" and not backend.partition_mode(step.node, step.index):
            backend.set_partition_mode(step.node, step.index, True)
        if step.destroy:
            backend.destroy_partitions(step.node, step.index, list(step.destroy))
        if not step.create:
            # A merge back into a whole device: MIG mode off (a MIG-mode GPU without
            # instances runs nothing); vDCUs need no mode change.
            if step.kind == "mig" and backend.partition_mode(step.node, step.index):
                backend.set_partition_mode(step.node, step.index, False)
            return []
        made = backend.create_partitions(step.node, step.index, list(step.create))
        return [
            (
                p.uuid,
                PartitionRequest(
                    p.profile,
                    p.placement_start,
                    p.compute_units if p.kind == "vdcu" else None,
                    p.memory_mb if p.kind == "vdcu" else None,
                ),
                p.memory_mb,
                p.compute_units,
            )
            for p in made
        ]

    # ================================================================= one job now
    def place_one(
        self, job_id: str, *, preempt: bool = False, ack_timeout_s: float = 0.0
    ) -> Placement | None:
        """Try to place one queued job now (no other job is touched, except victims when
        ``preempt``); returns its placement, or None while it must wait."""
        deadline = time.monotonic() + max(0.0, ack_timeout_s)
        report = PassReport()
        while True:
            with self._pass():
                engine, placed, done = self._place_round(job_id, preempt, report)
            if done:
                return placed
            pending = self._pending_stops(engine)
            if not pending or time.monotonic() >= deadline or not self._wait_any(pending, deadline):
                if report.errors:
                    log.warning("placing %s: %s", job_id, "; ".join(report.errors))
                return None

    def _place_round(
        self, job_id: str, preempt: bool, report: PassReport
    ) -> tuple[Engine, Placement | None, bool]:
        """One round of place_one under the pass lock: (engine, placement, whether the
        answer is final)."""
        engine = self.refresh()
        self._reap(engine, report)
        job = engine.jobs.get(job_id)
        if job is None:
            raise InvalidRequestError(f"unknown scheduled job {job_id!r}")
        if job.state == RUNNING:
            return engine, self._placement_of(job), True
        if job.state != QUEUED:
            return engine, None, True
        placement = engine.place(job_id, self._now())
        if placement is not None:
            self._carry_out(engine, [placement], report)
            job = engine.jobs[job_id]
            if job.state == RUNNING and self._records[job_id].state in ACTIVE_STATES:
                return engine, self._placement_of(job), True
        elif preempt and not job.waiting_for:
            plan = engine.preempt(job_id, self._now())
            if plan is not None:
                self._carry_out(engine, [plan], report)
        return engine, None, False

    @staticmethod
    def _placement_of(job: Job) -> Placement:
        units = list(job.allocation.values())
        assert job.pool_key is not None
        return Placement(
            job_id=job.job_id,
            region=job.pool_key[0],
            sku=job.pool_key[1],
            kind=units[0].kind,
            resource_ids=tuple(u.rid for u in units),
            nodes=tuple(dict.fromkeys(u.node for u in units)),
        )

    def job_done(
        self,
        job_id: str,
        ok: bool = True,
        stopped_by_request: bool = False,
        attempt: int | None = None,
    ) -> None:
        """The runner's report: finished (or failed) ends the job and gives back its leases;
        a stop on request is left for the next pass, which re-queues it. With ``attempt``
        only that attempt, while it is live, may report (JobConflictError for a stale or
        requeued one, nothing written)."""
        record = self.inventory.job(job_id)
        if stopped_by_request:
            return
        if attempt is not None and record.attempt != attempt:
            self.inventory.transition_job(job_id, expect_attempt=attempt)  # raises, names both
        end = JobState.FINISHED if ok else JobState.FAILED
        if attempt is not None and record.state not in (*ACTIVE_STATES, end):
            # Requeued (lost, stopped) under the same number: that attempt is over, and its
            # late report must not end the job that now waits to resume.
            raise JobConflictError(
                job_id, f"attempt {attempt} live", f"{record.state} at attempt {attempt}", str(end)
            )
        for lease in self.inventory.leases(owner=job_id):
            if attempt is None or lease.attempt == attempt:
                self.inventory.release_lease(lease.resource_id, job_id, attempt=lease.attempt)
        if attempt is not None and record.state == JobState.FAILED:
            return  # ended already (cancelled, or this report retried): how it ended stands
        s = self._sched(record)
        self.inventory.transition_job(
            job_id,
            end,
            expect_state=record.state if attempt is not None else None,
            expect_attempt=record.attempt,
            sched={**s, "phase": FINISHED if ok else FAILED},
        )

    # ================================================================= reading
    def resources(self, job_id: str) -> list[Resource]:
        record = self.inventory.job(job_id)
        return self.inventory.resources_by_id(record.resource_ids)

    def jobs(self, include_done: bool = False) -> list[JobView]:
        engine = self.refresh()
        out = []
        for job_id, record in self._records.items():
            s = self._sched(record)
            job = engine.jobs.get(job_id)
            state = job.state if job is not None else s.get("phase", record.state)
            problem = self._invalid.get(job_id) or self._invalid_request(record)
            if problem is not None:
                # Listed even among live jobs: someone has to fix or delete it.
                state = QUARANTINED
            if not include_done and state in DONE_STATES:
                continue
            req = None if problem is not None else self._request(record)
            out.append(
                JobView(
                    job_id=job_id,
                    state=state,
                    priority=req.priority if req else 0,
                    request=req.describe() if req else str(problem),
                    pool=req.pool if req else "-",
                    resource_ids=tuple(job.allocation)
                    if job and job.allocation
                    else tuple(record.resource_ids),
                    last_checkpoint_id=record.last_checkpoint_id,
                    preemptions=int(s.get("preemptions", 0)),
                    submitted_at_s=float(s.get("submitted_at_s", record.created_at_s)),
                    position=engine.queue.position(job_id) if job_id in engine.queue else None,
                )
            )
        out.sort(key=lambda v: (v.position is None, v.position or 0, v.submitted_at_s))
        return out

    def train_spec(self, job_id: str) -> dict[str, Any] | None:
        spec = self.inventory.job(job_id).spec
        return spec.get("train") if spec.get("kind") == SPEC_KIND else None


def _check_train_sizes(request: JobRequest, train: dict[str, Any]) -> None:
    """A job with a train spec trains as one rank per placed unit: every size it may be
    placed at (count to max_count) must split its global batch, or it would be refused
    only once placed, after it waited its turn."""
    from gpuflow.tasks.training.distributed.gang import check_world_sizes
    from gpuflow.tasks.training.spec import TrainSpec

    try:
        spec = TrainSpec.model_validate({**train, "job_id": request.job_id})
    except ValueError as exc:
        raise InvalidRequestError(f"job {request.job_id!r}: its train spec: {exc}") from exc
    sizes = range(request.count, (request.max_count or request.count) + 1)
    check_world_sizes(request.job_id, spec.resolved_batch_size, sizes)
