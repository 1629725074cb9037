"""Remediation's decisions (tasks.remediation.plan), from plain data: no Prefect run, no
twin, no database."""

from __future__ import annotations

from typing import Any

import pytest
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation import plan
from gpuflow.tasks.remediation.devices import JobOnDevice
from gpuflow.tasks.remediation.plan import Entry, Signal, Situation
from gpuflow.tasks.remediation.steps import (
    CHECKPOINT_AND_STOP,
    CHECKPOINT_NOW,
    CheckpointOutcome,
    MigrateOutcome,
    checkpoint_step,
)

A100 = "NVIDIA A100-SXM4-40GB"
PRESENT = {"present": True, "level": "warning", "reasons": ["hbm remaps"]}
LOST = {"present": False, "level": "lost", "reasons": ["fell off the bus"]}


def _job(job_id: str = "j1", *, holds_lease: bool = True) -> JobOnDevice:
    return JobOnDevice(
        job_id, "running", "GPU-1", "device", None, A100, "r1", holds_lease, None, {}, None
    )


def _incident(timeline: tuple[str, ...] = ()) -> L.Incident:
    return L.Incident(
        incident_id="inc-1",
        device_uuid="GPU-1",
        node="a100-0",
        index=0,
        sku=A100,
        trigger="predicted",
        status="open",
        reason="",
        risk=None,
        features={},
        timeline=tuple({"what": w, "detail": "", "at_s": 0.0} for w in timeline),
        jobs={},
        created_at_s=0.0,
        updated_at_s=0.0,
    )


def _situation(
    condition: dict[str, Any] = PRESENT,
    *,
    trigger: str = "predicted",
    duplicate: str | None = None,
    risk: float | None = 0.9,
    reason: str = "health model risk",
    timeline: tuple[str, ...] = (),
) -> Situation:
    signal = Signal(trigger, reason, risk, {})
    return Situation.of(_incident(timeline), duplicate, signal, condition)


def _ck(action: str, how: str, checkpoint_id: str | None, detail: str = "") -> CheckpointOutcome:
    step = checkpoint_step(checkpoint_id)
    return CheckpointOutcome("j1", action, how, checkpoint_id, step, 0.12345, detail)


# -- the signal ---------------------------------------------------------------------------


def test_signal_takes_what_the_payload_says_and_the_caller_left_out() -> None:
    payload = {"risk": 0.97, "reason": "model", "top_features": [["xid_63", 2.0]]}
    signal = plan.read_signal("predicted", "", None, payload)
    assert signal == Signal("predicted", "health model risk", 0.97, {"xid_63": 2.0})
    # The caller's own values win over the payload's.
    assert plan.read_signal("predicted", "fan", 0.5, payload) == Signal(
        "predicted", "fan", 0.5, {"xid_63": 2.0}
    )
    # Nothing given: a manual request with no reason and no risk.
    assert plan.read_signal("manual", "", None, None) == Signal("manual", "", None, {})


def test_the_incident_reason_names_the_monitors_decision() -> None:
    from gpuflow.tasks.health.decision import DeviceCosts, JobCosts, decide
    from gpuflow.tasks.health.events import health_risk_payload

    gang = DeviceCosts((JobCosts("gang", 64, 3600.0, 120.0, 600.0, 300.0),), True)
    decision = decide(0.12, 1800.0, gang, model="lstm@champion")
    payload = health_risk_payload("n", 0, 0.12, {}, "sku", decision=decision)
    reason = plan.read_signal("predicted", "", None, payload).reason
    assert reason.startswith("health model risk (lstm@champion within 30 min), act: risk 0.1200")
    assert "break-even 0.0824" in reason


def test_a_predicted_event_for_a_lost_device_is_reactive() -> None:
    signal = plan.read_signal("predicted", "", None, {"risk": 1.0, "reason": "device lost"})
    assert signal.trigger == "reactive" and signal.reason == "device lost"
    assert plan.read_signal("manual", "", None, {"reason": "device lost"}).trigger == "manual"


def test_features_in_every_shape_an_event_may_carry() -> None:
    assert plan.features_of({"features": {"a": 1}}) == {"a": 1}
    assert plan.features_of({"top_features": [{"name": "a", "value": 1}, ("b", 2)]}) == {
        "a": 1,
        "b": 2,
    }
    assert plan.features_of({"top_features": [["too", "many", "parts"], 7]}) == {}
    assert plan.features_of({"features": "not features"}) == {}


