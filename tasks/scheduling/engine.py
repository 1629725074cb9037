"""The placement engine: in-memory, synchronous, decides in milliseconds.

It owns the job lifecycle (queued -> running -> finished, with reservations, stops for
preemption, shrink and growth) over a FleetIndex, and never touches a device or a
database: every decision is returned as a frozen record (model.py) for a caller to carry
out. The service (service.py) mirrors it to the inventory and the control channel; the
trace simulator drives it directly.

Rules it never breaks:
- a gang is all-or-nothing and homogeneous: one SKU, one region, one kind of unit;
- a unit is held by at most one job, for running (owner) or for a start to come (holder);
- a job is in exactly one state, and only done jobs leave the live set.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuflow.hardware.backend import InvalidRequestError, PartitionRequest
from gpuflow.tasks.scheduling.fleet_index import Dev, FleetIndex, PoolKey, Unit, spec_or_none
from gpuflow.tasks.scheduling.model import (
    CANCELLED,
    DONE_STATES,
    FAILED,
    FINISHED,
    QUEUED,
    RESERVED,
    RUNNING,
    STOPPING,
    VDCU,
    Activation,
    Eviction,
    Growth,
    HoldChange,
    JobRequest,
    Placement,
    Preemption,
    QueueFullError,
    SchedulerConfig,
    SubmissionRefused,
)
from gpuflow.tasks.scheduling.preemption import Candidate, Choice, choose_victims
from gpuflow.tasks.scheduling.queue import JobQueue
from gpuflow.tasks.scheduling.repartition import RepartitionStep, mig_fit

EXTERNAL = "external:"  # owner prefix of leases the scheduler did not make


def _speed(sku: str) -> float:
    spec = spec_or_none(sku)
    return spec.reduced_tflops if spec is not None else -1.0


Entry = tuple[
    float, int, int, str, int, bool
]  # (cost per unit, priority, -units, job, units, shrink)


def _cheapest_cover(
    entries: list[Entry], need: int, risk: dict[str, tuple[float, float] | None]
) -> tuple[float, int, list[Entry]] | None:
    """choose_victims on plain tuples, for the few victims of one node: (cost, victims,
    entries) of the greedy-then-prune cover, or of the cheapest lone victim if cheaper."""
    if sum(e[4] for e in entries) < need:
        return None
    entries = sorted(entries)
    chosen: list[Entry] = []
    got = 0
    for e in entries:
        chosen.append(e)
        got += e[4]
        if got >= need:
            break
    cost = {e[3]: risk[e[3]][0] for e in chosen}  # type: ignore[index]
    for e in sorted(chosen, key=lambda e: (-cost[e[3]], -e[1], e[3])):
        if got - e[4] >= need:
            chosen.remove(e)
            got -= e[4]
    total = sum(risk[e[3]][0] for e in chosen)  # type: ignore[index]
    lone = [e for e in entries if e[4] >= need]
    if lone:
        single = min(lone, key=lambda e: (risk[e[3]][0], e[1], e[4], e[3]))  # type: ignore[index]
        if risk[single[3]][0] < total:  # type: ignore[index]
            return risk[single[3]][0], 1, [single]  # type: ignore[index]
    return total, len(chosen), chosen


@dataclass(eq=False)
class Job:
    request: JobRequest
    seq: int
    state: str
    submitted_at_s: float
    candidates: tuple[PoolKey, ...] = ()
    shape_version: int = -1
    pool_key: PoolKey | None = None  # where its allocation or holds are
    allocation: dict[str, Unit] = field(default_factory=dict)
    holds: dict[str, Unit] = field(default_factory=dict)
    started_at_s: float | None = None
    checkpoint_at_s: float = 0.0
    checkpoint_every_s: float | None = None  # known cadence (the simulator's jobs)
    last_checkpoint_id: str | None = None
    stop_action: str | None = None  # preempt | shrink | grow | cancel
    stop_for: str | None = None
    release_on_stop: tuple[str, ...] = ()
    waiting_for: set[str] = field(default_factory=set)
    preemptions: int = 0
    ended_at_s: float | None = None
    preemptible: bool = True
    unit_key: tuple[str, str | None] = ("device", None)

    def __post_init__(self) -> None:
        req = self.request
        self.preemptible = req.preemptible
        self.unit_key = (req.kind, req.profile if req.kind == "mig" else None)

    @property
    def job_id(self) -> str:
        return self.request.job_id

    @property
    def priority(self) -> int:
        return self.request.priority

    def work_at_risk_s(self, now: float) -> float:
        """Device-seconds done since the last checkpoint (what an eviction puts at stake)."""
        since = max(0.0, now - self.checkpoint_at_s)
        if self.checkpoint_every_s:
            since = math.fmod(since, self.checkpoint_every_s)
        return since * len(self.allocation)


class Engine:
    def __init__(
        self, config: SchedulerConfig | None = None, fleet: FleetIndex | None = None
    ) -> None:
        self.config = config or SchedulerConfig()
        self.fleet = fleet or FleetIndex()
        self.jobs: dict[str, Job] = {}
        self.queue = JobQueue(fifo=self.config.fifo or self.config.policy == "first-fit")
        self.reservations: dict[str, Job] = {}
        self._seq = 0
        # Running jobs per pool, and their priorities: preemption looks only where it helps.
        self._running: dict[PoolKey, dict[str, None]] = {}
        self._running_prio: dict[PoolKey, Counter[int]] = {}
        self._running_units: dict[
            PoolKey, Counter[int]
        ] = {}  # units of preemptible jobs by priority
        # Whole-device units of running jobs per node (node-local gang preemption).
        self._node_jobs: dict[str, Counter[str]] = {}

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
        pool holds, an unknown region or SKU)."""
        fleet = self.fleet
        if not fleet.pools:
            raise SubmissionRefused("the scheduler knows no devices yet (sync the inventory first)")
        if request.resource_ids:
            return self._check_pinned(request)
        regions = fleet.regions()
        if request.region is not None and request.region not in regions:
            raise SubmissionRefused(
                f"unknown region {request.region!r}; the fleet has: {', '.join(regions)}"
            )
        if request.region is None:
            allowed_regions = regions
        elif request.allow_spill:
            allowed_regions = [request.region] + [r for r in regions if r != request.region]
        else:
            allowed_regions = [request.region]
        in_regions = [
            s for s in fleet.skus() if any((r, s) in fleet.pools for r in allowed_regions)
        ]
        skus = list(request.skus) if request.skus else in_regions
        missing = [s for s in skus if s not in in_regions]
        if request.skus and len(missing) == len(skus):
            raise SubmissionRefused(
                f"no {' / '.join(skus)} in {' / '.join(allowed_regions)}; "
                f"the fleet there has: {', '.join(in_regions) or 'nothing'}"
            )
        skus = [s for s in skus if s not in missing]
        fitting: list[tuple[PoolKey, int]] = []
        reasons: list[str] = []
        for s in skus:
            for r in allowed_regions:
                pool = fleet.pools.get((r, s))
                if pool is None:
                    continue
                cap, why = self._capacity(request, (r, s))
                if cap >= request.count:
                    fitting.append(((r, s), cap))
                elif why:
                    reasons.append(why)
                else:
                    reasons.append(f"{r}/{s} has room for at most {cap}")
        if not fitting:
            what = request.describe()
            detail = "; ".join(dict.fromkeys(reasons)) or "no pool matches"
            raise SubmissionRefused(f"no fleet of this shape can run {what}: {detail}")
        return tuple(p for p, _ in fitting)

    def _capacity(self, request: JobRequest, key: PoolKey) -> tuple[int, str]:
        """How many units of the request's kind the pool could hold at most, and why not."""
        pool = self.fleet.pools[key]
        region, sku = key
        if request.kind == "device":
            return pool.devices, ""
        spec = next((d.spec for d in self._pool_devices(key)), None)
        if request.kind == "mig":
            if spec is not None and spec.supports_mig:
                prof = next((p for p in spec.mig_profiles if p.name == request.profile), None)
                if prof is None:
                    offered = ", ".join(p.name for p in spec.mig_profiles)
                    return 0, f"{sku} offers no MIG profile {request.profile} (it offers {offered})"
                return pool.devices * prof.max_count, ""
            existing = self.fleet.parts.get((region, sku, request.profile or ""))
            if spec is None and existing is not None:
                return existing.count, ""
            return 0, f"{sku} has no MIG"
        if spec is None or not spec.supports_vdcu:
            return 0, f"{sku} offers no vDCUs"
        cu, mb = request.compute_units or 1, request.memory_mb or 1
        if cu > spec.compute_units or mb > spec.memory_total_mb:
            return 0, (
                f"a vDCU of {cu} CUs / {mb} MiB exceeds a whole {sku} "
                f"({spec.compute_units} CUs, {spec.memory_total_mb} MiB)"
            )
        per_dev = min(spec.vdcu_max_count, spec.compute_units // cu, spec.memory_total_mb // mb)
        return pool.devices * per_dev, ""

    def _pool_devices(self, key: PoolKey) -> Iterable[Dev]:
        pool = self.fleet.pools[key]
        for name in pool.nodes:
            for d in self.fleet.nodes[name].devices:
                if d.sku == key[1]:
                    yield d

    def _check_pinned(self, request: JobRequest) -> tuple[PoolKey, ...]:
        units = []
        for rid in request.resource_ids:
            unit = self.fleet.units.get(rid)
            if unit is None:
                raise SubmissionRefused(
                    f"unknown resource {rid!r}: not a device or partition of the fleet"
                )
            units.append(unit)
        pools = {u.pool for u in units}
        kinds = {(u.kind, u.profile) for u in units}
        if len(pools) > 1 or len(kinds) > 1:
            raise SubmissionRefused(
                f"pinned resources must be one kind on one SKU in one region; got {sorted(pools)} "
                f"and {sorted(k for k, _ in kinds)}"
            )
        kind, profile = next(iter(kinds))
        if kind != request.kind or (kind == "mig" and profile != request.profile):
            what = profile if kind == "mig" else kind
            raise SubmissionRefused(
                f"pinned resources are {what} units, the request asks for {request.describe()}"
            )
        return (next(iter(pools)),)

    def _candidates(self, job: Job) -> tuple[PoolKey, ...]:
        if job.shape_version != self.fleet.shape_version:
            try:
                job.candidates = self.check_feasible(job.request)
            except SubmissionRefused:
                job.candidates = ()  # the fleet shrank below it: it waits for it to return
            job.shape_version = self.fleet.shape_version
        return job.candidates

    def _ordered_pools(self, job: Job, policy: str) -> list[PoolKey]:
        pools = self._candidates(job)
        if job.holds:
            return [job.pool_key] if job.pool_key in pools or job.request.resource_ids else []
        req = job.request
        if req.skus or policy == "first-fit" or len(pools) < 2:
            return list(pools)
        # No stated preference: the fastest SKU that can take the job (the twin's dense
        # reduced-precision throughput; SKUs the tables do not know come last), home region
        # first; pools that cannot take it now go after those that can.
        home = req.region
        free = {p: self.fleet.free_count(p, req.kind, req.profile) for p in pools}
        return sorted(
            pools,
            key=lambda p: (
                p[0] != home if home else False,
                free[p] < req.min_units,
                -_speed(p[1]),
                p,
            ),
        )

    # ==================================================================== placement
    def place(self, job_id: str, now: float) -> Placement | None:
        """One placement decision for a queued job: where it runs now, the repartitioning
        that would make room (the job then waits for it), or None."""
        job = self._job(job_id)
        if job.state != QUEUED:
            raise InvalidRequestError(f"job {job_id!r} is {job.state}, not queued")
        req = job.request
        policy = req.policy or self.config.policy
        if req.resource_ids:
            units = [self.fleet.units[r] for r in req.resource_ids if r in self.fleet.units]
            if len(units) == len(req.resource_ids) and all(self._usable_for(u, job) for u in units):
                return self._start(job, units, now)
            return None
        for pool in self._ordered_pools(job, policy):
            units = self._pick(job, pool, policy)
            if units:
                return self._start(job, units, now)
        if not job.holds:
            for pool in self._ordered_pools(job, policy):
                if req.kind == "device":
                    plan = self._propose_merge(job, pool)
                else:
                    plan = self._propose(job, pool, policy)
                if plan is not None:
                    return plan
        return None

    def _usable_for(self, unit: Unit, job: Job) -> bool:
        if unit.owner is not None or unit.holder not in (None, job.job_id):
            return False
        if unit.holder == job.job_id:
            return True
        return self.fleet.should_be_free(unit)

    def _node_local(self, req: JobRequest, pool: PoolKey) -> bool:
        p = self.fleet.pools[pool]
        return (
            self.config.node_local_gangs
            and req.kind == "device"
            and not req.elastic
            and 1 < req.min_units <= p.max_per_node
        )

    def _pick(self, job: Job, pool: PoolKey, policy: str) -> list[Unit] | None:
        req = job.request
        holds = [u for u in job.holds.values() if u.pool == pool]
        free = self.fleet.free_count(pool, req.kind, req.profile)
        if req.kind == VDCU:
            fits = self._vdcu_candidates(pool, req)
            if len(holds) + len(fits) < req.min_units:
                return None
            take = min(req.max_units, len(holds) + len(fits)) - len(holds)
            return holds + fits[: max(0, take)]
        if len(holds) + free < req.min_units:
            return None
        if req.kind == "device" and self._node_local(req, pool):
            return self._pick_node_local(pool, req.min_units, policy, holds)
        want = min(req.max_units, len(holds) + free)
        more = max(0, want - len(holds))
        if req.kind == "device":
            picked = self._pick_whole(pool, more, policy)
        else:
            picked = self._pick_parts((pool[0], pool[1], req.profile or ""), more, policy)
        return holds + picked

    def _pick_node_local(
        self, pool: PoolKey, n: int, policy: str, holds: list[Unit]
    ) -> list[Unit] | None:
        p = self.fleet.pools[pool]
        if holds:
            by_node: dict[str, list[Unit]] = {}
            for u in holds:
                by_node.setdefault(u.node, []).append(u)
            for node, mine in sorted(by_node.items(), key=lambda kv: -len(kv[1])):
                if len(mine) >= n:
                    return mine[:n]
                if len(mine) + p.free_on(node) >= n:
                    rids = list(p.node_free.get(node, {}))[: n - len(mine)]
                    return mine + [self.fleet.units[r] for r in rids]
        node = self._choose_node(pool, n, policy)
        if node is None:
            return None
        rids = list(p.node_free[node])[:n]
        return [self.fleet.units[r] for r in rids]

    def _choose_node(self, pool: PoolKey, n: int, policy: str) -> str | None:
        p = self.fleet.pools[pool]
        if policy == "first-fit":
            for node in p.nodes:
                if p.free_on(node) >= n:
                    return node
            return None
        sizes = range(n, p.max_per_node + 1)
        for k in reversed(sizes) if policy == "spread" else sizes:
            bucket = p.buckets.get(k)
            if bucket:
                return next(iter(bucket))
        return None

    def _pick_whole(self, pool: PoolKey, n: int, policy: str) -> list[Unit]:
        """``n`` free whole devices of the pool over any nodes (the caller checked the count)."""
        if n <= 0:
            return []
        p = self.fleet.pools[pool]
        units = self.fleet.units
        out: list[Unit] = []
        if policy == "first-fit":
            for node in p.nodes:
                for rid in p.node_free.get(node, ()):
                    out.append(units[rid])
                    if len(out) == n:
                        return out
            return out
        if n <= p.max_per_node:
            node = self._choose_node(pool, n, policy)
            if node is not None:
                return [units[r] for r in list(p.node_free[node])[:n]]
        if policy == "spread":
            # One device per node, roomiest nodes first, round after round.
            lists = [
                list(p.node_free[node])
                for k in sorted(p.buckets, reverse=True)
                for node in p.buckets[k]
            ]
            i = 0
            while len(out) < n:
                for rids in lists:
                    if i < len(rids):
                        out.append(units[rids[i]])
                        if len(out) == n:
                            return out
                i += 1
            return out
        # Binpack: whole free nodes first (fewest nodes), the remainder on the tightest node.
        rem = n
        skipped: list[str] = []
        for k in sorted(p.buckets, reverse=True):
            for node in p.buckets[k]:
                if k <= rem:
                    out.extend(units[r] for r in p.node_free[node])
                    rem -= k
                    if rem == 0:
                        return out
                else:
                    skipped.append(node)
        best = min(skipped, key=lambda node: p.free_on(node), default=None)
        if best is not None and rem > 0:
            out.extend(units[r] for r in list(p.node_free[best])[:rem])
        return out

    def _pick_parts(self, key: tuple[str, str, str], n: int, policy: str) -> list[Unit]:
        if n <= 0:
            return []
        pp = self.fleet.parts.get(key)
        if pp is None:
            return []
        units = self.fleet.units
        out: list[Unit] = []
        if policy == "first-fit":
            order = sorted(
                pp.dev_free, key=lambda u: (self.fleet.devices[u].node, self.fleet.devices[u].index)
            )
        else:
            busy = sorted(pp.buckets, reverse=policy != "spread")
            order = [d for b in busy for d in pp.buckets[b]]
        for dev_uuid in order:
            for rid in pp.dev_free[dev_uuid]:
                out.append(units[rid])
                if len(out) == n:
                    return out
        return out

    def _vdcu_candidates(self, pool: PoolKey, req: JobRequest) -> list[Unit]:
        """Free vDCUs at least as big as asked, smallest first (best fit)."""
        free = self.fleet.vdcu_free.get(pool)
        if not free:
            return []
        cu, mb = req.compute_units or 0, req.memory_mb or 0
        units = [self.fleet.units[r] for r in free]
        fits = [u for u in units if (u.compute_units or 0) >= cu and u.memory_mb >= mb]
        fits.sort(key=lambda u: (u.memory_mb, u.compute_units or 0, u.rid))
        return fits

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
        self._track_running(job, True)
        return Placement(
            job_id=job.job_id,
            region=job.pool_key[0],
            sku=job.pool_key[1],
            kind=units[0].kind,
            resource_ids=tuple(u.rid for u in units),
            nodes=tuple(dict.fromkeys(u.node for u in units)),
        )

    def _track_running(self, job: Job, on: bool) -> None:
        key = job.pool_key
        if key is None:
            return
        running = self._running.setdefault(key, {})
        prio = self._running_prio.setdefault(key, Counter())
        units = self._running_units.setdefault(key, Counter())
        if on:
            running[job.job_id] = None
            if job.request.preemptible:
                prio[job.priority] += 1
                units[job.priority] += len(job.allocation)
            for u in job.allocation.values():
                if u.kind == "device":
                    self._node_jobs.setdefault(u.node, Counter())[job.job_id] += 1
        else:
            if job.job_id in running:
                del running[job.job_id]
                if job.request.preemptible:
                    prio[job.priority] -= 1
                    if prio[job.priority] <= 0:
                        del prio[job.priority]
                    units[job.priority] -= len(job.allocation)
                    if units[job.priority] <= 0:
                        del units[job.priority]
            for u in job.allocation.values():
                if u.kind == "device":
                    c = self._node_jobs.get(u.node)
                    if c is not None:
                        c[job.job_id] -= 1
                        if c[job.job_id] <= 0:
                            del c[job.job_id]

    # ==================================================================== repartitioning
    def _propose(self, job: Job, pool: PoolKey, policy: str) -> Placement | None:
        """Cut devices so the partitions the job needs exist; hold what it will use."""
        req = job.request
        fleet = self.fleet
        if req.kind == VDCU:
            have = self._vdcu_candidates(pool, req)
        else:
            have = self._pick_parts((pool[0], pool[1], req.profile or ""), req.min_units, policy)
        need = req.min_units - len(have)
        if need <= 0:
            return None  # _pick would have placed it
        steps = (
            self._propose_vdcu(job, pool, need, policy)
            if req.kind == VDCU
            else self._propose_mig(job, pool, need, policy)
        )
        if steps is None:
            return None
        for u in have[: req.min_units]:
            fleet.set_holder(u, job.job_id)
            job.holds[u.rid] = u
        for step in steps:
            dev = fleet.devices[step.device_uuid]
            if not dev.parts and dev.whole.free:
                fleet.set_holder(dev.whole, job.job_id)  # the device leaves the whole pool
                job.holds[dev.whole.rid] = dev.whole
            for rid in step.destroy:
                u = fleet.units[rid]
                fleet.set_holder(u, job.job_id)
                job.holds[rid] = u
            fleet.set_pending(dev, job.job_id)
        job.pool_key = pool
        return Placement(
            job_id=job.job_id,
            region=pool[0],
            sku=pool[1],
            kind=req.kind,
            resource_ids=tuple(u.rid for u in have[: req.min_units]),
            nodes=tuple(dict.fromkeys(s.node for s in steps)),
            repartition=tuple(steps),
        )

    def _propose_merge(self, job: Job, pool: PoolKey) -> Placement | None:
        """Whole devices wanted, too few free: merge idle cut devices back into whole ones."""
        fleet = self.fleet
        idle = [fleet.devices[u] for u in fleet.idle_parted.get(pool, {})]
        if not idle:
            return None
        req = job.request
        p = fleet.pools[pool]
        if self._node_local(req, pool):
            by_node: dict[str, list[Dev]] = {}
            for d in idle:
                by_node.setdefault(d.node, []).append(d)
            choice = None
            for node, devs in by_node.items():
                if p.free_on(node) + len(devs) >= req.min_units:
                    choice = node
                    break
            if choice is None:
                return None
            have = [fleet.units[r] for r in p.node_free.get(choice, {})][: req.min_units]
            merge = by_node[choice][: req.min_units - len(have)]
        else:
            have = self._pick_whole(pool, min(req.min_units, p.whole_free), "binpack")
            if len(have) + len(idle) < req.min_units:
                return None
            merge = idle[: req.min_units - len(have)]
        steps = [
            RepartitionStep(
                job_id=job.job_id,
                node=d.node,
                index=d.index,
                device_uuid=d.uuid,
                sku=d.sku,
                kind="mig" if d.mig else VDCU,
                destroy=tuple(d.parts),
                create=(),
                keep=(),
            )
            for d in merge
        ]
        for u in have:
            fleet.set_holder(u, job.job_id)
            job.holds[u.rid] = u
        for d in merge:
            for u in d.parts.values():
                fleet.set_holder(u, job.job_id)
                job.holds[u.rid] = u
            fleet.set_pending(d, job.job_id)
        job.pool_key = pool
        return Placement(
            job_id=job.job_id,
            region=pool[0],
            sku=pool[1],
            kind="device",
            resource_ids=tuple(u.rid for u in have),
            nodes=tuple(dict.fromkeys(d.node for d in merge)),
            repartition=tuple(steps),
        )

    def _propose_mig(
        self, job: Job, pool: PoolKey, need: int, policy: str
    ) -> list[RepartitionStep] | None:
        fleet = self.fleet
        profile = job.request.profile or ""
        steps: list[RepartitionStep] = []
        used: set[str] = set()

        def step(
            dev: Dev, fitted: tuple[PartitionRequest, ...], destroy: tuple[str, ...] = ()
        ) -> None:
            keep = tuple(
                (p.profile or "", p.compute_units, p.memory_mb)
                for p in dev.parts.values()
                if p.rid not in destroy
            )
            steps.append(
                RepartitionStep(
                    job_id=job.job_id,
                    node=dev.node,
                    index=dev.index,
                    device_uuid=dev.uuid,
                    sku=dev.sku,
                    kind="mig",
                    destroy=destroy,
                    create=fitted,
                    keep=keep,
                )
            )
            used.add(dev.uuid)

        def additive() -> int:
            left = need - sum(len(s.create) for s in steps)
            for sig, group in list(fleet.layouts.get(pool, {}).items()):
                if left <= 0:
                    break
                for uuid in list(group):
                    dev = fleet.devices[uuid]
                    if dev.spec is None or uuid in used:
                        continue
                    fitted = mig_fit(dev.spec, sig, profile, left)
                    if not fitted:
                        break  # the same layout everywhere in the group
                    step(dev, fitted)
                    left -= len(fitted)
                    if left <= 0:
                        break
            return left

        def idle_parted() -> int:
            left = need - sum(len(s.create) for s in steps)
            for uuid in list(fleet.idle_parted.get(pool, {})):
                if left <= 0:
                    break
                dev = fleet.devices[uuid]
                if dev.spec is None or uuid in used or not dev.mig:
                    continue
                fitted = mig_fit(dev.spec, (), profile, left)
                if fitted:
                    step(dev, fitted, destroy=tuple(dev.parts))
                    left -= len(fitted)
            return left

        def whole() -> int:
            left = need - sum(len(s.create) for s in steps)
            p = fleet.pools[pool]
            while left > 0:
                node = self._choose_node(pool, 1, "binpack" if policy != "spread" else "spread")
                candidates = [
                    fleet.units[r].dev
                    for r in (p.node_free.get(node, {}) if node else {})
                    if fleet.units[r].dev.uuid not in used
                ]
                if not candidates:
                    # The chosen node's devices are all used by this proposal: scan the rest.
                    candidates = [
                        fleet.units[r].dev
                        for rids in p.node_free.values()
                        for r in rids
                        if fleet.units[r].dev.uuid not in used
                    ][:1]
                if not candidates:
                    break
                dev = candidates[0]
                fitted = mig_fit(dev.spec, (), profile, left) if dev.spec and dev.mig else ()
                if not fitted:
                    break
                step(dev, fitted)
                left -= len(fitted)
            return left

        order = (
            (additive, whole, idle_parted) if policy == "spread" else (additive, idle_parted, whole)
        )
        left = need
        for stage in order:
            left = stage()
            if left <= 0:
                return steps
        return None

    def _propose_vdcu(
        self, job: Job, pool: PoolKey, need: int, policy: str
    ) -> list[RepartitionStep] | None:
        req = job.request
        if req.compute_units is None or req.memory_mb is None:
            return None  # an unsized vDCU request takes existing vDCUs only
        fleet = self.fleet
        cu, mb = req.compute_units, req.memory_mb
        steps: list[RepartitionStep] = []
        devs = [fleet.devices[u] for u in fleet.vdcu_budget.get(pool, {})]
        p = fleet.pools[pool]
        devs += [
            fleet.units[r].dev
            for rids in p.node_free.values()
            for r in rids
            if fleet.units[r].dev.vdcu
        ]
        left = need
        for dev in devs:
            room = fleet.vdcu_room(dev)
            spec = dev.spec
            if room is None or spec is None:
                continue
            slots = spec.vdcu_max_count - len(dev.parts)
            k = min(left, slots, room[0] // cu, room[1] // mb)
            if k <= 0:
                continue
            keep = tuple((VDCU, u.compute_units, u.memory_mb) for u in dev.parts.values())
            create = tuple(PartitionRequest(VDCU, compute_units=cu, memory_mb=mb) for _ in range(k))
            steps.append(
                RepartitionStep(
                    job_id=job.job_id,
                    node=dev.node,
                    index=dev.index,
                    device_uuid=dev.uuid,
                    sku=dev.sku,
                    kind=VDCU,
                    destroy=(),
                    create=create,
                    keep=keep,
                )
            )
            left -= k
            if left <= 0:
                return steps
        return None

    def apply_repartition(
        self, step: RepartitionStep, created: list[tuple[str, PartitionRequest, int, int | None]]
    ) -> list[Unit]:
        """Record that ``step`` was carried out: ``created`` lists (new resource id, request
        with its placement, memory MiB, compute units/slices). The new partitions are held
        for the step's job; the device is no longer pending."""
        fleet = self.fleet
        dev = fleet.devices.get(step.device_uuid)
        if dev is None:
            raise InvalidRequestError(
                f"repartitioned device {step.device_uuid!r} is not in the fleet"
            )
        job = self.jobs.get(step.job_id)
        if dev.whole.holder == step.job_id:
            fleet.set_holder(dev.whole, None)
            if job is not None:
                job.holds.pop(dev.whole.rid, None)
        for rid in step.destroy:
            unit = fleet.units.get(rid)
            if unit is not None:
                fleet.set_holder(unit, None)
                fleet.remove_partition(rid)
            if job is not None:
                job.holds.pop(rid, None)
        out = []
        for rid, req, memory_mb, units in created:
            kind = VDCU if req.profile == VDCU else "mig"
            slices = units
            size = None
            if kind == "mig" and dev.spec is not None:
                prof = dev.spec.mig_profile(req.profile)
                slices, size = prof.compute_slices, prof.placement_size
            u = fleet.add_partition(
                dev.uuid,
                rid,
                req.profile,
                kind,
                memory_mb,
                compute_units=slices,
                placement_start=req.placement_start,
                placement_size=size,
            )
            if job is not None and job.state in (QUEUED, RESERVED):
                fleet.set_holder(u, job.job_id)
                job.holds[rid] = u
            out.append(u)
        fleet.set_pending(dev, None)
        if not dev.parts and job is not None and job.state in (QUEUED, RESERVED) and dev.whole.free:
            self._hold(job, dev.whole)  # merged back into a whole device, for this job
            out.append(dev.whole)
        return out

    def abandon_repartition(self, step: RepartitionStep) -> None:
        """The step could not be carried out: release what it held."""
        dev = self.fleet.devices.get(step.device_uuid)
        job = self.jobs.get(step.job_id)
        if dev is None:
            return
        for u in [dev.whole, *dev.parts.values()]:
            if u.holder == step.job_id:
                self.fleet.set_holder(u, None)
                if job is not None:
                    job.holds.pop(u.rid, None)
        self.fleet.set_pending(dev, None)

    # ==================================================================== preemption
    def plan_preemption(self, job_id: str, now: float) -> Preemption | None:
        """The cheapest set of lower-priority victims whose units would let the job run."""
        job = self._job(job_id)
        if job.state != QUEUED or job.waiting_for or not self.config.preemption:
            return None
        req = job.request
        if req.resource_ids:
            return self._plan_pinned(job, now)
        best: tuple[float, int, Preemption] | None = None
        risk: dict[str, tuple[float, float] | None] = {}  # victim -> (cost, cost per unit)
        for pool in self._ordered_pools(job, req.policy or self.config.policy):
            units = self._running_units.get(pool)
            if not units or min(units) >= job.priority:
                continue  # nobody lower here
            low = sum(n for prio, n in units.items() if prio < job.priority)
            if low + self.fleet.free_count(pool, req.kind, req.profile) < req.min_units:
                continue  # even evicting every lower job would not make room
            plan = self._plan_in_pool(job, pool, now, risk, best[0] if best else math.inf)
            if plan is not None:
                # The job's most preferred pool where eviction makes room wins: a job that
                # prefers H100 evicts there, not on the V100s where it happens to be cheaper.
                return plan
        return None

    def _plan_pinned(self, job: Job, now: float) -> Preemption | None:
        """A pinned job can only evict whoever runs on its resources, and only if every
        one of them may be evicted."""
        risk: dict[str, tuple[float, float] | None] = {}
        release: dict[str, list[str]] = {}
        for rid in job.request.resource_ids:
            unit = self.fleet.units.get(rid)
            if unit is None or not unit.dev.available:
                return None
            if unit.owner is None:
                if unit.holder not in (None, job.job_id):
                    return None
                continue
            if self._risk(unit.owner, job, now, risk) is None:
                return None  # an equal or higher priority, or an outside lease, runs there
            release.setdefault(unit.owner, []).append(rid)
        if not release:
            return None
        unit = self.fleet.units[job.request.resource_ids[0]]
        evictions = tuple(
            Eviction(vid, "preempt", tuple(rids), risk[vid][0], self.jobs[vid].priority)  # type: ignore[index]
            for vid, rids in release.items()
        )
        return Preemption(job.job_id, unit.dev.region, unit.dev.sku, None, evictions)

    def _risk(
        self, vid: str, job: Job, now: float, cache: dict[str, tuple[float, float] | None]
    ) -> tuple[float, float] | None:
        """(work at risk, per allocated unit) of an eligible victim; None if not eligible."""
        if vid in cache:
            return cache[vid]
        v = self.jobs[vid]
        out = None
        if (
            v.state == RUNNING
            and v.request.preemptible
            and v.priority < job.priority
            and v.allocation
        ):
            cost = v.work_at_risk_s(now)
            out = (cost, cost / len(v.allocation))
        cache[vid] = out
        return out

    def _victim_units(self, victim: Job, req: JobRequest, node: str | None = None) -> list[Unit]:
        units = list(victim.allocation.values())
        if req.kind == "mig":
            units = [u for u in units if u.profile == req.profile]
        elif req.kind == VDCU:
            cu, mb = req.compute_units or 0, req.memory_mb or 0
            units = [u for u in units if (u.compute_units or 0) >= cu and u.memory_mb >= mb]
        units = [u for u in units if u.dev.available]
        if node is not None:
            units = [u for u in units if u.node == node]
        return units

    def _greedy_prefix(self, entries: list[Entry], need: int) -> list[Entry] | None:
        """The cheapest-per-unit entries, in order, until they cover ``need``: exactly the
        part of the list the greedy of choose_victims looks at."""
        if sum(e[4] for e in entries) < need:
            return None
        heapq.heapify(entries)
        out = []
        got = 0
        while got < need:
            e = heapq.heappop(entries)
            out.append(e)
            got += e[4]
        return out

    def _choices(
        self, job: Job, prefix: list[Entry], need: int, node: str | None, now: float
    ) -> list[Choice] | None:
        """Candidates (with their unit ids) for the few entries a plan is made of."""
        cands = []
        for _cpu, prio, _neg, vid, _n, shrink in prefix:
            v = self.jobs[vid]
            units = self._victim_units(v, job.request, node)
            cost = v.work_at_risk_s(now)
            if shrink:
                surplus = len(v.allocation) - v.request.min_units
                units = units[-surplus:]
            cands.append(Candidate(vid, tuple(u.rid for u in units), cost, prio, shrink))
        return choose_victims(need, cands)

    def _entries(
        self,
        job: Job,
        vids: Iterable[tuple[str, int]],
        now: float,
        risk: dict[str, tuple[float, float] | None],
        elastic_whole: bool,
    ) -> list[Entry]:
        """(cost per freed unit, priority, -units, victim, units, shrink) per eligible victim.
        Tier 1 (``elastic_whole`` False) lets elastic jobs give only their surplus."""
        out = []
        for vid, n in vids:
            r = self._risk(vid, job, now, risk)
            if r is None or n <= 0:
                continue
            v = self.jobs[vid]
            surplus = len(v.allocation) - v.request.min_units
            if not elastic_whole and v.request.elastic and surplus > 0:
                give = min(n, surplus)
                out.append((r[0] / give, v.priority, -give, vid, give, True))
            else:
                out.append((r[0] / n, v.priority, -n, vid, n, False))
        return out

    def _plan_in_pool(
        self,
        job: Job,
        pool: PoolKey,
        now: float,
        risk: dict[str, tuple[float, float] | None],
        bound: float,
    ) -> Preemption | None:
        req = job.request
        if req.kind == "device" and self._node_local(req, pool):
            p = self.fleet.pools[pool]
            held = Counter(u.node for u in job.holds.values())
            # Branch and bound: a lower bound per node first (every freed unit costs at
            # least its cheapest victim's per-unit work), exact plans in bound order.
            bounds: list[tuple[float, str, int]] = []
            for node in p.nodes:
                nj = self._node_jobs.get(node)
                if not nj:
                    continue
                need = req.min_units - p.free_on(node) - held[node]
                if need <= 0:
                    continue
                low = 0
                cheapest = math.inf  # per unit
                cheapest_job = math.inf  # any plan pays at least one whole victim
                for vid, n in nj.items():
                    r = risk[vid] if vid in risk else self._risk(vid, job, now, risk)
                    if r is not None:
                        low += n
                        if r[1] < cheapest:
                            cheapest = r[1]
                        if r[0] < cheapest_job:
                            cheapest_job = r[0]
                if low >= need:
                    bounds.append((max(cheapest * need, cheapest_job), node, need))
            bounds.sort()
            best: tuple[float, int, str, list[Entry]] | None = None
            for lb, node, need in bounds:
                if best is not None and lb >= best[0]:
                    break
                nj = self._node_jobs[node]
                for tier in (False, True):
                    plan = _cheapest_cover(
                        self._entries(job, nj.items(), now, risk, tier), need, risk
                    )
                    if plan is not None:
                        break
                if plan is None:
                    continue
                if best is None or plan[:2] < best[:2]:
                    best = (plan[0], plan[1], node, plan[2])
                    if best[0] == 0:
                        break
            if best is None:
                return None
            choices = self._choices(
                job, best[3], req.min_units - p.free_on(best[2]) - held[best[2]], best[2], now
            )
            if not choices:
                return None
            return self._preemption(job, pool, best[2], choices, now)
        holds = sum(1 for u in job.holds.values() if u.pool == pool)
        if req.kind == VDCU:
            need = req.min_units - holds - len(self._vdcu_candidates(pool, req))
        else:
            need = req.min_units - holds - self.fleet.free_count(pool, req.kind, req.profile)
        if need <= 0:
            return None
        running = self._running.get(pool, {})
        jobs = self.jobs
        prio = job.priority
        key = (req.kind, req.profile if req.kind == "mig" else None)
        sized = req.kind == VDCU and (req.compute_units or req.memory_mb)
        tier1: list[Entry] = []
        tier2: list[Entry] = []
        single: Entry | None = None  # cheapest lone cover
        single_cost = math.inf
        fmod = math.fmod
        # The hot loop of a preemption decision: thousands of running jobs in a big pool.
        for vid in running:
            v = jobs[vid]
            if v.state != RUNNING or v.priority >= prio or not v.preemptible or v.unit_key != key:
                continue
            n = len(v.allocation)
            useful = len(self._victim_units(v, req)) if sized else n
            if not useful:
                continue
            since = now - v.checkpoint_at_s
            if since < 0:
                since = 0.0
            if v.checkpoint_every_s:
                since = fmod(since, v.checkpoint_every_s)
            cost = since * n
            entry = (cost / useful, v.priority, -useful, vid, useful, False)
            tier2.append(entry)
            if useful >= need and cost < single_cost:
                single, single_cost = entry, cost
            surplus = n - v.request.min_units
            if surplus > 0 and v.request.elastic:
                give = min(useful, surplus)
                tier1.append((cost / give, v.priority, -give, vid, give, True))
            else:
                tier1.append(entry)
        prefix = self._greedy_prefix(tier1, need) or self._greedy_prefix(tier2, need)
        if prefix is not None and single is not None and single[3] not in {e[3] for e in prefix}:
            prefix.append(single)
        if prefix is None:
            return None
        choices = self._choices(job, prefix, need, None, now)
        if not choices:
            return None
        return self._preemption(job, pool, None, choices, now)

    def _preemption(
        self, job: Job, pool: PoolKey, node: str | None, choices: list[Choice], now: float
    ) -> Preemption:
        evictions = tuple(
            Eviction(
                job_id=c.candidate.job_id,
                action="shrink" if c.candidate.shrink else "preempt",
                release=c.release,
                work_at_risk_s=c.candidate.cost,
                priority=c.candidate.priority,
            )
            for c in choices
        )
        return Preemption(job.job_id, pool[0], pool[1], node, evictions)

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
        self._track_running(job, False)
        releasing = set(job.release_on_stop)
        for u in list(job.allocation.values()):
            self.fleet.set_owner(u, None)
            mark, u.earmark = u.earmark, None
            if action in ("shrink", "grow") and u.rid not in releasing:
                self._hold(job, u)  # kept for its own restart
            elif (
                mark is not None
                and beneficiary is not None
                and beneficiary.job_id == mark
                and beneficiary.state in (QUEUED, RESERVED)
            ):
                self._hold(beneficiary, u)
        job.allocation.clear()
        if beneficiary is not None:
            beneficiary.waiting_for.discard(job_id)
        job.stop_for = None
        job.release_on_stop = ()
        job.stop_action = None
        if action == "cancel":
            self._release_holds(job)
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
                self._release_holds(job)
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
            self._track_running(job, False)
            beneficiary = self.jobs.get(job.stop_for or "")
            for u in list(job.allocation.values()):
                self.fleet.set_owner(u, None)
                if (
                    u.earmark
                    and beneficiary is not None
                    and beneficiary.state in (QUEUED, RESERVED)
                ):
                    self._hold(beneficiary, u)
                u.earmark = None
            if beneficiary is not None:
                beneficiary.waiting_for.discard(job_id)
            job.allocation.clear()
        self.queue.remove(job_id)
        self.reservations.pop(job_id, None)
        self._release_holds(job)
        for vid in list(job.waiting_for):
            v = self.jobs.get(vid)
            if v is not None:
                for u in v.allocation.values():
                    if u.earmark == job_id:
                        u.earmark = None
        job.waiting_for.clear()
        job.state = state
        job.ended_at_s = now
        return job

    def report_checkpoint(self, job_id: str, now: float, checkpoint_id: str | None = None) -> None:
        job = self._job(job_id)
        job.checkpoint_at_s = now
        if checkpoint_id is not None:
            job.last_checkpoint_id = checkpoint_id

    def _hold(self, job: Job, unit: Unit) -> None:
        self.fleet.set_holder(unit, job.job_id)
        job.holds[unit.rid] = unit
        job.pool_key = unit.pool

    def _release_holds(self, job: Job) -> None:
        for u in job.holds.values():
            if u.holder == job.job_id:
                self.fleet.set_holder(u, None)
        job.holds.clear()

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
                self._hold(job, u)

    def mark_external(self, rid: str, owner: str) -> None:
        """A resource leased by someone the scheduler does not know: not free, not a victim."""
        u = self.fleet.units.get(rid)
        if u is not None and u.free:
            self.fleet.set_owner(u, EXTERNAL + owner)

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
                placement = self.place(job_id, now)
                if placement is not None:
                    out.append(placement)
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
            self._candidates(job),
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
            added = self._top_up(job)
            if added:
                out.append(HoldChange(job.job_id, tuple(u.rid for u in added)))
        return out

    def _top_up(self, job: Job) -> list[Unit]:
        """Hold free units for a reservation, up to its size, in one pool."""
        req = job.request
        want = req.max_units - len(job.holds)
        if want <= 0:
            return []
        pools = [job.pool_key] if job.pool_key else list(self._candidates(job))
        if not job.pool_key and len(pools) > 1:
            pools.sort(key=lambda p: -self.fleet.free_count(p, req.kind, req.profile))
        for pool in pools:
            if pool is None:
                continue
            if req.kind == VDCU:
                picked = self._vdcu_candidates(pool, req)[:want]
            elif req.kind == "mig":
                picked = self._pick_parts((pool[0], pool[1], req.profile or ""), want, "binpack")
            elif self._node_local(req, pool):
                p = self.fleet.pools[pool]
                node = next(iter(job.holds.values())).node if job.holds else None
                if node is None:
                    node = max(p.node_free, key=lambda n: len(p.node_free[n]), default=None)
                picked = (
                    [self.fleet.units[r] for r in list(p.node_free.get(node, {}))[:want]]
                    if node
                    else []
                )
            else:
                picked = self._pick_whole(
                    pool, min(want, self.fleet.free_count(pool, "device")), "binpack"
                )
            if picked:
                for u in picked:
                    self._hold(job, u)
                return picked
        return []

    def _grow(self, now: float) -> list[Growth]:
        wanted: set[PoolKey] = set()
        for job_id in self.queue:
            wanted.update(self._candidates(self.jobs[job_id]))
        out: list[Growth] = []
        elastic = [
            j
            for key, ids in self._running.items()
            if key not in wanted
            for j in (self.jobs[i] for i in ids)
            if j.state == RUNNING and j.request.elastic and len(j.allocation) < j.request.max_units
        ]
        for job in sorted(elastic, key=lambda j: (-j.priority, j.seq)):
            assert job.pool_key is not None
            req = job.request
            want = req.max_units - len(job.allocation)
            if req.kind == VDCU:
                picked = self._vdcu_candidates(job.pool_key, req)[:want]
            elif req.kind == "mig":
                picked = self._pick_parts((*job.pool_key, req.profile or ""), want, "binpack")
            else:
                free = self.fleet.free_count(job.pool_key, "device")
                picked = self._pick_whole(job.pool_key, min(want, free), "binpack")
            if not picked:
                continue
            for u in picked:
                self._hold(job, u)
            job.state = STOPPING
            job.stop_action = "grow"
            job.stop_for = None
            job.release_on_stop = ()
            out.append(Growth(job.job_id, tuple(u.rid for u in picked)))
        return out

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
