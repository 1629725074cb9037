"""The placement engine: in-memory, synchronous, decides in milliseconds.

It owns the job lifecycle (queued -> running -> finished, with reservations, stops for
preemption, shrink and growth) over a FleetIndex, and never touches a device or a
database: every decision is returned as a frozen record (model.py) for a caller to carry
out. The service (service.py) mirrors it to the inventory and the control channel; the
trace simulator drives it directly.

This module is the loop; the decisions are its components, read in the order a job meets
them: admission.py (may it ever run?), placement.py (which pool, which free units),
repartition.py (which device to cut when no partition fits), preemption.py (whom to evict
when nothing is free), over the state of state.py (jobs, the running-jobs index).

Rules it never breaks:
- a gang is all-or-nothing and homogeneous: one SKU, one region, one kind of unit;
- a unit is held by at most one job, for running (owner) or for a start to come (holder);
- a job is in exactly one state, and only done jobs leave the live set.
"""

from __future__ import annotations

from gpuflow.hardware.backend import InvalidRequestError, PartitionRequest
from gpuflow.tasks.scheduling import admission, placement, preemption, repartition
from gpuflow.tasks.scheduling.fleet_index import FleetIndex, PoolKey, Unit
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
    QueueFullError,
    SchedulerConfig,
    SubmissionRefused,
)
from gpuflow.tasks.scheduling.queue import JobQueue
from gpuflow.tasks.scheduling.repartition import RepartitionStep
from gpuflow.tasks.scheduling.state import EXTERNAL, Job, RunningIndex, hold, release_holds

__all__ = ["Engine", "Job"]


