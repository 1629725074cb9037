"""The remediation steps on the twin, without Prefect: isolate, fail over, checkpoint,
migrate, with live training jobs where the step talks to one."""

from __future__ import annotations

import threading

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.remediation.devices import JobOnDevice, jobs_on_device
from gpuflow.tasks.remediation.launch import InProcessRunner
from gpuflow.tasks.remediation.steps import (
    CHECKPOINT_NOW,
    CheckpointOutcome,
    RemediationPolicy,
    checkpoint_job,
    ensure_capacity,
    isolate,
    migrate_job,
    undo_isolation,
)

from tests.tasks.remediation.helpers import A100, fill, make_cluster, small_spec, wait_until

V100 = "Tesla V100-SXM2-32GB"


@pytest.fixture
def cluster(gpuflow_home):
    return make_cluster(gpuflow_home)


def _job(job_id: str, sku: str = A100) -> JobOnDevice:
    return JobOnDevice(job_id, "running", "r", "device", None, sku, "r1", True, None, {}, None)


def test_isolate_is_idempotent_and_never_takes_over_an_operator_cordon(cluster) -> None:
    inv = Inventory()
    a, b = inv.devices("a100-0")
    first = isolate(inv, a, RemediationPolicy(), "inc-1", "risk 0.9")
    assert first["created"] and inv.is_cordoned("a100-0", a.index)
    again = isolate(inv, a, RemediationPolicy(), "inc-1", "risk 0.9")
    assert again["created"] and [c.reason for c in inv.cordons()] == [first["reason"]]
    assert undo_isolation(inv, a, again) and not inv.is_cordoned("a100-0", a.index)

    inv.cordon("a100-0", b.index, "operator: bad fan")
    kept = isolate(inv, b, RemediationPolicy(), "inc-2", "risk")
    assert not kept["created"] and kept["reason"] == "operator: bad fan"
    assert not undo_isolation(inv, b, kept) and inv.is_cordoned("a100-0", b.index)

    node = isolate(inv, a, RemediationPolicy(isolate="node"), "inc-3", "xid")
    assert node["target"] == "a100-0" and inv.is_cordoned("a100-0")
    assert undo_isolation(inv, a, node) and not inv.is_cordoned("a100-0")


def test_fail_over_promotes_a_spare_only_when_capacity_runs_short(cluster) -> None:
    inv = Inventory()
    jobs = [_job("j1")]
    assert ensure_capacity(inv, jobs, RemediationPolicy()) == {"promoted": [], "short": {}}
    assert inv.node("a100-spare-0").role == "spare"
    fill(inv)
    out = ensure_capacity(inv, jobs, RemediationPolicy())
    assert out == {"promoted": ["a100-spare-0"], "short": {}}
    assert inv.node("a100-spare-0").role == "active"
    assert len(inv.free_resources(sku=A100)) == 2
    # No V100 anywhere else and no spare with one: a shortfall, reported, nothing promoted.
    fill(inv, V100, owner="v-filler")
    assert ensure_capacity(inv, [_job("j2", V100)], RemediationPolicy()) == {
        "promoted": [],
        "short": {V100: 1},
    }
    # use_spares off: short even though a spare could have helped.
    inv.set_node_role("a100-spare-0", "spare")
    out = ensure_capacity(inv, jobs, RemediationPolicy(use_spares=False))
    assert out == {"promoted": [], "short": {A100: 1}}


def _start(cluster, tmp_path, job_id: str, at_step: int = 30, steps: int = 400):
    runner = InProcessRunner()
    reached = threading.Event()
    handle = runner.start(
        small_spec(job_id, steps=steps, interval=25),
        CheckpointStorage(path=str(tmp_path / "ck")),
        cluster,
        step_hooks=(lambda info: reached.set() if info.step >= at_step else None,),
    )
    assert reached.wait(60), "the job never reached its first steps"
    return runner, handle


