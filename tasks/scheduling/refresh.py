"""The service's engine, kept up to date from the inventory (part of SchedulerService).

The first refresh reads the whole inventory (one snapshot) and restores every job into a
new engine. Later ones keep that engine and apply only what the inventory's change
journal (hardware/inventory/journal.py) names since: those jobs' rows and those leases
are read again, plus the leases whose expiry as last read has passed (renewals are not
journaled), and every job they touch is forgotten by the engine and restored anew, by the
same rules as a rebuild. A change to the fleet (a node, device, partition or cordon), or
a journal pruned past this service, means a rebuild. tests/tasks/scheduling checks that
the kept engine is always the one a rebuild makes (test_incremental_refresh.py and the
lifecycle state machine).

At 10,000 GPUs a rebuild reads ~10^4 rows and makes ~10^5 objects (about 2 s on a
2-core VM); a pass with a handful of changes reads tens of rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import (
    ACTIVE_STATES,
    InventorySnapshot,
    JobRecord,
    JobState,
    Lease,
)
from gpuflow.tasks.scheduling.engine import Engine, Job
from gpuflow.tasks.scheduling.model import QUEUED, RUNNING, STOPPING, JobRequest
from gpuflow.tasks.scheduling.service_state import (
    STOPPED_STATES,
    ServiceState,
    invalid_message,
    is_scheduled,
)
from gpuflow.tasks.scheduling.state import EXTERNAL

log = logging.getLogger(__name__)

PRUNE_EVERY_PASSES = 100  # journal housekeeping: one delete every so many refreshes
JOURNAL_KEEP = 200_000  # journal rows kept: a service that fell further behind rebuilds


class RefreshMixin(ServiceState):
    def refresh(self) -> Engine:
        """The engine as of now: the last one with what changed since applied, or rebuilt
        from the whole inventory on the first refresh, when the fleet changed, or when the
        change journal cannot say what changed."""
        changes = self._feed.poll() if self._built else None
        if changes is None or changes.fleet:
            return self._rebuild()
        self._apply_changes(changes.jobs, changes.leases)
        self._passes_since_prune += 1
        if self._passes_since_prune >= PRUNE_EVERY_PASSES:
            self._passes_since_prune = 0
            self.inventory.prune_journal(JOURNAL_KEEP)
        return self.engine

    def _rebuild(self) -> Engine:
        """The engine from the whole inventory: one snapshot read, everything restored."""
        now = self._now()
        self.rebuilds += 1
        self._dirty = set()
        self._reap_all, self._to_reap = True, set()
        self._feed.start()  # before the read: what changes during it is applied next time
        snap = self.inventory.snapshot()
        engine = Engine(self.config)
        _add_fleet(engine, snap)
        self._records = {r.job_id: r for r in snap.jobs if is_scheduled(r)}
        self._cache.reset(snap.leases)
        self._lease_of, self._owned, self._stale_of = {}, {}, {}
        self._index_leases(set(self._cache.by_owner))
        self._invalid = {}
        live = self._validate(self._records.values())
        # Validated once per request, across passes: the stored request is compared, not
        # validated again (pydantic for every live job, every pass, adds up at 10,000 GPUs).
        self._requests = {k: v for k, v in self._requests.items() if k in live}
        self.engine = engine
        self._restore(engine, live, now)
        self._mark_external(engine, self._lease_of)
        self._built = True
        return engine

    def _apply_changes(self, job_ids: frozenset[str], lease_ids: frozenset[str]) -> None:
        """Bring the engine up to date with what the journal named: re-read those jobs,
        those leases and the leases whose expiry as last read has passed, then restore
        every job they touch anew (and look at them in the next reap)."""
        now = self._now()
        engine, cache = self.engine, self._cache
        due = cache.expired(now)
        asked = set(lease_ids) | due
        fresh = {x.resource_id: x for x in self.inventory.leases_on(asked)} if asked else {}
        # Renewed by its holder: the same lease with a later expiry, nothing to restore.
        renewed = set()
        for rid in due - lease_ids:
            old = cache.get(rid)
            if rid in fresh and old is not None and _same_hold(old, fresh[rid]):
                renewed.add(rid)
                cache.put(fresh[rid])
        rids = asked - renewed
        owners = {x.owner for x in map(cache.get, rids) if x is not None}
        owners |= {fresh[r].owner for r in rids if r in fresh}
        touched = (set(job_ids) | owners | self._dirty) - {""}
        self._dirty = set()
        self._to_reap |= touched
        read = self.inventory.jobs_by_id(touched) if touched else {}
        # Out of the lease indexes: every lease named, every lease of a job touched.
        gone = set(rids)
        for owner in touched:
            gone |= cache.owned_by(owner) | self._owned.pop(owner, set())
        for rid in gone:
            self._lease_of.pop(rid, None)
            self._stale_of.pop(rid, None)
        for rid in rids:
            old = cache.pop(rid)
            if old is not None:
                self._owned.get(old.owner, set()).discard(rid)
            if rid in fresh:
                cache.put(fresh[rid])
        for job_id in touched:
            record = read.get(job_id)
            if record is not None and is_scheduled(record):
                self._records[job_id] = record
            else:
                self._records.pop(job_id, None)
            self._invalid.pop(job_id, None)
        # Leases named by the journal lose their external mark; re-marked below if so.
        for rid in rids:
            unit = engine.fleet.units.get(rid)
            if unit is not None and unit.owner is not None and unit.owner.startswith(EXTERNAL):
                engine.fleet.set_owner(unit, None)
        for job_id in touched:
            engine.forget(job_id)
        self._index_leases(touched)
        live = self._validate(self._records[j] for j in touched if j in self._records)
        for job_id in touched - set(live):
            self._requests.pop(job_id, None)
        self._restore(engine, live, now, relink=touched)
        marks = set(rids) | {r for o in touched for r in self._owned.get(o, ())}
        self._mark_external(engine, {r: self._lease_of[r] for r in marks if r in self._lease_of})

    def _index_leases(self, owners: Iterable[str]) -> None:
        """Sort the cached leases of ``owners`` into their job's current attempt's
        (``_lease_of``, ``_owned``) and older attempts' (``_stale_of``: fenced in the reap)."""
        for owner in owners:
            record = self._records.get(owner)
            for rid in self._cache.owned_by(owner):
                lease = self._cache.by_rid[rid]
                if record is not None and lease.attempt != record.attempt:
                    self._stale_of[rid] = lease
                else:
                    self._lease_of[rid] = lease
                    self._owned.setdefault(owner, set()).add(rid)
        self._stale = sorted(self._stale_of.values(), key=lambda x: x.resource_id)

    def _validate(self, records: Iterable[JobRecord]) -> dict[str, JobRequest]:
        """The valid requests of the live ones among ``records`` (those that no longer
        validate are noted in ``_invalid``, to be quarantined by the reap)."""
        requests: dict[str, JobRequest] = {}
        for r in records:
            if not _is_live(r):
                continue
            try:
                requests[r.job_id] = self._validated(r)
            except (ValueError, KeyError, TypeError) as exc:  # pydantic's ValidationError too
                self._invalid[r.job_id] = invalid_message(exc)
        return requests

    def _restore(
        self,
        engine: Engine,
        requests: dict[str, JobRequest],
        now: float,
        relink: set[str] | None = None,
    ) -> None:
        """Restore the jobs of ``requests`` into the engine (which does not have them):
        running ones first (their leases are facts), then queued ones and what they hold,
        then the links of stopping victims to whom they stop for. ``relink``: jobs restored
        anew whose unchanged victims must be linked to them again."""
        records = sorted(
            (self._records[j] for j in requests), key=lambda r: self._sched(r).get("seq", 0)
        )
        for r in records:
            if r.state == JobState.QUEUED:
                continue
            s = self._sched(r)
            owned = self._owned.get(r.job_id, set())
            units = [rid for rid in r.resource_ids if rid in owned]
            units += sorted(owned - set(units))
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
        for r in records:
            if r.state != JobState.QUEUED:
                continue
            s = self._sched(r)
            engine_job = self._restore_queued(engine, requests[r.job_id], s, now)
            engine_job.preemptions = int(s.get("preemptions", 0))
            engine_job.last_checkpoint_id = r.last_checkpoint_id
            engine.restore_holds(engine_job.job_id, sorted(self._owned.get(r.job_id, set())))
        # Stopping victims: link them to whom they stop for (earmarks and waiting_for).
        for r in records:
            s = self._sched(r)
            job = engine.jobs.get(r.job_id)
            if job is None or s.get("phase") != "stopping" or job.state != RUNNING:
                continue
            job.state = STOPPING
            job.stop_action = s.get("stop_action") or "preempt"
            job.stop_for = s.get("stop_for")
            job.release_on_stop = tuple(s.get("release") or job.allocation)
            _link_victim(engine, job)
        if relink:
            for job in engine.jobs.values():
                if job.state == STOPPING and job.stop_for in relink and job.job_id not in requests:
                    _link_victim(engine, job)

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

    def _mark_external(self, engine: Engine, leases: dict[str, Lease]) -> None:
        """Units leased by someone the scheduler does not know: taken, and no victim. A
        finished scheduled job's lease is not external: the reap gives it back."""
        for rid, lease in leases.items():
            if lease.owner not in engine.jobs and lease.owner not in self._records:
                engine.mark_external(rid, lease.owner)


def _is_live(record: JobRecord) -> bool:
    """Queued, on a device, or stopped and waiting to be re-queued: the engine has it."""
    return (
        record.state == JobState.QUEUED
        or record.state in ACTIVE_STATES
        or record.state in STOPPED_STATES
    )


def _add_fleet(engine: Engine, snap: InventorySnapshot) -> None:
    """Nodes, devices, partitions and cordons of a snapshot into the engine's index."""
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


def _same_hold(a: Lease, b: Lease) -> bool:
    """One lease, maybe renewed: same holder, attempt and fencing token."""
    return (a.owner, a.attempt, a.token) == (b.owner, b.attempt, b.token)


def _link_victim(engine: Engine, job: Job) -> None:
    """A stopping victim's units are earmarked for whom it stops for, who waits for it."""
    beneficiary = engine.jobs.get(job.stop_for or "")
    if beneficiary is None:
        return
    for rid in job.release_on_stop:
        unit = job.allocation.get(rid)
        if unit is not None:
            unit.earmark = beneficiary.job_id
    beneficiary.waiting_for.add(job.job_id)
