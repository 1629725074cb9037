"""Chaos on the twin, end to end: a real training job, a fault on its device, and the
job finishing elsewhere.

Predicted: HBM degradation is injected under a running job; the health monitor
(tasks.health.monitor.run_monitor, fast-forwarding the twin) raises the health-risk event;
`remediate` runs with the parameters the deployment trigger renders from that event; the
job moves to another A100 (a spare node, since the fleet is full) and finishes. Zero steps
are lost and the loss curve is the one an uninterrupted run draws, bit for bit.

Abrupt: the device falls off the bus (XID 79) under the job; the job crashes, its crash
handler starts `remediate`, the job resumes from its last periodic checkpoint: it loses
at most one checkpoint interval, and the steps it trains again give the same losses.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest
import torch
from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.flows.remediate import crash_handler, remediate
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.health.baselines import RuleModel
from gpuflow.tasks.health.events import emit_health_risk, health_risk_payload, resource_id_for
from gpuflow.tasks.health.features import WINDOW_BUCKETS
from gpuflow.tasks.health.monitor import run_monitor
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.launch import RUNNER
from gpuflow.tasks.tracking import tracking_uri, use_experiment
from gpuflow.tasks.training.loop import train_loop
from gpuflow.tasks.training.storage import LocalStorage

from tests.helpers.step_gate import StepGate, StepGates
from tests.tasks.remediation.helpers import A100, WebhookReceiver, fill, make_cluster, small_spec

pytestmark = pytest.mark.integration

# The job waits after step HOLD_AT while the test injects its fault; STEPS is far more
# than the steps it takes to notice a dead device (one utilization window, 0.5 s).
STEPS, INTERVAL, HOLD_AT = 400, 50, 120
MONITOR_INTERVAL_S = 600.0  # each monitor round fast-forwards the twin by this much


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # bit-exact comparisons need one setting for all runs
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The loss of every step of the same job run without any interruption."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("reference")
        seen: list[float] = []
        train_loop(
            small_spec("reference", STEPS, INTERVAL),
            LocalStorage(root),
            hooks=[lambda info: seen.append(info.loss)],
        )
        return seen
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[StepGates]:
    with StepGates(tmp_path / "gates") as made:
        yield made


def _start_job(cluster, home: Path, job_id: str, gate: StepGate, **kw):
    client = mlflow.MlflowClient(tracking_uri())
    run_id = client.create_run(use_experiment("gpuflow-train"), run_name=job_id).info.run_id
    handle = RUNNER.start(
        small_spec(job_id, STEPS, INTERVAL),
        CheckpointStorage(path=str(home / "ckpt")),
        cluster,
        run_id=run_id,
        step_hooks=(gate.hook,),
        **kw,
    )
    assert gate.wait_reached(120), "the job never got going"
    return handle, run_id


def _loss_history(run_id: str) -> list[tuple[int, float]]:
    history = mlflow.MlflowClient(tracking_uri()).get_metric_history(run_id, "loss")
    return sorted((m.step, m.value) for m in history)


def test_predicted_hbm_fault_moves_the_job_with_zero_steps_lost(
    gpuflow_home: Path, reference_losses: list[float], gates: StepGates
) -> None:
    cluster = make_cluster(gpuflow_home)
    backend = SimBackend()
    with WebhookReceiver() as hook:
        # It trains on while remediation's checkpoint-and-stop is on its way: it answers
        # at exactly HOLD_AT.
        gate = gates(HOLD_AT, "chaos-hbm", opens_on_request=True)
        handle, run_id = _start_job(cluster, gpuflow_home, "chaos-hbm", gate)
        node, index = handle.segments[0].device.split(":")
        fill(Inventory())  # every other active A100 is busy: only a spare node can help
        assert Inventory().free_resources(sku=A100) == []

        backend.inject_fault(node, int(index), "hbm", lead_s=4 * 3600.0)
        events: list[dict] = []

        def emit(n, i, risk, features, sku, reason="model", missing=(), **decided) -> str:
            event_id = emit_health_risk(n, i, risk, features, sku, reason, missing, **decided)
            events.append(
                {
                    "node": n,
                    "index": i,
                    "risk": risk,
                    "features": features,
                    "sku": sku,
                    "reason": reason,
                    "event_id": event_id,
                }
            )
            return event_id

        state = gpuflow_home / "monitor-state"
        for _ in range(30):  # rounds of the monitor, the twin fast-forwarded between them
            run_monitor(backend, RuleModel(WINDOW_BUCKETS), rounds=1, emit=emit, state_dir=state)
            if events:
                break
            backend.advance(MONITOR_INTERVAL_S)
        assert [(e["node"], e["index"]) for e in events] == [(node, int(index))]
        assert backend.device_health(node, int(index))["health"] == "degrading"  # not failed yet
        ev = events[0]

        # What the deployment trigger renders from the event (flows.remediate.TRIGGER_SPEC).
        out = remediate(
            resource_id=resource_id_for(node, int(index)),
            payload=health_risk_payload(
                ev["node"], ev["index"], ev["risk"], ev["features"], ev["sku"], ev["reason"]
            ),
            event_id=ev["event_id"],
            trigger="predicted",
            notifier=hook.block(),
            cluster=cluster,
        )
        assert out["status"] == "done" and out["spares_activated"] == ["a100-spare-0"]
        moved = out["jobs"]["chaos-hbm"]
        assert moved["status"] == "resumed" and moved["target"].startswith("a100-spare-0:")
        assert handle.wait(180) and handle.finished, handle.error

    inv = Inventory()
    assert inv.is_cordoned(node, int(index)) and inv.node("a100-spare-0").role == "active"
    first, second = handle.segments
    assert second.device == moved["target"] and not first.error
    assert second.resumed_from_step == first.last_step == moved["step"] == HOLD_AT  # none lost
    assert second.first_step == first.last_step + 1
    # One loss per step, 1..STEPS, equal to the uninterrupted run's: no restart from step 0.
    history = _loss_history(run_id)
    assert [s for s, _ in history] == list(range(1, STEPS + 1))
    assert [v for _, v in history] == reference_losses
    assert len(hook.messages) == 1
    message = hook.messages[0]["body"]
    assert "spare node activated: a100-spare-0" in message and "job chaos-hbm: resumed" in message
    whats = [e["what"] for e in L.Ledger(inv.url).incident(out["incident_id"]).timeline]
    for step in (
        L.RISK_SEEN,
        L.CORDONED,
        L.SPARE_ACTIVATED,
        L.CHECKPOINT_WRITTEN,
        L.JOB_RESUMED,
        L.NOTIFIED,
    ):
        assert step in whats


def test_abrupt_xid79_resumes_from_the_last_periodic_checkpoint(
    gpuflow_home: Path, reference_losses: list[float], gates: StepGates
) -> None:
    cluster = make_cluster(gpuflow_home)
    backend = SimBackend()
    with WebhookReceiver() as hook:
        gate = gates(HOLD_AT, "chaos-xid")
        handle, run_id = _start_job(
            cluster,
            gpuflow_home,
            "chaos-xid",
            gate,
            on_crash=crash_handler(notifier=hook.block(), cluster=cluster),
        )
        node, index = handle.segments[0].device.split(":")
        backend.inject_fault(node, int(index), "xid79")
        gate.open()  # the device died under the running job
        assert handle.wait(180) and handle.finished, handle.error

        # The monitor sees the device gone and raises the event too: the same incident,
        # nothing more happens (no second relaunch, no second message).
        events: list[tuple] = []
        run_monitor(
            backend,
            RuleModel(WINDOW_BUCKETS),
            rounds=1,
            emit=lambda *a, **k: events.append((a, k)) or f"ev-lost-{len(events)}",
            state_dir=gpuflow_home / "monitor-state",
        )
        assert [(a[0], a[1], k.get("reason")) for a, k in events] == [
            (node, int(index), "device lost")
        ]
        again = remediate(
            resource_id=resource_id_for(node, int(index)),
            trigger="predicted",
            payload=health_risk_payload(
                node, int(index), 1.0, {"present": 0.0}, A100, "device lost"
            ),
            event_id="ev-lost-1",
            notifier=hook.block(),
            cluster=cluster,
        )
        assert again["duplicate"] == "device" and again["jobs"] == {}
        assert len(hook.messages) == 1 and "reactive" in hook.messages[0]["subject"]

    first, second = handle.segments
    assert first.error.startswith("DeviceLostError") and second.error is None
    lost = first.last_step - second.resumed_from_step
    assert 0 <= lost <= INTERVAL  # at most one checkpoint interval
    assert second.resumed_from_step % INTERVAL == 0  # a periodic checkpoint
    history = _loss_history(run_id)
    assert sorted({s for s, _ in history}) == list(range(1, STEPS + 1))
    redone = [s for s, _ in history if s > second.resumed_from_step and s <= first.last_step]
    assert len(history) == STEPS + lost and len(redone) == 2 * lost
    for step, value in history:  # trained twice or once, every loss is the reference's
        assert value == reference_losses[step - 1]
    inv = Inventory()
    assert inv.is_cordoned(node, int(index)) and not inv.device(node, int(index)).present
    incident = L.Ledger(inv.url).incidents()[0]
    whats = [e["what"] for e in incident.timeline]
    for step in (L.DEVICE_LOST, L.CORDONED, L.CHECKPOINT_FALLBACK, L.JOB_RESUMED, L.NOTIFIED):
        assert step in whats
    assert incident.trigger == "reactive" and incident.status == "done"
