"""An emitted `gpuflow.device.health-risk` event starts `remediate` through its deployment
trigger: a real Prefect server (the session's test server), the deployment served with
its trigger in a separate process, the event sent by the health monitor's emit function."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpuflow.flows.remediate import TRIGGER_SPEC
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.health.decision import DeviceCosts, JobCosts, decide
from gpuflow.tasks.health.events import DECISION_LABEL, EVENT_NAME, emit_health_risk
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
from prefect.events import DeploymentEventTrigger
from prefect.events.schemas.events import Resource, ResourceSpecification
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL

from tests.tasks.remediation.helpers import A100, WebhookReceiver, make_cluster, wait_until

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
DEPLOYMENT = "remediate-trigger-test"


def test_trigger_spec_is_a_valid_deployment_trigger() -> None:
    trigger = DeploymentEventTrigger(**{k: v for k, v in TRIGGER_SPEC.items() if k != "type"})
    assert trigger.expect == {EVENT_NAME}
    assert trigger.parameters["event_id"] == "{{ event.id | string }}"
    # If prefect.yaml carries the remediate deployment, its trigger is this one.
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text()).get("deployments") or []
    for dep in deployments:
        if dep.get("entrypoint") == "flows/remediate.py:remediate":
            assert dep["triggers"] == [TRIGGER_SPEC]


def test_the_trigger_starts_on_act_and_drain_decisions_only() -> None:
    """What the server matches an event's resource with (ResourceSpecification.includes)."""
    match = ResourceSpecification(TRIGGER_SPEC["match"])

    def device(**labels: str) -> Resource:
        return Resource({"prefect.resource.id": "gpuflow.device.a100-1.1", **labels})

    assert match.includes([device(**{DECISION_LABEL: "act"})])
    assert match.includes([device(**{DECISION_LABEL: "drain-now"})])
    assert not match.includes([device(**{DECISION_LABEL: "watch"})])
    assert not match.includes([device()])  # an event without a decision label


@pytest.fixture
def served(gpuflow_home: Path) -> Iterator[tuple[WebhookReceiver, str]]:
    """The remediate deployment served (with its trigger) by a subprocess of this test."""
    with WebhookReceiver() as hook:
        hook.block().save("gpuflow-ops-trigger", overwrite=True)
        env = {
            **os.environ,
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
            "PYTHONPATH": str(REPO),
        }
        proc = subprocess.Popen(
            [
                sys.executable,
                str(REPO / "tests/tasks/remediation/serve_remediate.py"),
                DEPLOYMENT,
                "custom-webhook/gpuflow-ops-trigger",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            yield hook, proc
        finally:
            proc.kill()  # our own subprocess; its flow run has finished
            proc.wait(timeout=30)


def _deployment_id(client) -> str | None:
    try:
        return str(client.read_deployment_by_name(f"remediate/{DEPLOYMENT}").id)
    except Exception:  # ObjectNotFound until the subprocess registered it
        return None


def test_health_risk_event_starts_remediate(gpuflow_home: Path, served) -> None:
    make_cluster(gpuflow_home)
    hook, proc = served
    with get_client(sync_client=True) as client:
        wait_until(
            lambda: _deployment_id(client) is not None or proc.poll() is not None,
            120,
            "the served deployment",
        )
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")[-3000:]
        dep_id = _deployment_id(client)
        wait_until(
            lambda: client.read_automations_by_name(TRIGGER_SPEC["name"]),
            30,
            "the trigger's automation",
        )

        # The monitor's cost rule acts on a 64-GPU gang an hour after its checkpoint at a
        # risk far below the drain level (0.85): the trigger starts on that decision.
        gang = DeviceCosts((JobCosts("gang", 64, 3600.0, 120.0, 600.0, 300.0),), True)
        decision = decide(0.2, 1800.0, gang, model="test-model")
        assert decision.action == "act"
        event_id = emit_health_risk(
            "a100-1",
            1,
            0.2,
            {"remap_pending": 1.0, "xid_memory_log": 0.69},
            A100,
            decision=decision,
        )
        EventsWorker.drain_all()
        emitted = time.monotonic()
        runs: list = []

        def started() -> bool:
            runs[:] = client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep_id])),
                flow_run_filter=FlowRunFilter(),
            )
            return any(r.state and r.state.type.value in ("RUNNING", "COMPLETED") for r in runs)

        wait_until(started, 30, "a remediate flow run started by the event", poll_s=0.25)
        latency_s = time.monotonic() - emitted
        print(f"event -> remediate running: {latency_s:.1f} s")
        run = runs[0]
        assert run.parameters["event_id"] == event_id
        assert run.parameters["resource_id"] == "gpuflow.device.a100-1.1"
        assert run.parameters["payload"]["risk"] == 0.2 and run.parameters["trigger"] == "predicted"
        assert run.parameters["payload"]["decision"]["action"] == "act"

        def finished() -> bool:
            state = client.read_flow_run(run.id).state
            return state is not None and state.is_final()

        wait_until(finished, 60, "the remediate flow run to finish", poll_s=0.25)
        assert client.read_flow_run(run.id).state.is_completed()
    assert Inventory().is_cordoned("a100-1", 1)
    assert hook.messages and "a100-1:1" in hook.messages[-1]["subject"]
    assert "no jobs on the device" in hook.messages[-1]["body"]
