"""`gpuflow bench scheduler`, section (c): the scheduler's full service pass, end to end.

What is timed is one ``SchedulerService.schedule_once``, the call the `schedule`
deployment makes every 60 s: take the fleet-wide pass lock; bring the service's engine up
to date with the inventory (refresh.py: what the change journal names since the last
pass); reap (apply what ended, stopped or lapsed since then); decide (placement over the
whole queue, reservations, growth); write the decisions (the placements' leases in one
transaction, their job rows moved to placed by compare-and-swap in another); renew the
holds the service keeps for waiting jobs; release the lock. p50/p99 are over ``passes``
such passes, with time.perf_counter, and split into read (``refresh``), decide (the engine
alone) and write (the rest: lock, reap, leases, job rows, renewals).

The fleet is the study's 10,000 GPUs (tasks/scheduling/trace.py: five SKUs, NVIDIA and
Hygon, two regions), recorded in the inventory by an ordinary ``Inventory.sync`` from a
discovery-only backend (StudyFleetBackend). Jobs of the synthetic trace asking for 95 %
of its GPUs are recorded in the service's job format and placed by one untimed pass (at
full scale 2,674 fit, leasing 84 % of the GPUs); those that did not fit stay queued, and
``SchedulerService.submit`` tops the queue up to 1,000; untimed passes then place those
of them that fit at once and carry out the preemptions they make, until no victim is
stopping (``settle_ms``, ``settle_passes``, ``settle_placed``: a burst, reported apart
from the steady state). Jobs are those of the trace that
take whole devices: a MIG or vDCU request would first cut a device, which is the
backend's work, not the pass's.

Between two passes (untimed) the bench plays the rest of the cluster, so that no pass is
a no-op over a steady state: ``churn`` running jobs finish (``job_done``, as their runners
report), ``churn`` new ones are submitted, and the runners' lease keepers renew the
units of their attempts. The pass after that reaps the finished jobs and places what now
fits. Time is a clock the bench advances by the `schedule` deployment's interval (60 s)
per pass, so the passes do the work a real interval brings: the leases the service keeps
(holds) are renewed once a third of their 300 s TTL has gone, the runners' keepers renew
theirs every 100 s of it (so no lease lapses by accident), and the victims of a
preemption acknowledge their stop before the next pass, as their loops do at their next
step (the pass after the 30 s ack grace re-queues them).

The service keeps its engine between passes and reads only what the inventory's change
journal names (tasks/scheduling/refresh.py); ``rebuilds_in_timed_passes`` counts the
passes that read everything again (none, unless the fleet changed).

Stores: SQLite always, a file in a temporary directory (WAL, as production opens it).
PostgreSQL when the environment variable GPUFLOW_BENCH_POSTGRES_URL holds a SQLAlchemy
URL (``postgresql+psycopg://user@host/db``) of an empty throwaway database: the bench
refuses one that already has gpuflow tables, and drops the tables it made when done.
Without it the result says "postgres: not measured (set GPUFLOW_BENCH_POSTGRES_URL)".
Goal (issue 11): p99 <= 100 ms per pass on SQLite.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    InvalidRequestError,
    NodeInfo,
    Partition,
    PartitionProfile,
    UnsupportedError,
)
from gpuflow.hardware.inventory import Inventory, schema
from gpuflow.hardware.skus import SKUS
from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.model import RUNNING, STOPPING, SchedulerConfig, SubmissionRefused
from gpuflow.tasks.scheduling.service import SPEC_KIND, PassReport, SchedulerService
from gpuflow.tasks.scheduling.simulate import percentile, to_request
from gpuflow.tasks.scheduling.trace import NodeGroup, TraceJob, fleet_gpus, study_fleet
from gpuflow.tasks.scheduling.trace import synthetic_trace as make_trace

Report = Callable[[str], None]
POSTGRES_URL_ENV = "GPUFLOW_BENCH_POSTGRES_URL"
NOT_MEASURED = f"postgres: not measured (set {POSTGRES_URL_ENV})"
PASS_GOAL_MS = 100.0
FILL_SHARE = 0.95  # of the fleet's GPUs asked for by running jobs
STEP_S = 60.0  # bench clock per pass: the `schedule` deployment's interval (prefect.yaml)
START_S = 1_000_000.0
PASSES = 60  # timed passes of the full run
CHURN = 3  # jobs finishing and arriving before each (each arrival is a service submit)
SETTLE_MAX_PASSES = 10  # untimed passes after the top-up, until no victim is stopping


def _discovery_only(*_args: object, **_kwargs: object) -> NoReturn:
    raise UnsupportedError("the bench's fleet answers discovery only")


class StudyFleetBackend(Backend):
    """The study fleet (``groups``) as a backend that answers discovery and nothing else:
    what ``Inventory.sync`` needs to record 10,000 devices without a twin behind them."""

    name = "bench-fleet"

    def __init__(self, groups: Sequence[NodeGroup]) -> None:
        nodes: dict[str, NodeInfo] = {}
        serial = 0
        for g in groups:
            spec = SKUS[g.sku]
            kinds: tuple[Any, ...] = (
                ("mig",) if spec.supports_mig else ("vdcu",) if spec.supports_vdcu else ()
            )
            slug = re.sub(r"[^a-z0-9]+", "-", g.sku.lower()).strip("-")
            for n in range(g.nodes):
                name = f"{g.region}-{slug}-{n:04d}"
                devices = []
                for i in range(g.per_node):
                    serial += 1
                    devices.append(
                        DeviceInfo(
                            node=name,
                            index=i,
                            vendor=spec.vendor,
                            sku=spec.name,
                            uuid=f"GPU-bench-{serial:06d}",
                            memory_total_mb=spec.memory_total_mb,
                            pci_device_id=spec.pci_device_id,
                            partition_kinds=kinds,
                        )
                    )
                nodes[name] = NodeInfo(name, g.region, "active", tuple(devices))
        self._nodes = list(nodes.values())

    def discover(self) -> list[NodeInfo]:
        return list(self._nodes)

    def partitions(self, node: str, index: int) -> list[Partition]:
        return []

    def partition_profiles(self, node: str, index: int) -> list[PartitionProfile]:
        return []

    def partition_mode(self, node: str, index: int) -> bool:
        return False

    telemetry = set_partition_mode = create_partitions = destroy_partitions = _discovery_only
    clocks = set_locked_clocks = reset_locked_clocks = set_applications_clocks = _discovery_only
    power_limits = set_power_limit_mw = _discovery_only


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class _TimedService(SchedulerService):
    """A SchedulerService that adds up the time its passes spend in ``refresh``."""

    refresh_s = 0.0

    def refresh(self) -> Engine:
        t0 = time.perf_counter()
        try:
            return super().refresh()
        finally:
            self.refresh_s += time.perf_counter() - t0


def _whole_device_jobs(seed: int, gpus: int) -> list[TraceJob]:
    trace = make_trace(96, gpus, load=1.0, seed=seed)
    return [j for j in trace if j.profile is None and j.compute_units is None and not j.memory_mb]


def _check_empty(url: str) -> None:
    """Refuse (InvalidRequestError, naming them) a database that already has gpuflow
    tables: the bench drops the tables it made afterwards."""
    engine = create_engine(url)
    try:
        found = sorted(t for t in inspect(engine).get_table_names() if t in schema.metadata.tables)
    finally:
        engine.dispose()
    if found:
        shown = make_url(url).render_as_string(hide_password=True)
        raise InvalidRequestError(
            f"{POSTGRES_URL_ENV}={shown} must name an empty throwaway database; it already has "
            f"gpuflow tables ({', '.join(found)}). The bench writes a whole fleet there and "
            "drops its tables afterwards: point it at a database of its own."
        )


def _drop_tables(url: str) -> None:
    engine = create_engine(url)
    try:
        schema.metadata.drop_all(engine)
    finally:
        engine.dispose()


def _running(engine: Engine) -> list[str]:
    return sorted(j.job_id for j in engine.live_jobs() if j.state == RUNNING)


def _keep_runners(inv: Inventory, ttl_s: float) -> None:
    """What every runner's LeaseKeeper does on its timer: renew every unit of its attempt
    (tasks/training/binding.attempt_resources)."""
    renewals = {
        (r.job_id, r.attempt): list(r.resource_ids)
        for r in inv.jobs()
        if r.resource_ids and r.state in ("placed", "launching", "running")
    }
    if renewals:
        inv.renew_leases_of(renewals, ttl_s)


def _answer_stops(inv: Inventory, engine: Engine) -> None:
    """What the loops of the jobs asked to stop do at their next step: checkpoint and
    acknowledge (the pass after the ack grace re-queues them and frees their units)."""
    for job in engine.live_jobs():
        if job.state == STOPPING:
            request = inv.poll_control(job.job_id)
            if request is not None:
                inv.ack_control(request.request_id, "step-000000100")


def run_passes(
    url: str,
    *,
    scale: float,
    queued: int,
    passes: int,
    churn: int,
    seed: int,
    report: Report,
    store: str,
) -> dict[str, Any]:
    """Build the fleet and its jobs in the (empty) inventory at ``url``, then time
    ``passes`` passes with ``churn`` jobs finishing and arriving before each."""
    started = time.perf_counter()
    groups = study_fleet(scale)
    gpus = fleet_gpus(groups)
    clock = _Clock(START_S)
    inv = Inventory(url, now=clock)
    try:
        config = SchedulerConfig(queue_depth=1_000_000)
        svc = _TimedService(inv, None, config, now=clock, lock_wait_s=0.0)
        report(f"{store}: recording {gpus} GPUs")
        inv.sync(StudyFleetBackend(groups))
        engine = svc.refresh()
        jobs = iter(j for j in _whole_device_jobs(seed, gpus) if is_feasible(engine, j))
        # Fill: running jobs asking for ~95 % of the fleet, placed by one untimed pass.
        asked = 0
        for j in jobs:
            request = to_request(j)
            spec = {"kind": SPEC_KIND, "request": request.model_dump(mode="json"), "train": None}
            inv.record_job(j.job_id, spec, state="queued")
            asked += j.count
            if asked >= FILL_SHARE * gpus:
                break
        report(f"{store}: placing the fill ({asked} GPUs asked)")
        svc.schedule_once()
        running = len(_running(svc.engine))
        report(f"{store}: {running} jobs running; queueing {queued} through the service")
        submitted = 0
        while len(svc.engine.queue) < queued:
            submitted += _submit(svc, jobs, 1)
        # The top-up's jobs that fit what the fill left free are placed by the next pass
        # all at once (~300 at full scale), and some preempt lower-priority ones, which
        # stop, are re-queued and make room a pass or two later: a burst, settled before
        # the timed passes and reported apart from the steady state the goal is about.
        t0 = time.perf_counter()
        settle_placed = settle_passes = 0
        while settle_passes < SETTLE_MAX_PASSES:
            settle = svc.schedule_once()
            settle_passes += 1
            settle_placed += len(settle.placed)
            if not settle.stopping:
                break
            _answer_stops(inv, svc.engine)
            clock.t += STEP_S
        settle_ms = (time.perf_counter() - t0) * 1000
        queued_at_start = len(svc.engine.queue)
        rebuilds_at_start = svc.rebuilds
        rng = random.Random(seed)
        totals: list[float] = []
        reads: list[float] = []
        decides: list[float] = []
        writes: list[float] = []
        placed: list[int] = []
        finished = 0
        errors: list[str] = []
        last_keep = clock.t
        for k in range(passes):
            clock.t += STEP_S
            if clock.t - last_keep >= config.lease_ttl_s / 3:
                _keep_runners(inv, config.lease_ttl_s)
                last_keep = clock.t
            for job_id in rng.sample(_running(svc.engine), min(churn, running)):
                svc.job_done(job_id, ok=True, attempt=svc.inventory.job(job_id).attempt)
                finished += 1
            submitted += _submit(svc, jobs, churn)
            _answer_stops(inv, svc.engine)
            svc.refresh_s = 0.0
            t0 = time.perf_counter()
            result: PassReport = svc.schedule_once()
            total = time.perf_counter() - t0
            totals.append(total * 1000)
            reads.append(svc.refresh_s * 1000)
            decides.append(result.decide_s * 1000)
            writes.append((total - svc.refresh_s - result.decide_s) * 1000)
            placed.append(len(result.placed))
            errors += result.errors
            if (k + 1) % 10 == 0:
                report(f"{store}: {k + 1}/{passes} passes, p50 {percentile(totals, 50):.1f} ms")
        p99 = percentile(totals, 99)
        return {
            "store": store,
            "measured": True,
            "url": make_url(url).render_as_string(hide_password=True),
            "fleet_gpus": gpus,
            "running_jobs_at_start": running,
            "queued_at_start": queued_at_start,
            "settle_ms": round(settle_ms, 2),
            "settle_passes": settle_passes,
            "settle_placed": settle_placed,
            "rebuilds_in_timed_passes": svc.rebuilds - rebuilds_at_start,
            "queued_at_end": len(svc.engine.queue),
            "passes": len(totals),
            "churn_per_pass": churn,
            "finished_between_passes": finished,
            "submitted_through_service": submitted,
            "placed_total": sum(placed),
            "placed_min_per_pass": min(placed),
            "pass_errors": len(errors),
            "first_error": errors[0] if errors else "",
            "pass_p50_ms": round(percentile(totals, 50), 2),
            "pass_p99_ms": round(p99, 2),
            "pass_max_ms": round(max(totals), 2),
            "read_p50_ms": round(percentile(reads, 50), 2),
            "read_p99_ms": round(percentile(reads, 99), 2),
            "decide_p50_ms": round(percentile(decides, 50), 2),
            "decide_p99_ms": round(percentile(decides, 99), 2),
            "write_p50_ms": round(percentile(writes, 50), 2),
            "write_p99_ms": round(percentile(writes, 99), 2),
            "pass_goal_ms": PASS_GOAL_MS,
            "pass_p99_over_goal": round(p99 / PASS_GOAL_MS, 3),
            "setup_and_run_s": round(time.perf_counter() - started, 1),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        }
    finally:
        inv.close()


def is_feasible(engine: Engine, j: TraceJob) -> bool:
    """Whether some pool of the engine's fleet could ever run the trace job."""
    try:
        engine.check_feasible(to_request(j))
    except SubmissionRefused:
        return False
    return True