def test_checkpoint_and_stop_on_a_live_job_loses_no_step(cluster, tmp_path) -> None:
    inv = Inventory()
    _runner, handle = _start(cluster, tmp_path, "ck-live")
    node, index = handle.segments[0].device.split(":")
    dev = inv.device(node, int(index))
    (job,), _ = jobs_on_device(inv, dev)
    out = checkpoint_job(
        inv, job, device_present=True, policy=RemediationPolicy(), incident_id="inc-x"
    )
    wait_until(lambda: handle.segments[0].ended_at_s is not None, 30, "the job to stop")
    seg = handle.segments[0]
    assert out.how == "on-request" and not out.fenced
    assert out.step == seg.last_step and seg.stopped_by_request  # zero steps lost
    record = inv.job("ck-live")
    assert record.state == "queued" and record.last_checkpoint_id == out.checkpoint_id
    assert record.info["remediation"]["device_uuid"] == dev.uuid
    assert inv.leases(owner="ck-live") == [] and inv.poll_control("ck-live") is None
    assert not handle.wait(0.1)  # stopped, not finished: it waits for its relaunch


def test_checkpoint_now_keeps_the_job_running(cluster, tmp_path) -> None:
    inv = Inventory()
    _runner, handle = _start(cluster, tmp_path, "ck-now", steps=150)
    node, index = handle.segments[0].device.split(":")
    (job,), _ = jobs_on_device(inv, inv.device(node, int(index)))
    out = checkpoint_job(
        inv, job, device_present=True, policy=RemediationPolicy(), action=CHECKPOINT_NOW
    )
    assert out.how == "on-request" and out.step is not None
    assert handle.wait(60) and handle.finished and len(handle.segments) == 1
    assert inv.job("ck-now").state == "finished"


def test_silent_job_falls_back_to_its_periodic_checkpoint_and_is_fenced(cluster) -> None:
    inv = Inventory()
    res = inv.free_resources(sku=A100)[0]
    inv.acquire_lease(res.resource_id, "ck-silent", 300)
    inv.record_job("ck-silent", {"device": {}}, "running", [res.resource_id])
    inv.transition_job("ck-silent", last_checkpoint_id="step-000000040")
    (job,), _ = jobs_on_device(inv, inv.device(res.node, res.device_index))
    out = checkpoint_job(
        inv, job, device_present=True, policy=RemediationPolicy(checkpoint_timeout_s=0.3)
    )
    assert out.how == "fallback" and out.checkpoint_id == "step-000000040" and out.step == 40
    assert out.fenced and inv.lease(res.resource_id) is None
    # The stale request is answered, so the relaunched job (same id) does not stop at once.
    assert inv.poll_control("ck-silent") is None
    assert inv.job("ck-silent").state == "queued"
    assert inv.job("ck-silent").last_checkpoint_id == "step-000000040"


def test_migrate_without_launch_record_or_capacity_keeps_the_job_queued(cluster) -> None:
    inv = Inventory()
    res = inv.free_resources(sku=A100)[0]
    inv.record_job("mig-q", {"device": {}}, "queued", [res.resource_id])
    job = JobOnDevice(
        "mig-q",
        "queued",
        res.resource_id,
        "device",
        None,
        A100,
        "r1",
        False,
        "step-000000010",
        {},
        None,
    )
    ck = CheckpointOutcome("mig-q", "checkpoint-and-stop", "fallback", "step-000000010", 10, 0.0)
    out = migrate_job(cluster, job, ck, None)
    assert out.status == "queued" and "gpuflow train" in out.detail
    assert inv.leases(owner="mig-q") == []  # the target it reserved is given back
    fill(inv)
    out = migrate_job(cluster, job, ck, None)
    assert out.status == "queued" and "no healthy" in out.detail
    assert inv.job("mig-q").state == "queued"


def _placed_scheduled_job(cluster, tmp_path, job_id: str, launcher: str):
    """A scheduled job, placed by a pass, with a launch record; no runner took it (its
    process died before it started: remediation finds it silent)."""
    from gpuflow.tasks.remediation.launch import remember_launch
    from gpuflow.tasks.scheduling.model import JobRequest
    from gpuflow.tasks.scheduling.service import SchedulerService
    from gpuflow.tasks.training.binding import DeviceRequest

    service = SchedulerService.for_cluster(cluster)
    spec = small_spec(job_id, steps=20, interval=10)
    service.submit(JobRequest(job_id=job_id, skus=(A100,)), train=spec.model_dump())
    assert service.schedule_once().placed, "the first pass placed nothing"
    storage = CheckpointStorage(path=str(tmp_path / "ck"))
    remember_launch(service.inventory, spec, storage, DeviceRequest(sku=A100), launcher=launcher)
    record = service.inventory.job(job_id)
    dev = service.inventory.resource(record.resource_ids[0])
    (job,), _ = jobs_on_device(
        service.inventory, service.inventory.device(dev.node, dev.device_index)
    )
    return service, job


