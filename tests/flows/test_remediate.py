"""The `remediate` flow against the test Prefect server and the twin: the predicted path,
idempotency, bad input and dead ends, a failing step, and the CLI."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import gpuflow.flows.remediate as remediate_module
import pytest
import torch
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows.remediate import crash_handler, remediate
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.launch import RUNNER
from gpuflow.tasks.training.binding import DeviceRequest
from prefect import task
from typer.testing import CliRunner

from gpuflow import cli_remediate
from tests.helpers.step_gate import StepGate, StepGates
from tests.tasks.remediation.helpers import (
    WebhookReceiver,
    make_cluster,
    small_spec,
    wait_until,
)

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # toy jobs: one thread is fastest, and robust to shared cores
    yield
    torch.set_num_threads(before)


@pytest.fixture
def cluster(gpuflow_home):
    return make_cluster(gpuflow_home)


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[StepGates]:
    with StepGates(tmp_path / "gates") as made:
        yield made


def _start(cluster, tmp_path, job_id, *hold: StepGate, steps=200, device=None, **kw):
    """Start a job that waits at its first gate: it surely runs when the test acts."""
    handle = RUNNER.start(
        small_spec(job_id, steps=steps, interval=25),
        CheckpointStorage(path=str(tmp_path / "ck")),
        cluster,
        device,
        step_hooks=tuple(gate.hook for gate in hold),
        **kw,
    )
    assert hold[0].wait_reached(60), f"job {job_id} never reached step {hold[0].at_step}"
    return handle


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
        )
    return found[0] if found else None


def test_predicted_risk_moves_the_job_once_and_only_once(cluster, hook, gates, tmp_path) -> None:
    # The job waits after step 40 until remediation's request arrives: it stops right there.
    gate = gates(40, "rm-pred", opens_on_request=True)
    handle = _start(cluster, tmp_path, "rm-pred", gate)
    device = handle.segments[0].device
    node, index = device.split(":")
    out = remediate(
        device=device,
        trigger="predicted",
        event_id="ev-1",
        notifier=hook.block(),
        cluster=cluster,
        payload={"risk": 0.95, "top_features": {"xid_63": 2.0}},
    )
    assert out["status"] == "done" and out["risk"] == 0.95 and out["features"] == {"xid_63": 2.0}
    job = out["jobs"]["rm-pred"]
    assert job["status"] == "resumed" and job["checkpoint_how"] == "on-request"
    assert job["target"] != device and out["spares_activated"] == []  # a free A100 was there
    inv = Inventory()
    assert inv.is_cordoned(node, int(index))
    assert len(hook.messages) == 1 and "1 job(s) moved" in hook.messages[0]["subject"]
    whats = [e["what"] for e in out["timeline"]]
    assert whats == [
        L.RISK_SEEN,
        L.CORDONED,
        L.CHECKPOINT_REQUESTED,
        L.CHECKPOINT_WRITTEN,
        L.JOB_RESUMED,
        L.NOTIFIED,
    ]
    artifact = _artifact(f"remediation-{node}-{index}")
    assert artifact is not None and L.JOB_RESUMED in artifact.data

    # The same event again, then another event for the same device: nothing more happens.
    cordons = inv.cordons()
    again = remediate(
        device=device, trigger="predicted", event_id="ev-1", notifier=hook.block(), cluster=cluster
    )
    assert again["duplicate"] == "event" and again["jobs"] == {}
    later = remediate(
        resource_id=f"gpuflow.device.{node}.{index}",
        trigger="predicted",
        event_id="ev-2",
        notifier=hook.block(),
        cluster=cluster,
    )
    assert later["duplicate"] == "device" and later["jobs"] == {} and not later["notified"]
    assert inv.cordons() == cordons and len(hook.messages) == 1
    assert len(L.Ledger(inv.url).incidents()) == 1

    assert handle.wait(120) and handle.finished and len(handle.segments) == 2
    steps = [s for s, _ in handle.losses]
    assert steps == list(range(1, 201))  # zero steps lost, none trained twice
    assert handle.segments[1].resumed_from_step == handle.segments[0].last_step == job["step"]
    assert job["step"] == gate.at_step


def test_bad_input_and_a_device_without_jobs(cluster, hook) -> None:
    with pytest.raises(InvalidRequestError, match="unknown node 'nope'"):
        remediate(device="nope:1", notifier=hook.block(), cluster=cluster)
    assert len(hook.messages) == 1 and "refused" in hook.messages[0]["subject"]
    with pytest.raises(InvalidRequestError, match="NODE:INDEX"):
        remediate(device="a100-0", notifier=hook.block(), cluster=cluster)
    inv = Inventory()
    assert inv.cordons() == [] and L.Ledger(inv.url).incidents() == []

    out = remediate(device="a100-1:1", reason="fan noise", notifier=hook.block(), cluster=cluster)
    assert out["status"] == "done" and out["jobs"] == {} and inv.is_cordoned("a100-1", 1)
    assert "no jobs on the device" in hook.messages[-1]["body"]


def test_no_capacity_anywhere_nothing_is_lost(cluster, hook, gates, tmp_path) -> None:
    # The only V100: a predicted risk cannot move the job, so it checkpoints in place and
    # keeps running; when the device then dies the job is queued with its checkpoint.
    # It waits after step 30 for remediation's checkpoint-now, then after step 35 until
    # the device is dead (it never gets near its last step: its crash ends it).
    asked = gates(30, "rm-v100", opens_on_request=True)
    dying = gates(35, "rm-v100")
    handle = _start(
        cluster,
        tmp_path,
        "rm-v100",
        asked,
        dying,
        steps=3000,
        device=DeviceRequest(sku="v100"),
        on_crash=crash_handler(notifier=hook.block(), cluster=cluster),
    )
    assert handle.segments[0].device == "v100-0:0"
    out = remediate(
        device="v100-0:0", trigger="predicted", risk=0.9, notifier=hook.block(), cluster=cluster
    )
    assert out["status"] == "waiting" and out["short"] == {"Tesla V100-SXM2-32GB": 1}
    job = out["jobs"]["rm-v100"]
    assert (
        job["status"] == "in-place"
        and job["checkpoint_id"]
        and job["checkpoint_how"] == "on-request"
    )
    assert "NO CAPACITY" in hook.messages[-1]["body"]
    assert job["step"] == asked.at_step
    assert dying.wait_reached(60), "the job stopped training after its checkpoint in place"
    assert handle._threads[0].is_alive()  # still training on the cordoned device

    SimBackend().inject_fault("v100-0", 0, "xid79")
    dying.open()
    wait_until(lambda: len(hook.messages) >= 2, 60, "the reactive remediation's message")
    inv = Inventory()
    record = inv.job("rm-v100")
    assert record.state == "queued" and record.last_checkpoint_id is not None
    assert record.last_checkpoint_id >= job["checkpoint_id"]  # newest checkpoint kept
    assert "waiting" in hook.messages[-1]["subject"]
    incident = L.Ledger(inv.url).incidents()[0]
    assert incident.status == "waiting"
    assert L.JOB_QUEUED in [e["what"] for e in incident.timeline]


def test_a_failing_step_loses_no_job(cluster, hook, gates, tmp_path, monkeypatch) -> None:
    handle = _start(cluster, tmp_path, "rm-fail", gates(40, "rm-fail", opens_on_request=True))
    device = handle.segments[0].device
    node, index = device.split(":")

    def broken_migrate(*args, **kwargs):
        raise RuntimeError("launcher exploded")

    original = remediate_module.migrate_job_task
    monkeypatch.setattr(remediate_module, "migrate_job_task", task(broken_migrate, name="migrate"))
    with pytest.raises(RuntimeError, match="launcher exploded"):
        remediate(
            device=device, trigger="predicted", risk=0.9, notifier=hook.block(), cluster=cluster
        )
    inv = Inventory()
    record = inv.job("rm-fail")
    assert record.state == "queued" and record.last_checkpoint_id  # checkpointed and queued
    assert inv.leases(owner="rm-fail") == []  # its reservation was given back
    assert inv.is_cordoned(node, int(index))  # it was moved off: the cordon stays
    assert "failed" in hook.messages[-1]["subject"]

    # The operator runs it again: a new incident picks the queued job up and resumes it.
    monkeypatch.setattr(remediate_module, "migrate_job_task", original)
    out = remediate(device=device, trigger="manual", notifier=hook.block(), cluster=cluster)
    assert out["jobs"]["rm-fail"]["status"] == "resumed"
    assert out["jobs"]["rm-fail"]["checkpoint_id"] == record.last_checkpoint_id
    wait_until(
        lambda: len(handle.segments) == 2 and handle.segments[1].first_step is not None,
        60,
        "the resumed job's first step",
    )
    assert handle.segments[1].first_step == handle.segments[0].last_step + 1
    wait_until(lambda: not handle.alive, 60, "the resumed job to end")
    assert handle.finished and handle.segments[0].last_step == 40


def test_nothing_moved_means_the_cordon_is_lifted(
    cluster, hook, gates, tmp_path, monkeypatch
) -> None:
    # The job waits after step 40 until the failed remediation is over, then finishes.
    gate = gates(40, "rm-nomove")
    handle = _start(cluster, tmp_path, "rm-nomove", gate, steps=150)
    node, index = handle.segments[0].device.split(":")

    def broken_checkpoint(*args, **kwargs):
        raise RuntimeError("control channel down")

    monkeypatch.setattr(
        remediate_module, "checkpoint_job_task", task(broken_checkpoint, name="checkpoint")
    )
    with pytest.raises(RuntimeError, match="control channel down"):
        remediate(
            device=f"{node}:{index}",
            trigger="predicted",
            risk=0.9,
            notifier=hook.block(),
            cluster=cluster,
        )
    inv = Inventory()
    assert not inv.is_cordoned(node, int(index))
    # No stray reservation: the only lease left (if the job still runs) is the job's own.
    assert {lease.owner for lease in inv.leases()} <= {"rm-nomove"}
    incident = L.Ledger(inv.url).incidents()[0]
    assert incident.status == "failed" and L.CORDON_UNDONE in [e["what"] for e in incident.timeline]
    gate.open()
    assert handle.wait(60) and handle.finished and len(handle.segments) == 1


def test_cli_remediates_and_lists_incidents(cluster, monkeypatch) -> None:
    monkeypatch.delenv("GPUFLOW_NOTIFY_BLOCK", raising=False)
    runner = CliRunner()
    bad = runner.invoke(cli_remediate.app, ["--device", "nope:1"])
    assert bad.exit_code == 2 and "unknown node" in bad.output
    ok = runner.invoke(
        cli_remediate.app, ["--device", "a100-1:0", "--reason", "fan", "--isolate", "node"]
    )
    assert ok.exit_code == 0, ok.output
    assert "no jobs on the device" in ok.output and "done" in ok.output
    assert Inventory().is_cordoned("a100-1")
    assert all(r.node != "a100-1" for r in Inventory().free_resources(sku="a100-40gb"))
    listed = runner.invoke(cli_remediate.app, ["--history"])
    assert listed.exit_code == 0 and "a100-1:0" in listed.output and "manual" in listed.output


def test_train_flow_failure_hook_takes_the_reactive_path(
    cluster, hook, gates, tmp_path, monkeypatch
) -> None:
    """The `train` flow with remediate_on_train_failure as its on_failure hook: the device
    falls off the bus, the flow fails, the hook queues the job with its last checkpoint
    and remediates the device. The relaunch goes through the `train` deployment, which
    this test server lacks, so the job waits: nothing lost, operators told."""
    from gpuflow.flows.remediate import remediate_on_train_failure
    from gpuflow.flows.train import train
    from gpuflow.tasks.training import control
    from gpuflow.tasks.training import job as job_module

    monkeypatch.setattr(job_module.train_loop_task, "retries", 0)
    monkeypatch.setenv("GPUFLOW_NOTIFY_BLOCK", "custom-webhook/gpuflow-ops-hook")
    hook.block().save("gpuflow-ops-hook", overwrite=True)
    # The job waits after step 45 (its step-40 checkpoint written) until its device is
    # gone; it never gets near its last step: the crash ends it.
    spec = small_spec("rm-train-flow", steps=3000, interval=20)
    gate = gates(45, spec.job_id)
    control.step_observers.append(gate.observer)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            train.with_options(on_failure=[remediate_on_train_failure])(
                spec,
                device=DeviceRequest(sku="a100-40gb"),
                storage=CheckpointStorage(path=str(tmp_path / "ck")),
                log_model=False,
            )
        except BaseException as exc:  # noqa: BLE001 - the flow is meant to fail
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert gate.wait_reached(120)
        record = Inventory().job(spec.job_id)
        res = Inventory().resource(record.resource_ids[0])
        SimBackend().inject_fault(res.node, res.device_index, "xid79")
        gate.open()
        thread.join(120)
    finally:
        control.step_observers.remove(gate.observer)
    assert errors and "fell off the bus" in str(errors[0])
    inv = Inventory()
    record = inv.job(spec.job_id)
    assert record.state == "queued" and record.last_checkpoint_id >= "step-000000040"
    assert inv.is_cordoned(res.node, res.device_index) and inv.leases(owner=spec.job_id) == []
    incident = L.Ledger(inv.url).incidents()[0]
    assert incident.trigger == "reactive" and incident.status == "waiting"
    # The train flow left a launch record; this test server has no `train` deployment,
    # so the job waits, checkpointed and queued, and the detail says why.
    assert "not deployed" in incident.jobs[spec.job_id]["detail"]
    assert hook.messages and "reactive" in hook.messages[-1]["subject"]


def test_tour_predicted_fault(gpuflow_home) -> None:
    from gpuflow.tour.remediation import predicted_fault_tour

    out = predicted_fault_tour(report=lambda msg: None, steps=60)
    assert out["remediation"] == "done" and out["job finished"] and out["cordoned"]
    assert out["steps lost"] == 0 and out["moved to"] != out["device"]
    assert out["health model"].startswith("threshold rules")  # no champion in a fresh home
