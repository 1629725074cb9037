"""Trace-driven simulation: the real engine, a simulated clock, a synthetic fleet.

Events are arrivals, completions and stops; after the events of an instant the engine
runs a pass (at most one per ``tick_s`` of simulated time, as a deployment on an interval
would). Decisions are carried out as the service would, without a database: placements
start at once, repartitioning happens in place (``reconfig_s`` later the job may start),
victims stop ``ack_s`` after being asked (the checkpoint) and resume later paying
``restart_s``. Checkpoint-and-stop loses no steps, so a preempted job's remaining work is
what it had left.

A job's speed is its units x the SKU's speed relative to the reference (trace.speed); a
partition runs at its share of the device (compute slices / 7, CUs / the DCU's CUs).
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuflow.hardware.skus import MIG_COMPUTE_SLICES, SKUS
from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.fleet_index import Unit
from gpuflow.tasks.scheduling.model import (
    STOPPING,
    Activation,
    Growth,
    HoldChange,
    JobRequest,
    Placement,
    Preemption,
    SchedulerConfig,
    SubmissionRefused,
)
from gpuflow.tasks.scheduling.trace import NodeGroup, TraceJob, speed

ARRIVE, FINISH, STOPPED = 0, 1, 2


def build_engine(groups: tuple[NodeGroup, ...], config: SchedulerConfig) -> Engine:
    engine = Engine(config)
    fleet = engine.fleet
    counter = 0
    for g in groups:
        short = g.sku.split()[-1].split("-")[0].lower()
        for n in range(g.nodes):
            name = f"{g.region}-{short}-{n:04d}"
            if name in fleet.nodes:
                name = f"{name}-{g.sku.replace(' ', '')}"
            fleet.add_node(name, g.region)
            spec = SKUS[g.sku]
            kinds = ("mig",) if spec.supports_mig else ("vdcu",) if spec.supports_vdcu else ()
            for i in range(g.per_node):
                counter += 1
                fleet.add_device(
                    name, i, f"D{counter:06d}", g.sku, spec.vendor, spec.memory_total_mb, kinds
                )
    return engine


def to_request(j: TraceJob) -> JobRequest:
    return JobRequest(
        job_id=j.job_id,
        count=j.count,
        max_count=j.max_count,
        profile=j.profile,
        compute_units=j.compute_units,
        memory_mb=j.memory_mb,
        skus=j.skus,
        region=j.region,
        allow_spill=j.allow_spill,
        priority=j.priority,
    )


def unit_share(u: Unit) -> float:
    """How much of a device the unit is (1 for a whole device)."""
    if u.kind == "device":
        return 1.0
    if u.kind == "mig":
        return (u.compute_units or 1) / MIG_COMPUTE_SLICES
    total = u.dev.spec.compute_units if u.dev.spec else 0
    return (u.compute_units or 0) / total if total else 0.25


@dataclass
class _Run:
    job: TraceJob
    remaining: float  # reference-GPU-seconds of work left at `count` units
    rate: float = 0.0  # work per second while running
    started_at: float | None = None
    first_start: float | None = None
    finished_at: float | None = None
    version: int = 0  # invalidates a scheduled FINISH when the job stops
    restarts: int = 0


@dataclass
class SimResult:
    policy: str
    preemption: bool
    jobs: int
    started: int
    completed: int
    utilization: float
    queue_delay_p50_s: float
    queue_delay_p99_s: float
    jct_p50_s: float
    jct_p99_s: float
    jct_high_p50_s: float
    jct_high_p99_s: float
    queue_delay_high_p99_s: float
    fragmentation: float
    preemptions: int
    restart_gpu_h: float
    repartitions: int
    place_p50_ms: float
    place_p99_ms: float
    preempt_p50_ms: float
    preempt_p99_ms: float
    decisions: int
    wall_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k != "extra"}
        out.update(self.extra)
        return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


class Simulator:
    def __init__(
        self,
        groups: tuple[NodeGroup, ...],
        trace: list[TraceJob],
        config: SchedulerConfig,
        *,
        tick_s: float = 30.0,
        ack_s: float = 30.0,
        restart_s: float = 120.0,
        reconfig_s: float = 10.0,
        warmup_s: float = 0.0,
        horizon_s: float | None = None,
        timing: bool = True,
    ) -> None:
        self.engine = build_engine(groups, config)
        self.config = config
        self.trace = trace
        self.runs = {j.job_id: _Run(j, j.work_s) for j in trace}
        self.tick_s, self.ack_s, self.restart_s, self.reconfig_s = (
            tick_s,
            ack_s,
            restart_s,
            reconfig_s,
        )
        self.warmup_s = warmup_s
        self.horizon_s = (
            horizon_s if horizon_s is not None else (trace[-1].arrival_s if trace else 0.0)
        )
        self.timing = timing
        self.events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self.total_gpus = sum(g.nodes * g.per_node for g in groups)
        self.busy = 0.0  # device-equivalents in use now
        self.busy_integral = 0.0
        self.frag_integral = 0.0
        self.frag_time = 0.0
        self.last_t = 0.0
        self.place_ms: list[float] = []
        self.preempt_ms: list[float] = []
        self.preemptions = 0
        self.restart_gpu_s = 0.0
        self.repartitions = 0
        self.refused: set[str] = set()
        self._hook_engine()

    def _hook_engine(self) -> None:
        """Time the engine's own decisions (placement, preemption) inside passes."""
        engine = self.engine
        place, preempt = engine.place, engine.preempt

        def timed_place(job_id: str, now: float) -> Placement | None:
            t0 = time.perf_counter()
            out = place(job_id, now)
            self.place_ms.append((time.perf_counter() - t0) * 1000)
            return out

        def timed_preempt(job_id: str, now: float) -> Preemption | None:
            t0 = time.perf_counter()
            out = preempt(job_id, now)
            if out is not None:
                self.preempt_ms.append((time.perf_counter() - t0) * 1000)
            return out

        if self.timing:
            engine.place = timed_place  # type: ignore[method-assign]
            engine.preempt = timed_preempt  # type: ignore[method-assign]

    def _push(self, t: float, kind: int, job_id: str, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, kind, self._seq, job_id, version))

    def _advance(self, t: float) -> None:
        lo = max(self.last_t, self.warmup_s)
        hi = min(t, self.horizon_s)
        if hi > lo:
            self.busy_integral += self.busy * (hi - lo)
            frag = self._fragmentation()
            self.frag_integral += frag * (hi - lo)
            self.frag_time += hi - lo
        self.last_t = t

    def _fragmentation(self) -> float:
        """Share of free whole devices on partly used nodes: free, yet no use to a
        whole-node gang (the stranding binpack avoids)."""
        free = partial = 0
        for pool in self.engine.fleet.pools.values():
            size = pool.max_per_node
            for k, nodes in pool.buckets.items():
                n = len(nodes)
                free += k * n
                if k < size:
                    partial += k * n
        return partial / free if free else 0.0

    def _rate(self, units: list[Unit], run: _Run) -> float:
        share = sum(unit_share(u) for u in units)
        return share * speed(units[0].dev.sku) / max(1, run.job.count) if units else 0.0

    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        started = time.perf_counter()
        # The fleet lives as long as the scheduler: keep it out of the cyclic GC's passes
        # (as a long-running scheduler process would), so decision timings are decisions.
        gc.collect()
        gc.freeze()
        try:
            return self._run(progress, started)
        finally:
            gc.unfreeze()

    def _run(self, progress: Callable[[float], None] | None, started: float) -> SimResult:
        engine = self.engine
        for j in self.trace:
            self._push(j.arrival_s, ARRIVE, j.job_id)
        next_tick = 0.0
        dirty = False
        last_report = 0.0
        while self.events:
            t = self.events[0][0]
            if t > self.horizon_s * 1.5 + 86400:
                break  # the tail: jobs still running long after the last arrival
            if dirty and next_tick <= t:
                self._advance(next_tick)
                again = self._pass(next_tick)
                dirty = again
                next_tick += max(self.tick_s, self.reconfig_s) if again else self.tick_s
                continue
            t, kind, _, job_id, version = heapq.heappop(self.events)
            self._advance(t)
            run = self.runs[job_id]
            if kind == ARRIVE:
                try:
                    engine.submit(
                        to_request(run.job),
                        t,
                        enforce_depth=False,
                        checkpoint_every_s=run.job.checkpoint_every_s,
                    )
                except SubmissionRefused:
                    self.refused.add(job_id)  # bigger than any pool of this fleet
                    continue
                dirty = True
            elif kind == FINISH and version == run.version:
                job = engine.jobs[job_id]
                self.busy -= sum(unit_share(u) for u in job.allocation.values())
                run.finished_at = t
                run.remaining = 0.0
                engine.finish(job_id, t)
                dirty = True
            elif kind == STOPPED and version == run.version:
                self._stopped(job_id, t)
                dirty = True
            if dirty and next_tick < t:
                next_tick = t
            if progress and t - last_report > 3600:
                last_report = t
                progress(t)
        self._advance(min(self.last_t, self.horizon_s))
        return self._result(time.perf_counter() - started)

    def _pass(self, now: float) -> bool:
        """One engine pass, carried out; True when a job waits for a repartition (it
        holds the new partitions and starts in a pass ``reconfig_s`` later)."""
        engine = self.engine
        again = False
        for d in engine.schedule(now):
            if isinstance(d, Placement):
                if d.repartition:
                    self._repartition(d, now)
                    again = True
                else:
                    self._start(d.job_id, now)
            elif isinstance(d, Preemption):
                self.preemptions += len(d.evictions)
                for e in d.evictions:
                    self._ask_stop(e.job_id, now)
            elif isinstance(d, Growth):
                self._ask_stop(d.job_id, now)
            elif isinstance(d, HoldChange | Activation):
                pass
        return again

    def _repartition(self, d: Placement, now: float) -> None:
        engine = self.engine
        for step in d.repartition:
            created = []
            for k, r in enumerate(step.create):
                rid = f"{step.device_uuid}/{self.repartitions}.{k}"
                if r.profile == "vdcu":
                    created.append((rid, r, r.memory_mb or 0, r.compute_units))
                else:
                    spec = engine.fleet.devices[step.device_uuid].spec
                    assert spec is not None
                    created.append((rid, r, spec.mig_profile(r.profile).memory_mb, None))
            engine.apply_repartition(step, created)
            self.repartitions += 1

    def _start(self, job_id: str, now: float) -> None:
        job = self.engine.jobs[job_id]
        run = self.runs[job_id]
        units = list(job.allocation.values())
        run.rate = self._rate(units, run)
        run.started_at = now
        if run.first_start is None:
            run.first_start = now
        self.busy += sum(unit_share(u) for u in units)
        run.version += 1
        self._push(now + run.remaining / run.rate, FINISH, job_id, run.version)

    def _ask_stop(self, job_id: str, now: float) -> None:
        run = self.runs[job_id]
        job = self.engine.jobs[job_id]
        if job.state != STOPPING or run.started_at is None:
            return
        # Work continues until the checkpoint is taken; then the job is off the devices.
        done = (now + self.ack_s - run.started_at) * run.rate
        if done >= run.remaining:
            return  # it finishes before it could stop: let the FINISH event happen
        run.version += 1
        self._push(now + self.ack_s, STOPPED, job_id, run.version)

    def _stopped(self, job_id: str, now: float) -> None:
        run = self.runs[job_id]
        job = self.engine.jobs[job_id]
        assert run.started_at is not None
        run.remaining -= (now - run.started_at) * run.rate
        self.busy -= sum(unit_share(u) for u in job.allocation.values())
        units = len(job.allocation)
        # The restart repeats start-up and reload: charged as extra work on resume.
        run.remaining += self.restart_s * run.rate
        self.restart_gpu_s += self.restart_s * units
        run.restarts += 1
        run.started_at = None
        self.engine.stopped(job_id, now)

    def _delays(self) -> list[tuple[float, _Run]]:
        """Queueing delay of every job arrived after the warm-up (the wait so far for
        those still waiting at the horizon)."""
        out = []
        for r in self.runs.values():
            if r.job.arrival_s < self.warmup_s or r.job.arrival_s >= self.horizon_s:
                continue
            if r.job.job_id in self.refused:
                continue
            start = r.first_start if r.first_start is not None else self.horizon_s
            out.append((start - r.job.arrival_s, r))
        return out

    def _result(self, wall_s: float) -> SimResult:
        runs = [r for r in self.runs.values() if r.job.job_id not in self.refused]
        delays = [
            r.first_start - r.job.arrival_s
            for r in runs
            if r.first_start is not None and r.job.arrival_s >= self.warmup_s
        ]
        waiting = [  # still waiting at the horizon: the wait so far (a lower bound)
            self.horizon_s - r.job.arrival_s
            for r in runs
            if r.first_start is None and self.warmup_s <= r.job.arrival_s < self.horizon_s
        ]
        jct = [
            r.finished_at - r.job.arrival_s
            for r in runs
            if r.finished_at is not None and r.job.arrival_s >= self.warmup_s
        ]
        high = [r for r in runs if r.job.priority > 0 and r.job.arrival_s >= self.warmup_s]
        jct_high = [r.finished_at - r.job.arrival_s for r in high if r.finished_at is not None]
        delay_high = [r.first_start - r.job.arrival_s for r in high if r.first_start is not None]
        window = max(1e-9, self.horizon_s - self.warmup_s)
        return SimResult(
            policy=self.config.policy,
            preemption=self.config.preemption,
            jobs=len(self.runs),
            started=sum(1 for r in runs if r.first_start is not None),
            completed=sum(1 for r in runs if r.finished_at is not None),
            utilization=self.busy_integral / (self.total_gpus * window),
            # Jobs still waiting at the horizon count with the wait so far (a lower bound).
            queue_delay_p50_s=percentile(delays + waiting, 50),
            queue_delay_p99_s=percentile(delays + waiting, 99),
            jct_p50_s=percentile(jct, 50),
            jct_p99_s=percentile(jct, 99),
            jct_high_p50_s=percentile(jct_high, 50),
            jct_high_p99_s=percentile(jct_high, 99),
            queue_delay_high_p99_s=percentile(delay_high, 99),
            fragmentation=self.frag_integral / self.frag_time if self.frag_time else 0.0,
            preemptions=self.preemptions,
            restart_gpu_h=self.restart_gpu_s / 3600.0,
            repartitions=self.repartitions,
            place_p50_ms=percentile(self.place_ms, 50),
            place_p99_ms=percentile(self.place_ms, 99),
            preempt_p50_ms=percentile(self.preempt_ms, 50),
            preempt_p99_ms=percentile(self.preempt_ms, 99),
            decisions=len(self.place_ms) + len(self.preempt_ms),
            wall_s=wall_s,
            extra={
                "refused": len(self.refused),
                "still_waiting": len(waiting),
                # Big gangs suffer most from fragmentation; low priority from preemption.
                "queue_delay_gang8_p99_s": percentile(
                    [d for d, r in self._delays() if (r.job.max_count or r.job.count) >= 8], 99
                ),
                "queue_delay_low_p99_s": percentile(
                    [d for d, r in self._delays() if r.job.priority == 0], 99
                ),
                "jct_mean_s": sum(jct) / len(jct) if jct else float("nan"),
            },
        )


def simulate(
    groups: tuple[NodeGroup, ...],
    trace: list[TraceJob],
    config: SchedulerConfig,
    progress: Callable[[float], None] | None = None,
    **kwargs: Any,
) -> SimResult:
    return Simulator(groups, trace, config, **kwargs).run(progress)


__all__ = ["SimResult", "Simulator", "build_engine", "simulate", "to_request"]