def test_a_job_a_pass_places_during_remediation_is_started_not_ghosted(cluster, tmp_path) -> None:
    """checkpoint -> reserve -> (a scheduling pass places the queued job) ->
    migrate: the order the flows run in. Before, migrate said "already resumed" and
    launched nothing: the job was re-placed forever and never ran."""
    from gpuflow.tasks.remediation.launch import RUNNER
    from gpuflow.tasks.remediation.steps import reserve_target

    service, job = _placed_scheduled_job(cluster, tmp_path, "ghost", "in-process")
    inv = service.inventory
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)
    ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id="inc-g")
    assert inv.job("ghost").state == "queued"
    at_risk = inv.resource(job.resource_id)
    inv.cordon(at_risk.node, at_risk.device_index, "test: isolated")  # as isolate does
    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None and reservation.lease.attempt == 2

    report = service.schedule_once()  # the `schedule` deployment's pass, meanwhile
    (placed,) = report.placed
    record = inv.job("ghost")
    assert record.state == "placed" and record.attempt == 2
    elsewhere = record.resource_ids[0]  # often the reservation itself: it is the job's

    out = migrate_job(cluster, job, ck, reservation)
    assert out.status == "resumed" and out.resource_id == elsewhere
    assert out.launcher["started"] is True
    handle = RUNNER.handle("ghost")
    assert handle is not None and handle.wait(60), "the job never ran"
    assert handle.finished and [s.resource_id for s in handle.segments] == [elsewhere]
    assert inv.job("ghost").state == "finished"
    assert inv.leases(owner="ghost") == []  # the reservation too, used or not


def test_two_launchers_of_one_attempt_start_it_once(cluster, tmp_path) -> None:
    """The scheduler's launcher and remediation's, racing on one placement: the one that
    moves the attempt to launching runs it; the other starts nothing."""
    from gpuflow.tasks.launching import LaunchOrder
    from gpuflow.tasks.remediation.launch import InProcessLauncher, InProcessRunner

    service, job = _placed_scheduled_job(cluster, tmp_path, "twice", "in-process")
    record = service.inventory.job("twice")
    order = LaunchOrder("twice", record.attempt, record.resource_ids[0], "unused")
    launch = record.info["launch"]
    runners = InProcessRunner(), InProcessRunner()
    receipts = [InProcessLauncher(cluster, launch, runner=r).launch(order) for r in runners]
    assert [r.started for r in receipts] == [True, False]
    assert runners[1].handle("twice") is None or not runners[1].handle("twice").segments
    handle = runners[0].handle("twice")
    assert handle.wait(60) and handle.finished and len(handle.segments) == 1


def test_a_job_cancelled_while_remediation_moves_it_is_not_started_again(cluster, tmp_path) -> None:
    """Found by the lifecycle state machine: checkpoint -> (the owner cancels) -> migrate
    used to place the cancelled job again and start it."""
    from gpuflow.tasks.remediation.steps import reserve_target

    service, job = _placed_scheduled_job(cluster, tmp_path, "cancelled", "in-process")
    inv = service.inventory
    policy = RemediationPolicy(checkpoint_timeout_s=0.2, release_grace_s=0.2)
    ck = checkpoint_job(inv, job, device_present=True, policy=policy, incident_id="inc-c")
    reservation = reserve_target(inv, cluster.get_backend(), job)
    assert reservation is not None
    service.cancel("cancelled")
    out = migrate_job(cluster, job, ck, reservation)
    assert out.status == "ended" and "failed" in out.detail
    record = inv.job("cancelled")
    assert record.state == "failed" and inv.leases(owner="cancelled") == []
