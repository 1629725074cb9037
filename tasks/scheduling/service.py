"""The scheduler over the inventory: durable queue, leases, the control channel.

Every pass rebuilds the engine from the inventory (one read of nodes, devices,
partitions, cordons, leases and the jobs registry), lets it decide in memory, then writes
back the difference: leases for what jobs run on or hold, registry rows for their state,
control requests for the jobs that must stop. Nothing queries the database per decision.

Durable representation (hardware.inventory, no tables of our own):
- a scheduled job is a jobs-registry row whose spec is ``{"kind": SPEC_KIND, "request":
  ..., "train": ...}``; the scheduler's bookkeeping lives in ``info["sched"]``;
- what a job runs on, and what is held for it (a reservation, a preemptor waiting for its
  victims, a job restarting after a shrink), are leases owned by the job id;
- a running job's first resource is its *primary*: the runner renews that lease (the
  training loop does every 50 steps); the service renews the others while the primary
  lives, and re-queues a job whose primary lease lapsed (its runner is gone).

Registry states: queued (phase queued or reserved), running (phase running or stopping),
checkpointed (the loop stopped on request: the next pass re-queues it), finished, failed
(phase failed or cancelled).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.backend import Backend, HardwareError, InvalidRequestError, PartitionRequest
from gpuflow.hardware.inventory import (
    Inventory,
    JobRecord,
    Lease,
    LeaseError,
    Resource,
)
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
from gpuflow.tasks.scheduling.repartition import RepartitionStep

log = logging.getLogger(__name__)

SPEC_KIND = "gpuflow.schedule/v1"
STOP = "checkpoint-and-stop"
ACK_GRACE_S = 30.0  # a stop acknowledged this long ago is done even without its last write


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


class SchedulerService:
    def __init__(
        self,
        inventory: Inventory,
        backend: Backend | None = None,
        config: SchedulerConfig | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.inventory = inventory
        self.backend = backend
        self.config = config or SchedulerConfig.from_env()
        self._now = now
        self.engine: Engine = Engine(self.config)
        self._records: dict[str, JobRecord] = {}
        self._owned: dict[str, set[str]] = {}  # owner -> resource ids it leases (snapshot)
        self._lease_of: dict[str, Lease] = {}

    @classmethod
    def for_cluster(cls, cluster: Any, config: SchedulerConfig | None = None) -> SchedulerService:
        """A service over a GpuCluster block's inventory and backend (synced if empty)."""
        inventory = cluster.get_inventory()
        backend = cluster.get_backend()
        if not inventory.devices():
            inventory.sync(backend)
        return cls(inventory, backend, config)

    # ================================================================= loading
    def refresh(self) -> Engine:
        """Rebuild the engine from the inventory."""
        inv = self.inventory
        now = self._now()
        engine = Engine(self.config)
        fleet = engine.fleet
        cordoned_nodes: set[str] = set()
        cordoned_devices: set[str] = set()
        for c in inv.cordons():
            if c.device_uuid is None:
                cordoned_nodes.add(c.node)
            else:
                cordoned_devices.add(c.device_uuid)
        for n in inv.nodes():
            fleet.add_node(
                n.name, n.region, active=n.role == "active", cordoned=n.name in cordoned_nodes
            )
        for d in inv.devices(present=True):
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
        for p in inv.partitions():
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
        leases = inv.leases()
        self._lease_of = {lease.resource_id: lease for lease in leases}
        self._owned = {}
        for lease in leases:
            self._owned.setdefault(lease.owner, set()).add(lease.resource_id)
        records = [r for r in inv.jobs() if is_scheduled(r)]
        self._records = {r.job_id: r for r in records}
        live = [r for r in records if r.state in ("queued", "running", "checkpointed")]
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
                    self._request(r),
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
            req = self._request(r)
            engine_job = self._restore_queued(engine, req, s, now)
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

    # ================================================================= writing
    def _write(
        self, job_id: str, state: str, *, resource_ids: list[str] | None = None, **sched: Any
    ) -> JobRecord:
        record = self.inventory.job(job_id)
        merged = {**self._sched(record), **sched}
        fields: dict[str, Any] = {"sched": merged}
        if resource_ids is not None:
            fields["resource_ids"] = resource_ids
        out = self.inventory.set_job_state(job_id, state, **fields)
        self._records[job_id] = out
        return out

    def _lease(self, rid: str, owner: str) -> None:
        self.inventory.acquire_lease(rid, owner, self.config.lease_ttl_s)
        self._owned.setdefault(owner, set()).add(rid)

    def _unlease(self, rid: str, owner: str) -> None:
        self.inventory.release_lease(rid, owner)
        self._owned.get(owner, set()).discard(rid)

    def _sync_leases(self, job: Job, report: PassReport) -> bool:
        """Make the job's leases exactly its allocation and holds. False if one could not
        be taken (someone raced us); what was taken for it here is then given back."""
        want = set(job.allocation) | set(job.holds)
        have = set(self._owned.get(job.job_id, set()))
        for rid in sorted(have - want):
            self._unlease(rid, job.job_id)
        taken: list[str] = []
        for rid in sorted(want - have):
            try:
                self._lease(rid, job.job_id)
                taken.append(rid)
            except (LeaseError, InvalidRequestError) as exc:
                report.errors.append(f"{job.job_id}: could not lease {rid}: {exc}")
                for t in taken:
                    self._unlease(t, job.job_id)
                return False
        return True

    def _renew(self, job: Job) -> None:
        """Keep a live job's leases: holds always; a running job's secondary units only
        while its primary (renewed by the runner) lives."""
        owned = self._owned.get(job.job_id, set())
        if job.state in (QUEUED, RESERVED):
            renew = [r for r in job.holds if r in owned]
        else:
            record = self._records.get(job.job_id)
            primary = record.resource_ids[0] if record and record.resource_ids else None
            if primary is None or primary not in owned:
                return
            renew = [r for r in job.allocation if r in owned and r != primary]
            renew += [r for r in job.holds if r in owned]
        for rid in renew:
            try:
                self.inventory.renew_lease(rid, job.job_id, self.config.lease_ttl_s)
            except LeaseError as exc:
                log.warning("could not renew %s for %s: %s", rid, job.job_id, exc)

    # ================================================================= submission
    def submit(self, request: JobRequest, train: dict[str, Any] | None = None) -> JobRecord:
        """Admit a job (refusals raise before anything is written) and record it queued."""
        engine = self.refresh()
        now = self._now()
        existing = self._records.get(request.job_id)
        if existing is not None and existing.state not in ("finished", "failed"):
            raise InvalidRequestError(f"job {request.job_id!r} is already {existing.state}")
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
        seqs = [self._sched(r).get("seq", 0) for r in self._records.values()]
        return max(seqs, default=0) + 1

    def cancel(self, job_id: str) -> str:
        """Cancel a job: a waiting one at once ("cancelled"); a running one is asked to
        checkpoint and stop, and ends cancelled when it has ("stopping")."""
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
            self._write(job_id, "failed", phase=CANCELLED, reason="cancelled")
            return CANCELLED
        request_id = self.inventory.request_control(job_id, STOP)
        self._write(
            job_id,
            record.state,
            phase="stopping",
            stop_action="cancel",
            stop_request_id=request_id,
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
            engine = self.refresh()
            self._reap(engine, report)
            t0 = time.perf_counter()
            decisions = engine.schedule(self._now())
            report.decide_s += time.perf_counter() - t0
            self._carry_out(engine, decisions, report)
            for job in engine.live_jobs():
                self._renew(job)
            pending = self._pending_stops(engine)
            if not pending or time.monotonic() >= deadline:
                break
            if not self._wait_any(pending, deadline):
                break
        engine = self.engine
        report.waiting = [j for j in engine.queue]
        report.stopping = [j.job_id for j in engine.live_jobs() if j.state == STOPPING]
        return report

    def _pending_stops(self, engine: Engine) -> list[str]:
        return [j.job_id for j in engine.live_jobs() if j.state == STOPPING]

    def _stop_done(self, job_id: str) -> bool:
        """Whether a stopping job has stopped: the loop acknowledged and then recorded
        "checkpointed" (its last write), or acknowledged longer than ACK_GRACE_S ago."""
        record = self.inventory.job(job_id)
        if record.state == "checkpointed":
            return True
        request_id = self._sched(record).get("stop_request_id")
        if not request_id:
            return False
        req = self.inventory.control_request(int(request_id))
        return req.status == "acked" and self._now() - (req.acked_at_s or 0.0) > ACK_GRACE_S

    def _wait_any(self, job_ids: list[str], deadline: float) -> bool:
        """Wait until one of the stopping jobs has stopped; False at the deadline."""
        while time.monotonic() < deadline:
            if any(self._stop_done(j) for j in job_ids):
                return True
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
        return False

    def _reap(self, engine: Engine, report: PassReport) -> None:
        """Apply what happened since the last pass: jobs that stopped, ended or vanished."""
        now = self._now()
        for job_id, record in list(self._records.items()):
            s = self._sched(record)
            job = engine.jobs.get(job_id)
            owned = self._owned.get(job_id, set())
            if record.state in ("finished", "failed"):
                for rid in sorted(owned):
                    self._unlease(rid, job_id)
                if s.get("phase") not in (FINISHED, FAILED, CANCELLED):
                    phase = FINISHED if record.state == "finished" else FAILED
                    self._write(job_id, record.state, phase=phase)
                    report.finished.append(job_id)
                continue
            if job is None:
                continue
            acked = None
            if s.get("stop_request_id"):
                req = self.inventory.control_request(int(s["stop_request_id"]))
                acked = req if req.status == "acked" else None
            # After the ack the loop still writes "checkpointed": wait for that write (or
            # a grace period), or it could land after a re-placement and undo it.
            stopped = record.state == "checkpointed" or (
                job.state == STOPPING
                and acked is not None
                and now - (acked.acked_at_s or 0.0) > ACK_GRACE_S
            )
            if record.state == "checkpointed" and job.state == QUEUED:
                # Stopped and already gave its leases back: only the bookkeeping is left.
                ckpt = (acked.checkpoint_id if acked else None) or record.last_checkpoint_id
                if s.get("cancel_requested"):
                    engine.cancel(job_id, now)
                    self._write(
                        job_id, "failed", resource_ids=[], phase=CANCELLED, reason="cancelled"
                    )
                    continue
                self._write(
                    job_id,
                    "queued",
                    resource_ids=[],
                    phase=QUEUED,
                    resume_checkpoint=ckpt,
                    preemptions=int(s.get("preemptions", 0)) + (1 if s.get("stop_for") else 0),
                    stop_request_id=None,
                    stop_for=None,
                    stop_action=None,
                    release=[],
                )
                job.preemptions = int(s.get("preemptions", 0)) + (1 if s.get("stop_for") else 0)
                report.requeued.append(job_id)
                continue
            if stopped and job.state in (RUNNING, STOPPING):
                ckpt = (acked.checkpoint_id if acked else None) or record.last_checkpoint_id
                cancel = bool(s.get("cancel_requested"))
                if cancel:
                    job.stop_action = "cancel"
                beneficiary = job.stop_for
                engine.stopped(job_id, now, ckpt)
                self._sync_leases(job, report)
                if beneficiary and beneficiary in engine.jobs:
                    self._sync_leases(engine.jobs[beneficiary], report)
                if job.state == CANCELLED:
                    self._write(
                        job_id,
                        "failed",
                        resource_ids=[],
                        phase=CANCELLED,
                        reason="cancelled",
                        stop_request_id=None,
                    )
                    continue
                self._write(
                    job_id,
                    "queued",
                    resource_ids=[],
                    phase=QUEUED,
                    resume_checkpoint=ckpt,
                    preemptions=job.preemptions,
                    stop_request_id=None,
                    stop_for=None,
                    stop_action=None,
                    release=[],
                )
                report.requeued.append(job_id)
                continue
            if job.state in (RUNNING, STOPPING) and record.state == "running":
                primary = record.resource_ids[0] if record.resource_ids else None
                if primary is None or primary not in owned:
                    # The runner stopped renewing: it is gone. Resume from the last checkpoint.
                    beneficiary = job.stop_for
                    engine.fail(job_id, now, requeue=True)
                    self._sync_leases(job, report)
                    if beneficiary and beneficiary in engine.jobs:
                        self._sync_leases(engine.jobs[beneficiary], report)
                    self._requeue_lost(engine, job_id, s, record, now, report)
            elif job.state == QUEUED and record.state == "running":
                # Restored without any of its resources (its leases lapsed, or the devices
                # vanished): its runner is gone; it waits again, from its last checkpoint.
                self._requeue_lost(engine, job_id, s, record, now, report)

    def _requeue_lost(
        self,
        engine: Engine,
        job_id: str,
        sched: dict[str, Any],
        record: JobRecord,
        now: float,
        report: PassReport,
    ) -> None:
        """A job whose runner is gone: cancelled if that was asked, else queued again to
        resume from its last checkpoint."""
        self._answer_stale_stop(sched, record)
        if sched.get("cancel_requested"):
            engine.cancel(job_id, now)
            self._write(
                job_id,
                "failed",
                resource_ids=[],
                phase=CANCELLED,
                reason="cancelled",
                stop_request_id=None,
            )
            return
        self._write(
            job_id,
            "queued",
            resource_ids=[],
            phase=QUEUED,
            resume_checkpoint=record.last_checkpoint_id,
            lost_at_s=now,
            stop_request_id=None,
            stop_for=None,
            stop_action=None,
            release=[],
        )
        report.lost.append(job_id)

    def _answer_stale_stop(self, sched: dict[str, Any], record: JobRecord) -> None:
        """Answer a stop request the job never will, or its relaunch would find it pending
        and stop at its first step. The first answer wins, so a late real one is kept."""
        if sched.get("stop_request_id"):
            self.inventory.ack_control(
                int(sched["stop_request_id"]), record.last_checkpoint_id or "no-checkpoint"
            )

    def _carry_out(self, engine: Engine, decisions: list[object], report: PassReport) -> None:
        now = self._now()
        for d in decisions:
            if isinstance(d, Placement):
                if d.repartition:
                    self._repartition(engine, d, report)
                    continue
                self._started(engine, d, report, now)
            elif isinstance(d, Preemption):
                self._preempt(engine, d, report)
            elif isinstance(d, Growth):
                job = engine.jobs[d.job_id]
                self._sync_leases(job, report)
                rid = self.inventory.request_control(d.job_id, STOP)
                self._write(
                    d.job_id,
                    "running",
                    phase="stopping",
                    stop_action="grow",
                    stop_request_id=rid,
                    stop_for=None,
                    release=[],
                )
                report.growths.append({"job_id": d.job_id, "add": list(d.add)})
            elif isinstance(d, HoldChange):
                self._sync_leases(engine.jobs[d.job_id], report)
            elif isinstance(d, Activation):
                self._write(d.job_id, "queued", phase=QUEUED)

    def _started(self, engine: Engine, d: Placement, report: PassReport, now: float) -> None:
        job = engine.jobs[d.job_id]
        if not self._sync_leases(job, report):
            engine.fail(d.job_id, now, requeue=True)  # back to the queue; next pass retries
            return
        resources = [self.inventory.resource(r) for r in d.resource_ids]
        env = run_environment(resources, d.job_id, self.backend.name if self.backend else "unknown")
        self._write(
            d.job_id,
            "running",
            resource_ids=list(d.resource_ids),
            phase=RUNNING,
            started_at_s=now,
            placement=d.to_dict(),
            env=env.to_dict(),
            stop_request_id=None,
            stop_for=None,
            stop_action=None,
            release=[],
        )
        report.placed.append({**d.to_dict(), "env": env.to_dict()})

    def _preempt(self, engine: Engine, d: Preemption, report: PassReport) -> None:
        for e in d.evictions:
            rid = self.inventory.request_control(e.job_id, STOP)
            record = self._records[e.job_id]
            self._write(
                e.job_id,
                record.state,
                phase="stopping",
                stop_action=e.action,
                stop_for=d.job_id,
                release=list(e.release),
                stop_request_id=rid,
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
            engine = self.refresh()
            self._reap(engine, report)
            job = engine.jobs.get(job_id)
            if job is None:
                raise InvalidRequestError(f"unknown scheduled job {job_id!r}")
            if job.state == RUNNING:
                return self._placement_of(job)
            if job.state != QUEUED:
                return None
            placement = engine.place(job_id, self._now())
            if placement is not None:
                self._carry_out(engine, [placement], report)
                job = engine.jobs[job_id]
                if job.state == RUNNING and self._records[job_id].state == "running":
                    return self._placement_of(job)
            elif preempt and not job.waiting_for:
                plan = engine.preempt(job_id, self._now())
                if plan is not None:
                    self._carry_out(engine, [plan], report)
            pending = self._pending_stops(engine)
            if not pending or time.monotonic() >= deadline or not self._wait_any(pending, deadline):
                if report.errors:
                    log.warning("placing %s: %s", job_id, "; ".join(report.errors))
                return None

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

    def job_done(self, job_id: str, ok: bool = True, stopped_by_request: bool = False) -> None:
        """The runner's report: finished (or failed) ends the job and gives back its leases;
        a stop on request is left for the next pass, which re-queues it."""
        record = self.inventory.job(job_id)
        if stopped_by_request:
            return
        state = "finished" if ok else "failed"
        for lease in self.inventory.leases(owner=job_id):
            self.inventory.release_lease(lease.resource_id, job_id)
        s = self._sched(record)
        self.inventory.set_job_state(
            job_id, state, sched={**s, "phase": FINISHED if ok else FAILED}
        )

    # ================================================================= reading
    def resources(self, job_id: str) -> list[Resource]:
        record = self.inventory.job(job_id)
        return [self.inventory.resource(r) for r in record.resource_ids]

    def jobs(self, include_done: bool = False) -> list[JobView]:
        engine = self.refresh()
        out = []
        for job_id, record in self._records.items():
            s = self._sched(record)
            job = engine.jobs.get(job_id)
            state = job.state if job is not None else s.get("phase", record.state)
            if not include_done and state in DONE_STATES:
                continue
            req = self._request(record)
            out.append(
                JobView(
                    job_id=job_id,
                    state=state,
                    priority=req.priority,
                    request=req.describe(),
                    pool=req.pool,
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