def _submit(svc: SchedulerService, jobs: Iterator[TraceJob], n: int) -> int:
    done = 0
    for j in jobs:
        svc.submit(to_request(j))
        done += 1
        if done == n:
            break
    if done < n:
        raise RuntimeError("the bench ran out of trace jobs; lengthen the trace")
    return done


def service_pass(quick: bool, report: Report) -> dict[str, dict[str, Any]]:
    """Both stores: ``{"service_pass_sqlite": ..., "service_pass_postgres": ...}``."""
    if quick:
        sizes = {"scale": 0.02, "queued": 40, "passes": 12, "churn": 3}
    else:
        sizes = {"scale": 1.0, "queued": 1000, "passes": PASSES, "churn": CHURN}
    pg_url = os.environ.get(POSTGRES_URL_ENV, "").strip()
    if pg_url:
        _check_empty(pg_url)  # before anything runs: a refusal costs nothing
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuflow-bench-pass-") as tmp:
        url = f"sqlite:///{Path(tmp) / 'inventory.db'}"
        out["service_pass_sqlite"] = run_passes(
            url, seed=11, report=report, store="sqlite", **sizes
        )
    if not pg_url:
        report(NOT_MEASURED)
        out["service_pass_postgres"] = {
            "store": "postgres",
            "measured": False,
            "note": NOT_MEASURED,
        }
        return out
    try:
        out["service_pass_postgres"] = run_passes(
            pg_url, seed=11, report=report, store="postgres", **sizes
        )
    finally:
        _drop_tables(pg_url)
    return out