def test_a_new_result_records_the_signal_and_nothing_done() -> None:
    result = plan.new_result("a100-0:0", Signal("predicted", "why", 0.9, {"f": 1.0}))
    assert result["device"] == "a100-0:0" and result["risk"] == 0.9
    assert result["jobs"] == {} and result["duplicate"] is None and "status" not in result


# -- device present vs lost ----------------------------------------------------------------


def test_a_predicted_incident_on_a_lost_device_says_so_first() -> None:
    assert _situation(LOST).opening_entries() == [Entry(L.DEVICE_LOST, "fell off the bus")]
    assert _situation(PRESENT).opening_entries() == []
    # A reactive incident opened with "device lost"; a joined one said it before.
    assert _situation(LOST, trigger="reactive").opening_entries() == []
    assert _situation(LOST, duplicate="device").opening_entries() == []


@pytest.mark.parametrize(
    ("condition", "has_target", "holds_lease", "action"),
    [
        (PRESENT, False, True, CHECKPOINT_NOW),  # nowhere to go: checkpoint in place
        (PRESENT, True, True, CHECKPOINT_AND_STOP),  # a target: move it
        (LOST, False, True, CHECKPOINT_AND_STOP),  # its device is gone: stop it anyway
        (PRESENT, False, False, CHECKPOINT_AND_STOP),  # not alive to keep running
    ],
)
def test_checkpoint_in_place_only_on_a_working_device_with_no_target(
    condition: dict[str, Any], has_target: bool, holds_lease: bool, action: str
) -> None:
    target = object() if has_target else None
    job = _job(holds_lease=holds_lease)
    assert _situation(condition).checkpoint_action(job, target) == action


def test_only_a_job_holding_its_lease_is_asked_for_a_checkpoint() -> None:
    assert plan.request_entries(_job(), CHECKPOINT_NOW) == [
        Entry(L.CHECKPOINT_REQUESTED, CHECKPOINT_NOW, "j1")
    ]
    assert plan.request_entries(_job(holds_lease=False), CHECKPOINT_AND_STOP) == []


# -- isolate and fail over -----------------------------------------------------------------


def test_the_cordon_says_why_and_is_noted_once() -> None:
    s = _situation()
    assert s.isolation_reason() == "health model risk (risk 0.90)"
    assert _situation(reason="", risk=None, trigger="manual").isolation_reason() == "manual"
    ours = {"created": True, "target": "a100-0:0", "reason": "gpuflow-remediate inc-1: x"}
    assert s.cordon_entries(ours) == [Entry(L.CORDONED, "a100-0:0: gpuflow-remediate inc-1: x")]
    # A re-run finds it noted already; an operator's cordon is not ours to note.
    assert _situation(timeline=(L.RISK_SEEN, L.CORDONED)).cordon_entries(ours) == []
    assert s.cordon_entries(ours | {"created": False}) == []


def test_each_spare_promoted_is_one_entry() -> None:
    assert plan.spare_entries(["s0", "s1"]) == [
        Entry(L.SPARE_ACTIVATED, "node s0 joined the active pool"),
        Entry(L.SPARE_ACTIVATED, "node s1 joined the active pool"),
    ]
    assert plan.spare_entries([]) == []


# -- no spare: in place ---------------------------------------------------------------------


def test_no_capacity_keeps_the_job_running_in_place_and_the_incident_waiting() -> None:
    ck = _ck(CHECKPOINT_NOW, "on-request", "step-000000030")
    step = plan.after_checkpoint(_job(), ck)
    assert not step.migrate
    assert step.entries == [
        Entry(
            L.CHECKPOINT_IN_PLACE,
            f"step-000000030; no free {A100}: keeps running where it is",
            "j1",
        )
    ]
    assert step.outcome == {
        "checkpoint_id": "step-000000030",
        "checkpoint_how": "on-request",
        "step": 30,
        "waited_s": 0.123,
        "status": "in-place",
        "detail": f"no free {A100}: kept running",
    }
    assert plan.final_status({"j1": step.outcome}) == "waiting"