class Engine:
    def __init__(
        self, config: SchedulerConfig | None = None, fleet: FleetIndex | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        self.fleet = fleet or FleetIndex()
        self.jobs: dict[str, Job] = {}
        self.queue = JobQueue(fifo=self.config.fifo or self.config.policy == "first-fit")
        self.reservations: dict[str, Job] = {}
        self.running = RunningIndex()  # preemption looks only where it helps
        self._seq = 0

    # ==================================================================== submission
    def submit(
        self,
        request: JobRequest,
        now: float,
        *,
        seq: int | None = None,
        enforce_depth: bool = True,
        checkpoint_every_s: float | None = None,
    ) -> Job:
        """Admit a job: refused (SubmissionRefused) if no fleet of this shape could run it,
        or (QueueFullError) if its pool's queue is full; otherwise queued or reserved."""
        if not isinstance(request, JobRequest):
            raise InvalidRequestError(f"submit needs a JobRequest, got {type(request).__name__}")
        old = self.jobs.get(request.job_id)
        if old is not None and old.state not in DONE_STATES:
            raise SubmissionRefused(f"job {request.job_id!r} is already {old.state}")
        candidates = self.check_feasible(request)
        reservation = request.start_at_s is not None and request.start_at_s > now
        if not reservation and enforce_depth:
            depth = self.config.depth(request.pool)
            waiting = self.queue.waiting(request.pool)
            if waiting >= depth:
                raise QueueFullError(request.pool, waiting, depth)
        if seq is None:
            self._seq += 1
            seq = self._seq
        else:
            self._seq = max(self._seq, seq)
        job = Job(
            request=request,
            seq=seq,
            state=RESERVED if reservation else QUEUED,
            submitted_at_s=now,
            candidates=candidates,
            shape_version=self.fleet.shape_version,
            checkpoint_every_s=checkpoint_every_s,
        )
        self.jobs[request.job_id] = job
        if reservation:
            self.reservations[job.job_id] = job
        else:
            self.queue.add(job.job_id, job.priority, job.seq, request.pool)
        return job

    def check_feasible(self, request: JobRequest) -> tuple[PoolKey, ...]:
        """The pools that could ever run ``request``, best first; SubmissionRefused with the
        reason when there are none (a profile no allowed SKU has, more units than any
        pool's active nodes hold, an unknown region or SKU)."""
        return admission.feasible_pools(self.fleet, request)

    # ==================================================================== the pass
    def schedule(self, now: float) -> list[object]:
        """One pass: reservations, then the queue in order (place, else preempt), then
        elastic growth. Returns the decisions taken, in order; state is already updated."""
        out: list[object] = []
        out.extend(self._reservations(now))
        # Within a pass free capacity only shrinks, so a job shaped like one that could not
        # be placed (or make room) cannot either: skip it. With a thousand waiting jobs of
        # a few shapes this turns a pass from thousands of searches into a handful.
        no_room: set[tuple[object, ...]] = set()
        no_victims: set[tuple[object, ...]] = set()
        for job_id in self.queue:
            job = self.jobs[job_id]
            if job.state != QUEUED:
                continue
            shape = self._shape(job)
            if shape is not None and shape in no_room:
                if job.waiting_for or (shape, job.priority) in no_victims:
                    continue
            else:
                decision = self.place(job_id, now)
                if decision is not None:
                    out.append(decision)
                    continue
                if shape is not None:
                    no_room.add(shape)
            if job.waiting_for:
                continue
            plan = self.preempt(job_id, now)
            if plan is not None:
                out.append(plan)
            elif shape is not None:
                no_victims.add((shape, job.priority))
        if self.config.grow_elastic:
            out.extend(self._grow(now))
        return out

    def _shape(self, job: Job) -> tuple[object, ...] | None:
        """What decides whether a job fits (None: it holds or pins units of its own)."""
        req = job.request
        if job.holds or req.resource_ids:
            return None
        return (
            admission.candidates(self.fleet, job),
            req.kind,
            req.profile,
            req.min_units,
            req.compute_units,
            req.memory_mb,
            req.policy,
            req.region,
            req.skus,
        )

    def _reservations(self, now: float) -> list[object]:
        """Reservations whose start came join the queue; those within the lead time hold
        free capacity for their start."""
        out: list[object] = []
        for job in sorted(
            self.reservations.values(), key=lambda j: (j.request.start_at_s or 0, j.seq)
        ):
            start = job.request.start_at_s or now
            if now >= start:
                del self.reservations[job.job_id]
                job.state = QUEUED
                self.queue.add(job.job_id, job.priority, job.seq, job.request.pool)
                out.append(Activation(job.job_id))
                continue
            if now < start - self.config.reservation_lead_s:
                continue
            added = placement.reservation_units(self.fleet, self.config, job)
            for u in added:
                hold(self.fleet, job, u)
            if added:
                out.append(HoldChange(job.job_id, tuple(u.rid for u in added)))
        return out

    def _grow(self, now: float) -> list[Growth]:
        """Running elastic jobs below their maximum take free units nobody waits for (in
        pools no queued job could use); they restart through a checkpoint."""
        wanted: set[PoolKey] = set()
        for job_id in self.queue:
            wanted.update(admission.candidates(self.fleet, self.jobs[job_id]))
        out: list[Growth] = []
        elastic = [
            j
            for key, ids in self.running.by_pool.items()
            if key not in wanted
            for j in (self.jobs[i] for i in ids)
            if j.state == RUNNING and j.request.elastic and len(j.allocation) < j.request.max_units
        ]
        for job in sorted(elastic, key=lambda j: (-j.priority, j.seq)):
            picked = placement.growth_units(self.fleet, job)
            if not picked:
                continue
            for u in picked:
                hold(self.fleet, job, u)
            job.state = STOPPING
            job.stop_action = "grow"
            job.stop_for = None
            job.release_on_stop = ()
            out.append(Growth(job.job_id, tuple(u.rid for u in picked)))
        return out

    # ==================================================================== placement
    def place(self, job_id: str, now: float) -> Placement | None:
        """One placement decision for a queued job: where it runs now, the repartitioning
        that would make room (the job then waits for it), or None."""
        job = self._job(job_id)
        if job.state != QUEUED:
            raise InvalidRequestError(f"job {job_id!r} is {job.state}, not queued")
        req = job.request
        policy = req.policy or self.config.policy
        fleet = self.fleet
        if req.resource_ids:
            units = [fleet.units[r] for r in req.resource_ids if r in fleet.units]
            if len(units) == len(req.resource_ids) and all(
                placement.usable_for(fleet, u, job) for u in units
            ):
                return self._start(job, units, now)
            return None
        for pool in placement.ordered_pools(fleet, job, policy):
            units = placement.pick(fleet, self.config, job, pool, policy)
            if units:
                return self._start(job, units, now)
        # Merging partitions back into whole devices is planned for one node's or one
        # pool's count, not a per-node shape: a gang that names several nodes waits for
        # whole devices (or preempts) instead.
        if not job.holds and (req.nodes or 1) == 1:
            for pool in placement.ordered_pools(fleet, job, policy):
                if req.kind == "device":
                    plan = repartition.propose_merge(fleet, self.config, job, pool)
                else:
                    plan = repartition.propose(fleet, job, pool, policy)
                if plan is not None:
                    return plan
        return None

    def _start(self, job: Job, units: list[Unit], now: float) -> Placement:
        fleet = self.fleet
        chosen = {u.rid for u in units}
        for u in list(job.holds.values()):
            if u.rid not in chosen:
                fleet.set_holder(u, None)  # held but not needed after all
        job.holds.clear()
        for u in units:
            u.holder = None  # set_owner reindexes the device
            fleet.set_owner(u, job.job_id)
            job.allocation[u.rid] = u
        job.pool_key = units[0].pool
        job.state = RUNNING
        job.started_at_s = now
        job.checkpoint_at_s = now  # a restart resumes from its checkpoint: nothing at risk yet
        job.waiting_for.clear()
        self.queue.remove(job.job_id)
        self.running.add(job)
        return Placement(
            job_id=job.job_id,
            region=job.pool_key[0],
            sku=job.pool_key[1],
            kind=units[0].kind,
            resource_ids=tuple(u.rid for u in units),
            nodes=tuple(dict.fromkeys(u.node for u in units)),
        )

    # ==================================================================== repartitioning
    def apply_repartition(
        self, step: RepartitionStep, created: list[tuple[str, PartitionRequest, int, int | None]]
    ) -> list[Unit]:
        """Record that ``step`` was carried out: ``created`` lists (new resource id, request
        with its placement, memory MiB, compute units/slices). The new partitions are held
        for the step's job; the device is no longer pending."""
        return repartition.apply_step(self.fleet, self.jobs.get(step.job_id), step, created)

    def abandon_repartition(self, step: RepartitionStep) -> None:
        """The step could not be carried out: release what it held."""
        repartition.abandon_step(self.fleet, self.jobs.get(step.job_id), step)

    # ==================================================================== preemption
    def plan_preemption(self, job_id: str, now: float) -> Preemption | None:
        """The lower-priority victims whose units would let the job run: lowest priority
        first, then the least work at risk (preemption.py)."""
        return preemption.plan(self, self._job(job_id), now)

    def apply_preemption(self, plan: Preemption) -> None:
        """Victims start stopping; what they free is earmarked for the preemptor."""
        job = self._job(plan.job_id)
        for e in plan.evictions:
            v = self._job(e.job_id)
            if v.state != RUNNING:
                raise InvalidRequestError(f"victim {e.job_id!r} is {v.state}, not running")
            v.state = STOPPING
            v.stop_action = e.action
            v.stop_for = job.job_id
            v.release_on_stop = e.release if e.action == "shrink" else tuple(v.allocation)
            for rid in e.release:
                v.allocation[rid].earmark = job.job_id
            job.waiting_for.add(v.job_id)
        job.pool_key = (plan.region, plan.sku)

    def preempt(self, job_id: str, now: float) -> Preemption | None:
        """Plan and apply in one call (the decision the benchmark times)."""
        plan = self.plan_preemption(job_id, now)
        if plan is not None:
            self.apply_preemption(plan)
        return plan

    # ==================================================================== job events
    def stopped(self, job_id: str, now: float, checkpoint_id: str | None = None) -> Job:
        """A stopping (or running) job has stopped through a checkpoint: re-queue it (it
        resumes from that checkpoint), hand what it freed to whom it was freed for."""
        job = self._job(job_id)
        if job.state not in (RUNNING, STOPPING):
            raise InvalidRequestError(f"job {job_id!r} is {job.state}; only a running job stops")
        action = job.stop_action or "preempt"
        if checkpoint_id is not None:
            job.last_checkpoint_id = checkpoint_id
        job.checkpoint_at_s = now
        beneficiary = self.jobs.get(job.stop_for or "")
        self.running.remove(job)
        releasing = set(job.release_on_stop)
        for u in list(job.allocation.values()):
            self.fleet.set_owner(u, None)
            mark, u.earmark = u.earmark, None
            if action in ("shrink", "grow") and u.rid not in releasing:
                hold(self.fleet, job, u)  # kept for its own restart
            elif (
                mark is not None
                and beneficiary is not None
                and beneficiary.job_id == mark
                and beneficiary.state in (QUEUED, RESERVED)
            ):
                hold(self.fleet, beneficiary, u)
        job.allocation.clear()
        if beneficiary is not None:
            beneficiary.waiting_for.discard(job_id)
        job.stop_for = None
        job.release_on_stop = ()
        job.stop_action = None
        if action == "cancel":
            release_holds(self.fleet, job)
            job.state = CANCELLED
            job.ended_at_s = now
            return job
        if action in ("preempt", "shrink"):
            job.preemptions += 1
        job.state = QUEUED
        self.queue.add(job.job_id, job.priority, job.seq, job.request.pool)
        return job

    def stop_failed(self, job_id: str) -> None:
        """The job never acknowledged its stop: it keeps running; its preemptor looks again."""
        job = self._job(job_id)
        if job.state != STOPPING:
            return
        for u in job.allocation.values():
            u.earmark = None
        beneficiary = self.jobs.get(job.stop_for or "")
        if beneficiary is not None:
            beneficiary.waiting_for.discard(job_id)
            if job.stop_action == "grow":
                release_holds(self.fleet, job)
        job.state = RUNNING
        job.stop_action = job.stop_for = None
        job.release_on_stop = ()

    def finish(self, job_id: str, now: float) -> Job:
        return self._end(job_id, now, FINISHED)

    def fail(self, job_id: str, now: float, requeue: bool = False) -> Job:
        """The job failed; with ``requeue`` it goes back to the queue (resumes from its
        last checkpoint) instead of ending."""
        if requeue:
            job = self._job(job_id)
            if job.state == RUNNING:
                job.stop_action = "requeue"
                job.release_on_stop = tuple(job.allocation)
            if job.state in (RUNNING, STOPPING):
                return self.stopped(job_id, now)  # a stopping victim still frees for its preemptor
            return job
        return self._end(job_id, now, FAILED)

    def cancel(self, job_id: str, now: float) -> Job:
        """Cancel a queued or reserved job, or a running one (its process must be stopped
        by the caller first: the service sends checkpoint-and-stop)."""
        return self._end(job_id, now, CANCELLED)

    def _end(self, job_id: str, now: float, state: str) -> Job:
        job = self._job(job_id)
        if job.state in DONE_STATES:
            return job
        if job.state in (RUNNING, STOPPING):
            self.running.remove(job)
            beneficiary = self.jobs.get(job.stop_for or "")
            for u in list(job.allocation.values()):
                self.fleet.set_owner(u, None)
                if (
                    u.earmark
                    and beneficiary is not None
                    and beneficiary.state in (QUEUED, RESERVED)
                ):
                    hold(self.fleet, beneficiary, u)
                u.earmark = None
            if beneficiary is not None:
                beneficiary.waiting_for.discard(job_id)
            job.allocation.clear()
        self.queue.remove(job_id)
        self.reservations.pop(job_id, None)
        release_holds(self.fleet, job)
        self._release_victims(job)
        job.state = state
        job.ended_at_s = now
        return job

    def report_checkpoint(self, job_id: str, now: float, checkpoint_id: str | None = None) -> None:
        job = self._job(job_id)
        job.checkpoint_at_s = now
        if checkpoint_id is not None:
            job.last_checkpoint_id = checkpoint_id

    def _job(self, job_id: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise InvalidRequestError(f"unknown job {job_id!r}")
        return job

    # ==================================================================== fleet events
    def cordon(self, node: str, index: int | None = None, cordoned: bool = True) -> None:
        """New placements avoid the device (or node); what runs there is left alone."""
        if index is None:
            self.fleet.set_node_cordon(node, cordoned)
        else:
            dev = self.fleet.device_at(node, index)
            self.fleet.set_device(dev.uuid, cordoned=cordoned)

    def set_health(self, node: str, index: int, healthy: bool) -> None:
        dev = self.fleet.device_at(node, index)
        self.fleet.set_device(dev.uuid, healthy=healthy)

    # ==================================================================== restoring
    def restore_running(
        self,
        request: JobRequest,
        seq: int,
        units: list[str],
        now: float,
        started_at_s: float | None = None,
        checkpoint_at_s: float | None = None,
    ) -> Job:
        """Rebuild a running job from durable state (the service's refresh)."""
        job = Job(request=request, seq=seq, state=QUEUED, submitted_at_s=now, shape_version=-1)
        self._seq = max(self._seq, seq)
        self.jobs[request.job_id] = job
        self.queue.add(job.job_id, job.priority, job.seq, request.pool)
        picked = [self.fleet.units[r] for r in units if r in self.fleet.units]
        if not picked:
            return job  # its resources are gone: it waits in the queue
        for u in picked:
            if u.holder is not None or u.owner is not None:
                raise InvalidRequestError(
                    f"resource {u.rid} restored for {request.job_id!r} is taken"
                )
        self._start(job, picked, started_at_s if started_at_s is not None else now)
        job.checkpoint_at_s = checkpoint_at_s if checkpoint_at_s is not None else now
        return job

    def restore_holds(self, job_id: str, units: list[str]) -> None:
        job = self._job(job_id)
        for r in units:
            u = self.fleet.units.get(r)
            if u is not None and u.free:
                hold(self.fleet, job, u)

    def forget(self, job_id: str) -> None:
        """Drop a job as if it had never been restored: what it runs on or holds is free
        again, its links to its victims and to whom it stops for are cut. The service
        forgets a job whose inventory rows changed and restores it anew from them."""
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        if job.state in (RUNNING, STOPPING):
            self.running.remove(job)  # before the allocation goes: it counts the units
        for u in job.allocation.values():
            if u.owner == job_id:
                self.fleet.set_owner(u, None)
            u.earmark = None
        job.allocation.clear()
        release_holds(self.fleet, job)
        self.queue.remove(job_id)
        self.reservations.pop(job_id, None)
        beneficiary = self.jobs.get(job.stop_for or "")
        if beneficiary is not None:
            beneficiary.waiting_for.discard(job_id)
        self._release_victims(job)

    def _release_victims(self, job: Job) -> None:
        """The units earmarked for ``job`` by the victims it waits for are earmarked no more."""
        for vid in list(job.waiting_for):
            victim = self.jobs.get(vid)
            if victim is not None:
                for u in victim.allocation.values():
                    if u.earmark == job.job_id:
                        u.earmark = None
        job.waiting_for.clear()

    def mark_external(self, rid: str, owner: str) -> None:
        """A resource leased by someone the scheduler does not know: not free, not a victim."""
        u = self.fleet.units.get(rid)
        if u is not None and u.free:
            self.fleet.set_owner(u, EXTERNAL + owner)

    # ==================================================================== reading
    def live_jobs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state not in DONE_STATES]

    def audit(self) -> list[str]:
        """Every invariant, checked from scratch; [] when all hold."""
        problems = list(self.fleet.audit())
        seen: dict[str, str] = {}
        for job in self.jobs.values():
            for rid, u in job.allocation.items():
                if u.owner != job.job_id:
                    problems.append(f"{job.job_id}: allocation {rid} owned by {u.owner}")
                if rid in seen:
                    problems.append(f"{rid} allocated to {seen[rid]} and {job.job_id}")
                seen[rid] = job.job_id
            for rid, u in job.holds.items():
                if u.holder != job.job_id:
                    problems.append(f"{job.job_id}: hold {rid} held by {u.holder}")
                if rid in seen:
                    problems.append(f"{rid} claimed by {seen[rid]} and {job.job_id}")
                seen[rid] = job.job_id
            if job.state in (RUNNING, STOPPING):
                if not job.allocation and job.stop_action != "grow":
                    problems.append(f"{job.job_id}: {job.state} with nothing allocated")
                pools = {u.pool for u in job.allocation.values()}
                kinds = {(u.kind, u.profile) for u in job.allocation.values()}
                if len(pools) > 1 or len(kinds) > 1:
                    problems.append(
                        f"{job.job_id}: mixed gang {sorted(pools)} {sorted(map(str, kinds))}"
                    )
                if job.state == RUNNING and len(job.allocation) < job.request.min_units:
                    problems.append(
                        f"{job.job_id}: runs on {len(job.allocation)} < {job.request.min_units}"
                    )
            elif job.allocation:
                problems.append(f"{job.job_id}: {job.state} but holds an allocation")
            if job.state in DONE_STATES and job.holds:
                problems.append(f"{job.job_id}: {job.state} but holds units")
            queued = job.job_id in self.queue
            if queued != (job.state == QUEUED):
                problems.append(f"{job.job_id}: state {job.state} but queued={queued}")
            if (job.job_id in self.reservations) != (job.state == RESERVED):
                problems.append(f"{job.job_id}: state {job.state} vs reservations")
        for u in self.fleet.units.values():
            for who in (u.owner, u.holder):
                if who is None or who.startswith(EXTERNAL):
                    continue
                j = self.jobs.get(who)
                if j is None or (u.rid not in j.allocation and u.rid not in j.holds):
                    problems.append(f"{u.rid}: claimed by {who} which does not list it")
        return problems
