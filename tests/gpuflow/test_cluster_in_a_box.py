"""Cluster in a box: one Prefect server, two workers that each own a different twin node.

A training job submitted to the scheduler starts through the `train` deployment on the
worker of the node it was placed on; a health event on that node makes `remediate`
(started by the event's trigger) move it, through a checkpoint, to the other worker's node,
where it finishes with no step lost.

The job runs in a worker's flow run, another process: a file gate (tests/helpers/
step_gate.py, through the workers' environment) holds it after step HOLD_AT until
remediation has asked it for its checkpoint, so it surely still runs when remediation lands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.helpers.step_gate import StepGate

pytestmark = pytest.mark.integration
ROOT = Path(__file__).parents[2]
JOB = "box-job"
STEPS, INTERVAL, HOLD_AT = 60, 25, 30  # held after its first checkpoint


def _run(
    exe: str, *args: str, env: dict[str, str], timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    path = Path(sys.executable).with_name(exe)
    return subprocess.run(
        [str(path), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("box-home")
    spec = home / "box.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "box",
                "seed": 7,
                "faults": {"natural": False},
                "nodes": [
                    {
                        "name": "a100-0",
                        "region": "cn-north",
                        "role": "active",
                        "devices": [{"sku": "a100-40gb", "count": 1}],
                    },
                    {
                        "name": "a100-1",
                        "region": "cn-north",
                        "role": "active",
                        "devices": [{"sku": "a100-40gb", "count": 1}],
                    },
                ],
            }
        )
    )
    # Inside the job's lease (300 s from its start; renewed at step 50).
    gate = StepGate(home / "gate", HOLD_AT, JOB, timeout_s=240)
    env = {**os.environ, "GPUFLOW_HOME": str(home), "GPUFLOW_BACKEND": "sim", **gate.env()}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    reset = _run("gpuflow", "sim", "reset", "--spec", str(spec), env=env)
    assert reset.returncode == 0, reset.stderr
    up = _run(
        "gpuflow",
        "up",
        "--prefect-port",
        "0",
        "--mlflow-port",
        "0",
        "--node-worker",
        "a100-0",
        "--node-worker",
        "a100-1",
        env=env,
        timeout=900,
    )
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    state = json.loads((home / "controlplane.json").read_text())
    client_env = {
        **env,
        "PREFECT_API_URL": state["prefect_api_url"],
        "MLFLOW_TRACKING_URI": state["mlflow_url"],
    }
    try:
        yield {"home": home, "env": env, "client_env": client_env, "state": state, "gate": gate}
    finally:
        gate.open()  # a failed test leaves no job waiting
        down = _run("gpuflow", "down", env=env)
        assert down.returncode == 0, down.stderr


def _in_box(box: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point this test process at the box's home, Prefect server and MLflow server."""
    for key in ("GPUFLOW_HOME", "PREFECT_API_URL", "MLFLOW_TRACKING_URI"):
        monkeypatch.setenv(key, box["client_env"][key])


def _wait(what: str, check, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


@pytest.mark.timeout(900)
def test_job_runs_where_placed_and_moves_to_the_other_node(box: dict, monkeypatch) -> None:
    _in_box(box, monkeypatch)
    from gpuflow.hardware.inventory import Inventory
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = box["client_env"]["PREFECT_API_URL"]
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        # Only this test's actions move jobs: no periodic scheduler or monitor passes.
        for name in ("schedule/schedule", "monitor/monitor", "inventory/inventory"):
            dep = client.read_deployment_by_name(name)
            for sched in client.read_deployment_schedules(dep.id):
                client.update_deployment_schedule(dep.id, sched.id, active=False)

    submitted = _run(
        "gpuflow",
        "schedule",
        "submit",
        JOB,
        "--sku",
        "a100-40gb",
        "--model",
        "llama-tiny",
        "--steps",
        str(STEPS),
        "--checkpoint-interval",
        str(INTERVAL),
        "--precision",
        "fp32",
        env=box["client_env"],
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    passed = _run(
        "prefect", "deployment", "run", "schedule/schedule", "--watch", env=box["client_env"]
    )
    assert passed.returncode == 0, passed.stdout[-2000:] + passed.stderr[-2000:]

    gate: StepGate = box["gate"]
    assert gate.wait_reached(300), f"the job never reached step {HOLD_AT} on a worker"
    inventory = Inventory()
    job = _wait(
        "the job to run and checkpoint",
        lambda: (j := inventory.job(JOB)).state == "running" and j.last_checkpoint_id and j,
        30,
    )
    placed = inventory.resource(job.resource_ids[0])
    other = "a100-1" if placed.node == "a100-0" else "a100-0"

    # The event comes from another process, as from a monitor on another host (this test
    # process's events client may already be bound to another server of the session).
    emitted = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpuflow.tasks.health.events import emit_health_risk; "
            "emit_health_risk(sys.argv[1], int(sys.argv[2]), 0.97, {'remap_pending': 1.0}, sys.argv[3]); "
            "from prefect.events.worker import EventsWorker; EventsWorker.drain_all()",
            placed.node,
            str(placed.device_index),
            placed.sku,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=box["client_env"],
        cwd=ROOT,
    )
    assert emitted.returncode == 0, emitted.stderr

    _wait(
        "remediation to ask the job for a checkpoint",
        lambda: any(r.status == "pending" for r in inventory.control_requests(JOB)),
        180,
        0.5,
    )
    assert inventory.is_cordoned(placed.node, placed.device_index), (
        "remediation asked before it cordoned the device"
    )
    assert inventory.job(JOB).state == "running"  # held at the gate: it surely runs
    gate.open()
    done = _wait(
        "the job to finish", lambda: (j := inventory.job(JOB)).state == "finished" and j, 600, 2.0
    )

    def job_runs() -> list:
        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            found = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["train"]))
            )
        return sorted(
            (r for r in found if (r.parameters.get("spec") or {}).get("job_id") == JOB),
            key=lambda r: r.created,
        )

    # The job is finished in the inventory a moment before its flow run records the end.
    runs = _wait(
        "both train runs to complete",
        lambda: (rs := job_runs()) and all(r.state_name == "Completed" for r in rs) and rs,
        120,
    )
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        remediations = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["remediate"]))
        )
    assert [r.work_queue_name for r in runs] == [f"node-{placed.node}", f"node-{other}"]
    assert len(runs) == 2
    assert remediations and remediations[0].state_name == "Completed"

    import mlflow

    client = mlflow.MlflowClient(box["client_env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("gpuflow-train")
    mruns = sorted(
        client.search_runs([experiment.experiment_id], f"tags.`gpuflow.job_id` = '{JOB}'"),
        key=lambda r: r.info.start_time,
    )
    assert [r.data.tags["gpuflow.node"] for r in mruns] == [placed.node, other]
    acked = [r for r in inventory.control_requests(JOB) if r.checkpoint_id]
    assert acked, "the job never acknowledged a checkpoint request"
    stopped_at = int(acked[0].checkpoint_id.split("-")[1])
    assert stopped_at == HOLD_AT  # it answered right where it was held
    first, second = mruns
    assert first.data.metrics["steps_done"] == stopped_at  # it stopped at its checkpoint
    assert second.data.metrics["resumed_from_step"] == stopped_at  # zero steps lost
    assert second.data.metrics["steps_done"] == STEPS and done.last_checkpoint_id.endswith(
        str(STEPS)
    )