def test_in_place_without_an_answer_leaves_the_job_queued_for_a_checkpoint() -> None:
    ck = _ck(CHECKPOINT_NOW, "none", None, "no answer within 5 s; request left pending")
    step = plan.after_checkpoint(_job(), ck)
    assert [e.what for e in step.entries] == [L.JOB_QUEUED]
    assert step.entries[0].detail.startswith("-; no free")
    assert step.outcome["detail"] == (
        f"no free {A100}: kept running, no answer within 5 s; request left pending"
    )


# -- checkpoint and stop, then migrate ------------------------------------------------------


def test_a_stopped_job_migrates_and_its_checkpoint_is_named() -> None:
    written = plan.after_checkpoint(_job(), _ck(CHECKPOINT_AND_STOP, "on-request", "step-40"))
    assert written.migrate and written.entries == [Entry(L.CHECKPOINT_WRITTEN, "step-40", "j1")]
    fallback = plan.after_checkpoint(
        _job(), _ck(CHECKPOINT_AND_STOP, "fallback", "step-25", "no answer within 5 s")
    )
    assert fallback.entries == [
        Entry(L.CHECKPOINT_FALLBACK, "step-25 (no answer within 5 s)", "j1")
    ]
    scratch = plan.after_checkpoint(_job(), _ck(CHECKPOINT_AND_STOP, "none", None))
    assert scratch.entries == [Entry(L.CHECKPOINT_FALLBACK, "none: restarts from step 0", "j1")]


def test_migration_resumes_the_job_or_queues_it_with_why() -> None:
    ck = _ck(CHECKPOINT_AND_STOP, "on-request", "step-40")
    resumed = MigrateOutcome("j1", "resumed", target="a100-1:0", launcher={"launcher": "x"})
    step = plan.after_migration(_job(), ck, resumed)
    assert step.entries == [Entry(L.JOB_RESUMED, "on a100-1:0 from step-40 (step 40)", "j1")]
    assert step.outcome["status"] == "resumed" and step.outcome["target"] == "a100-1:0"
    assert step.outcome["checkpoint_id"] == "step-40" and not step.migrate

    queued = MigrateOutcome("j2", "queued", detail="no healthy A100 device free")
    late = plan.after_migration(_job("j2"), _ck(CHECKPOINT_AND_STOP, "none", None), queued)
    assert late.entries == [
        Entry(L.JOB_QUEUED, "checkpointed and queued: no healthy A100 device free", "j2")
    ]
    assert plan.final_status({"j1": step.outcome}) == "done"
    assert plan.final_status({"j1": step.outcome, "j2": late.outcome}) == "waiting"
    assert plan.final_status({}) == "done"  # no job on the device: nothing waits


# -- duplicates -------------------------------------------------------------------------------


def test_a_repeat_signal_notifies_only_when_it_changed_something() -> None:
    assert _situation(duplicate=None).should_notify(changed=False)
    assert not _situation(duplicate="device").should_notify(changed=False)
    assert _situation(duplicate="device").should_notify(changed=True)


# -- a failed step ----------------------------------------------------------------------------


def test_a_failed_step_with_nothing_moved_lifts_the_cordon() -> None:
    assert _situation(PRESENT).undo_cordon_on_failure(moved=[])
    assert not _situation(PRESENT).undo_cordon_on_failure(moved=["j1"])  # a job left it
    assert not _situation(LOST).undo_cordon_on_failure(moved=[])  # a dead device stays out


def test_a_failed_step_marks_every_unfinished_job_for_the_device() -> None:
    jobs = [_job("j1"), _job("j2")]
    assert plan.unfinished(jobs, {"j1": {"status": "resumed"}}) == [jobs[1]]
    assert plan.failure_entry(RuntimeError("launcher exploded")) == Entry(
        L.STEP_FAILED, "RuntimeError: launcher exploded"
    )
    assert plan.failed_step_marker({}, "GPU-1", "inc-1") == {
        "device_uuid": "GPU-1",
        "incident": "inc-1",
        "cause": "failed step",
    }
    # Already marked for this device (by its checkpoint or a crash): left as it is.
    marked = {"remediation": {"device_uuid": "GPU-1", "cause": "remediation"}}
    assert plan.failed_step_marker(marked, "GPU-1", "inc-1") is None
    other = {"remediation": {"device_uuid": "GPU-9"}}
    assert plan.failed_step_marker(other, "GPU-1", "inc-1") is not None
