"""The in-process job runner (launch records, crashes with the device) and the operators'
notification (summary, timeline, delivery to a webhook on loopback)."""

from __future__ import annotations

import threading

import pytest
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.backend import DeviceLostError, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, LeaseNotHeldError
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.launch import (
    InProcessRunner,
    crash_is_hardware,
    storage_fields,
    storage_from_record,
    storage_record,
)
from gpuflow.tasks.remediation.notify import (
    artifact_key,
    resolve_notifier,
    send,
    summary,
    timeline_markdown,
)
from pydantic import SecretStr

from tests.tasks.remediation.helpers import WebhookReceiver, make_cluster, small_spec


@pytest.fixture
def cluster(gpuflow_home):
    return make_cluster(gpuflow_home)


def test_runner_records_how_to_start_the_job_again(cluster, tmp_path) -> None:
    runner = InProcessRunner()
    storage = CheckpointStorage(path=str(tmp_path / "ck"))
    handle = runner.start(small_spec("run-ok", steps=60, interval=20), storage, cluster)
    assert handle.wait(60) and handle.finished and handle.error is None
    assert [s for s, _ in handle.losses] == list(range(1, 61))
    job = Inventory().job("run-ok")
    assert job.state == "finished" and job.last_checkpoint_id == "step-000000060"
    launch = job.info["launch"]
    assert launch["launcher"] == "in-process" and launch["train_spec"]["steps"] == 60
    assert storage_from_record(launch["storage"]).local_root() == storage.local_root()
    assert Inventory().leases(owner="run-ok") == []


def test_storage_record_never_carries_credentials() -> None:
    s3 = CheckpointStorage(
        kind="s3", bucket="b", access_key_id="AKIA1", secret_access_key=SecretStr("very-secret")
    )
    fields = storage_fields(s3)
    assert "secret_access_key" not in fields and "access_key_id" not in fields
    assert "very-secret" not in str(storage_record(s3))
    assert storage_from_record({"fields": fields}).bucket == "b"


def test_which_crashes_are_the_devices_fault(cluster) -> None:
    backend = SimBackend()
    assert crash_is_hardware(DeviceLostError("gone"), backend, "a100-0", 0)
    assert not crash_is_hardware(LeaseNotHeldError("fenced"), backend, "a100-0", 0)
    assert not crash_is_hardware(RuntimeError("NaN loss"), backend, "a100-0", 0)
    backend.inject_fault("a100-0", 1, "ecc-uncorrectable")
    assert crash_is_hardware(RuntimeError("CUDA error: uncorrectable ECC"), backend, "a100-0", 1)
    backend.inject_fault("a100-1", 0, "xid79")
    assert crash_is_hardware(RuntimeError("anything"), backend, "a100-1", 0)


def test_a_job_whose_device_falls_off_the_bus_is_queued_for_remediation(cluster, tmp_path) -> None:
    crashes: list[tuple[str, str, str]] = []
    reached = threading.Event()
    runner = InProcessRunner()
    handle = runner.start(
        small_spec("run-xid", steps=5000, interval=20),
        CheckpointStorage(path=str(tmp_path)),
        cluster,
        on_crash=lambda job, dev, err: crashes.append((job, dev, type(err).__name__)),
        step_hooks=(lambda info: reached.set() if info.step >= 30 else None,),
    )
    assert reached.wait(60)
    node, index = handle.segments[0].device.split(":")
    SimBackend().inject_fault(node, int(index), "xid79")
    assert handle._threads[0].join(60) is None and not handle._threads[0].is_alive()
    assert crashes == [("run-xid", f"{node}:{index}", "DeviceLostError")]
    seg = handle.segments[0]
    assert seg.error.startswith("DeviceLostError") and seg.last_step < 5000
    job = Inventory().job("run-xid")
    assert job.state == "queued"
    assert job.info["remediation"]["device_uuid"] == Inventory().device(node, int(index)).uuid
    assert Inventory().leases(owner="run-xid") == []
    # A crash with its device is not the end of the job: it waits to be resumed.
    assert not handle.wait(0.1)


def _result() -> dict:
    return {
        "device": "a100-0:1",
        "sku": "NVIDIA A100-SXM4-40GB",
        "trigger": "predicted",
        "risk": 0.931,
        "status": "done",
        "incident_id": "inc-1",
        "reason": "health model risk",
        "isolation": {"target": "a100-0:1", "reason": "gpuflow-remediate inc-1"},
        "spares_activated": ["a100-spare-0"],
        "unmanaged": ["serving-1"],
        "short": {},
        "jobs": {
            "j1": {
                "status": "resumed",
                "target": "a100-spare-0:0",
                "checkpoint_id": "step-000000118",
                "checkpoint_how": "on-request",
            }
        },
    }


def test_summary_and_timeline_say_what_happened() -> None:
    subject, body = summary(_result())
    assert "a100-0:1" in subject and "1 job(s) moved" in subject and "0.93" in subject
    for text in (
        "spare node activated: a100-spare-0",
        "job j1: resumed on a100-spare-0:0 from step-000000118",
        "left alone (not a gpuflow job): serving-1",
    ):
        assert text in body
    timeline = [
        {"at_s": 100.0, "what": L.RISK_SEEN, "detail": "risk 0.931"},
        {"at_s": 100.5, "what": L.CHECKPOINT_WRITTEN, "job_id": "j1", "detail": "a|b"},
        {"at_s": 101.25, "what": L.JOB_RESUMED, "job_id": "j1"},
    ]
    md = timeline_markdown(_result(), timeline)
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "what" not in ln]
    assert [r.split("|")[3].strip() for r in rows] == [
        L.RISK_SEEN,
        L.CHECKPOINT_WRITTEN,
        L.JOB_RESUMED,
    ]
    assert "| 1.25 |" in md and "a\\|b" in md
    refused = summary({"device": "x:9", "status": "rejected", "error": "unknown node 'x'"})
    assert "refused" in refused[0] and "unknown node" in refused[1]


def test_one_timeline_artifact_key_per_device() -> None:
    assert artifact_key("a100-0:1") == "remediation-a100-0-1"
    assert artifact_key("Node.With_Odd:3") == "remediation-node-with-odd-3"
    assert artifact_key(None) == artifact_key("::") == "remediation-device"
    assert len(artifact_key("n" * 200)) == len("remediation-") + 60


def test_notification_reaches_a_webhook(monkeypatch) -> None:
    monkeypatch.delenv("GPUFLOW_NOTIFY_BLOCK", raising=False)
    assert resolve_notifier(None) is None
    assert send(None, "s", "b") is False  # logged, not delivered: says so
    with pytest.raises(InvalidRequestError, match="block-type-slug"):
        resolve_notifier("ops-webhook")
    with WebhookReceiver() as hook:
        assert send(resolve_notifier(hook.block()), *summary(_result()))
        assert len(hook.messages) == 1
        assert hook.messages[0]["subject"].startswith("[gpuflow] a100-0:1")
        assert "job j1: resumed" in hook.messages[0]["body"]
