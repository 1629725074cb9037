"""The scheduler service with more than one writer: passes and submits from several
processes at the same moment, victims that never answer, stored requests that no longer
validate. Real processes on the twin's inventory, SQLite and PostgreSQL.

The processes are lined up by a gate the test controls: each child's first read of the
fleet (``refresh``) waits at a barrier, so without the pass lock every child would decide
on the same snapshot. With it, the first child decides alone; the barrier then gives up
(its timeout only bounds how long the winner waits for children that cannot arrive) and
the others decide after it, on what it wrote.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import Any

from gpuflow.hardware.inventory import Inventory, schema
from gpuflow.tasks.scheduling.model import JobRequest, QueueFullError, SchedulerConfig
from gpuflow.tasks.scheduling.service import SchedulerService
from sqlalchemy import update

from tests.helpers.clock import ManualClock

MP = mp.get_context("fork")
GATE_TIMEOUT_S = 5.0


def _gated_service(url: str, gate: Any, **config: Any) -> SchedulerService:
    """A service whose first refresh waits at ``gate`` after reading."""
    svc = SchedulerService(Inventory(url), config=SchedulerConfig(**config))
    plain = svc.refresh
    first = threading.Event()

    def refresh() -> Any:
        engine = plain()
        if not first.is_set():
            first.set()
            try:
                gate.wait(timeout=GATE_TIMEOUT_S)
            except threading.BrokenBarrierError:
                pass  # the others are held off by the pass lock: decide alone
        return engine

    svc.refresh = refresh  # type: ignore[method-assign]
    return svc


def _pass_worker(url: str, gate: Any, out: Any) -> None:
    try:
        report = _gated_service(url, gate).schedule_once()
        out.put((report.to_start, report.errors, None))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put(([], [], repr(exc)))


def _run(target: Any, args: tuple[Any, ...], n: int) -> list[Any]:
    gate, out = MP.Barrier(n), MP.Queue()
    procs = [MP.Process(target=target, args=(*args, gate, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert [r[-1] for r in results] == [None] * n, results
    return results


def test_two_passes_at_once_launch_a_job_once(cluster) -> None:
    url = cluster.inventory_url.get_secret_value()
    svc = SchedulerService(Inventory(url), cluster.get_backend(), SchedulerConfig())
    svc.submit(JobRequest(job_id="one", skus=("a100-40gb",)))
    results = _run(_pass_worker, (url,), 2)
    started = [job for to_start, _, _ in results for job in to_start]
    assert started == ["one"]  # placed by one pass only: one launch
    job = svc.inventory.job("one")
    assert (job.state, job.attempt) == ("placed", 1)
    leases = svc.inventory.leases(owner="one")
    assert [(x.resource_id, x.attempt) for x in leases] == [(job.resource_ids[0], 1)]


def _submit_worker(url: str, gate: Any, out: Any) -> None:
    import os

    try:
        svc = _gated_service(url, gate, queue_depth=2)
        job_id = f"sub-{os.getpid()}"
        try:
            record = svc.submit(JobRequest(job_id=job_id, skus=("v100",), count=2, priority=1))
            out.put((job_id, record.info["sched"]["seq"], None))
        except QueueFullError:
            out.put((job_id, None, None))
    except BaseException as exc:
        out.put(("?", None, repr(exc)))


def test_concurrent_submits_neither_overshoot_the_depth_nor_reuse_a_sequence_number(
    cluster,
) -> None:
    url = cluster.inventory_url.get_secret_value()
    svc = SchedulerService(Inventory(url), cluster.get_backend(), SchedulerConfig(queue_depth=2))
    svc.submit(JobRequest(job_id="first", skus=("v100",), count=2, priority=1))
    results = _run(_submit_worker, (url,), 3)
    admitted = sorted(seq for _, seq, _ in results if seq is not None)
    assert len(admitted) == 1  # depth 2: "first" and one more
    queued = [v for v in svc.jobs() if v.state == "queued"]
    assert len(queued) == 2
    seqs = [r.info["sched"]["seq"] for r in svc.inventory.jobs()]
    assert (
        len(seqs) == len(set(seqs)) == 2
        and admitted[0] > svc.inventory.job("first").info["sched"]["seq"]
    )


def test_a_victim_that_never_answers_is_force_stopped_and_requeued(cluster) -> None:
    clock = ManualClock(1_000_000.0)
    url = cluster.inventory_url.get_secret_value()
    svc = SchedulerService(
        Inventory(url, now=clock),
        cluster.get_backend(),
        SchedulerConfig(lease_ttl_s=600),
        now=clock,
        stop_grace_s=120,
    )
    for i in range(4):
        svc.submit(JobRequest(job_id=f"low{i}", skus=("a100-40gb",)))
    svc.schedule_once()
    svc.submit(JobRequest(job_id="high", skus=("a100-40gb",), priority=10))
    (pre,) = svc.schedule_once().preemptions
    victim = pre["victims"][0]["job_id"]
    rec = svc.inventory.job(victim)
    rid, attempt = rec.resource_ids[0], rec.attempt
    clock.t += 60  # within the grace: still waiting for it
    report = svc.schedule_once()
    assert report.forced == [] and report.stopping == [victim]
    clock.t += 100  # past the grace, its runner alive (it renews) but silent
    assert svc.inventory.renew_leases(victim, attempt, [rid], 600) == 1
    report = svc.schedule_once()
    assert report.forced == [victim] and victim in report.requeued
    assert [p["job_id"] for p in report.placed] == ["high"]
    after = svc.inventory.job(victim)
    assert (after.state, after.attempt) == ("queued", attempt)
    # Its attempt is fenced: the runner's next renewal finds nothing, and it stops.
    assert svc.inventory.renew_leases(victim, attempt, [rid], 600) == 0
    assert svc.inventory.control_requests(victim)[-1].status == "acked"


def test_a_stored_request_that_no_longer_validates_is_quarantined_and_the_pass_goes_on(
    cluster,
) -> None:
    url = cluster.inventory_url.get_secret_value()
    svc = SchedulerService(Inventory(url), cluster.get_backend(), SchedulerConfig())
    svc.submit(JobRequest(job_id="bad", skus=("a100-40gb",)))
    svc.submit(JobRequest(job_id="good", skus=("a100-40gb",)))
    spec = svc.inventory.job("bad").spec
    spec["request"]["count"] = -3  # written by another version, or by hand
    engine = svc.inventory._engine_here()
    with engine.begin() as conn:
        conn.execute(update(schema.jobs).where(schema.jobs.c.job_id == "bad").values(spec=spec))
    listed = {v.job_id: v for v in svc.jobs()}
    assert listed["bad"].state == "quarantined" and "count" in listed["bad"].request
    report = svc.schedule_once()
    assert [q["job_id"] for q in report.quarantined] == ["bad"]
    assert "does not validate" in report.quarantined[0]["error"]
    assert report.to_start == ["good"]
    bad = svc.inventory.job("bad")
    assert bad.state == "failed" and bad.info["sched"]["phase"] == "quarantined"
    assert {v.job_id: v.state for v in svc.jobs()}["bad"] == "quarantined"
    assert svc.schedule_once().quarantined == []  # once is enough
