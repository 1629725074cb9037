"""The engine's live state: one record per job, and who runs where.

A ``Job`` is the engine's mutable record of one request's lifecycle (model.py holds the
frozen requests and decisions). ``RunningIndex`` keeps the running jobs per pool, their
preemptible units per priority and their whole devices per node, so a preemption decision
looks only where eviction can help. ``EngineState`` is what the engine's components
(admission, placement, repartitioning, preemption) read; the Engine is one.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from gpuflow.tasks.scheduling.fleet_index import FleetIndex, PoolKey, Unit
from gpuflow.tasks.scheduling.model import JobRequest, SchedulerConfig

EXTERNAL = "external:"  # owner prefix of leases the scheduler did not make


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


class RunningIndex:
    """Running jobs per pool; their preemptible units per priority (a pool where nobody
    lower holds enough is skipped without a look); whole-device units per node and job
    (node-local gang preemption)."""

    def __init__(self) -> None:
        self.by_pool: dict[PoolKey, dict[str, None]] = {}
        self.units: dict[PoolKey, Counter[int]] = {}  # preemptible units by priority
        self.node_jobs: dict[str, Counter[str]] = {}

    def add(self, job: Job) -> None:
        key = job.pool_key
        if key is None:
            return
        self.by_pool.setdefault(key, {})[job.job_id] = None
        units = self.units.setdefault(key, Counter())
        if job.request.preemptible:
            units[job.priority] += len(job.allocation)
        for u in job.allocation.values():
            if u.kind == "device":
                self.node_jobs.setdefault(u.node, Counter())[job.job_id] += 1

    def remove(self, job: Job) -> None:
        key = job.pool_key
        if key is None:
            return
        running = self.by_pool.setdefault(key, {})
        units = self.units.setdefault(key, Counter())
        if job.job_id in running:
            del running[job.job_id]
            if job.request.preemptible:
                units[job.priority] -= len(job.allocation)
                if units[job.priority] <= 0:
                    del units[job.priority]
        for u in job.allocation.values():
            if u.kind == "device":
                c = self.node_jobs.get(u.node)
                if c is not None:
                    c[job.job_id] -= 1
                    if c[job.job_id] <= 0:
                        del c[job.job_id]


class EngineState(Protocol):
    """What the engine's components read and change (the Engine is one)."""

    config: SchedulerConfig
    fleet: FleetIndex
    jobs: dict[str, Job]
    running: RunningIndex


def hold(fleet: FleetIndex, job: Job, unit: Unit) -> None:
    """Hold ``unit`` for the job's start to come (a reservation, a preemptor, a restart)."""
    fleet.set_holder(unit, job.job_id)
    job.holds[unit.rid] = unit
    job.pool_key = unit.pool


def release_holds(fleet: FleetIndex, job: Job) -> None:
    for u in job.holds.values():
        if u.holder == job.job_id:
            fleet.set_holder(u, None)
    job.holds.clear()
