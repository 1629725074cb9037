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
