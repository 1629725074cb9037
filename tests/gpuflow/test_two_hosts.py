"""Two hosts, one control plane: the walk-through of docs/scale-out.md, as it is written.

The control host runs `gpuflow up --host <its address> --node-worker a100-0`: Prefect and
MLflow (its store on PostgreSQL, the URL with its password in the environment only) bound
to that address, and the worker of its own node. The GPU host runs `gpuflow join --control
http://<control>:<port>/api --node a100-1`, which registers its node there and starts its
worker. The hosts are two network namespaces joined by a veth pair (the control host is
this test's own), or, where namespaces cannot be made, two loopback addresses
(tests/helpers/hosts.py). They share this machine's file system: the GPUFLOW_HOME both use
stands for what real hosts share (the inventory's PostgreSQL, S3 checkpoints) and holds
the twin, a fleet of those two nodes.

A training job and a 2-rank gang submitted to the scheduler start through the `train`
deployment on the host whose node each was placed on; a health event on one device of each
makes `remediate` (started by the event's trigger) move it, through a checkpoint, to the
other host (the gang whole, two ranks again), where it finishes with no step lost.
Meanwhile the GPU host's own monitor deployment runs there.

The job runs in a worker's flow run, another process: a file gate (tests/helpers/
step_gate.py, through the workers' environment) holds it after step HOLD_AT until
remediation has asked it for its checkpoint, so it surely still runs when remediation lands.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gpuflow import controlplane
from tests.helpers.hosts import two_hosts
from tests.helpers.step_gate import StepGate, gates_env
from tests.helpers.store_templates import seed
from tests.helpers.workers import FAST_WORKERS, pause_schedules

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
JOB = "box-job"
STEPS, INTERVAL, HOLD_AT = 60, 25, 30  # held after its first checkpoint
GANG = "box-gang"  # a job of two ranks, on two V100s of one host
GANG_STEPS, GANG_INTERVAL, GANG_HOLD_AT = 16, 5, 8
CONTROL_NODE, GPU_NODE = "a100-0", "a100-1"
FAKE_PASSWORD = "two-hosts-pw-5b1e"  # trust authentication: the server never asks for it
MLFLOW_SCHEMA = "two_hosts_mlflow"


def _run(
    exe: str, *args: str, env: dict[str, str], timeout: int = 600, on: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """A console script of this environment, on the GPU host when ``on`` says so."""
    path = Path(sys.executable).with_name(exe)
    return subprocess.run(
        [*on, str(path), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def _twin_spec(home: Path) -> Path:
    spec = home / "box.yaml"
    # Per host: one A100 (the one-unit job has only the other host to go to) and two
    # V100s (a gang of two fits on either host, never across them).
    devices = [{"sku": "a100-40gb", "count": 1}, {"sku": "v100", "count": 2}]
    node = {"region": "cn-north", "role": "active", "devices": devices}
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "box",
                "seed": 7,
                "faults": {"natural": False},
                "nodes": [{"name": CONTROL_NODE, **node}, {"name": GPU_NODE, **node}],
            }
        )
    )
    return spec


def _schema(postgres_url: str, *statements: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(text(statement))
    finally:
        engine.dispose()


@contextlib.contextmanager
def _mlflow_store(postgres_url: str) -> Iterator[tuple[str, str]]:
    """(MLflow backend URL, its password): a schema of the test PostgreSQL of its own,
    behind a URL with a password (the fixture's, or a made-up one trust auth ignores)."""
    from sqlalchemy import make_url

    drop = f"DROP SCHEMA IF EXISTS {MLFLOW_SCHEMA} CASCADE"
    _schema(postgres_url, drop, f"CREATE SCHEMA {MLFLOW_SCHEMA}")
    url = make_url(postgres_url)
    password = url.password or FAKE_PASSWORD
    url = url.set(password=password).update_query_dict(
        {"options": f"-csearch_path={MLFLOW_SCHEMA}"}
    )
    try:
        yield url.render_as_string(hide_password=False), str(password)
    finally:
        _schema(postgres_url, drop)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory, postgres_url: str) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("two-hosts-home")
    # Inside the job's lease (300 s from its start; renewed at step 50).
    gate = StepGate(home / "gate", HOLD_AT, JOB, timeout_s=240)
    gang_gate = StepGate(home / "gang-gate", GANG_HOLD_AT, GANG, timeout_s=240)
    gates = gates_env([gate, gang_gate])
    env = {
        **os.environ,
        "GPUFLOW_HOME": str(home),
        "GPUFLOW_BACKEND": "sim",
        **gates,
        **FAST_WORKERS,
    }
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    seed(controlplane.local_stores(home).prefect_database)  # migrated once, not per test
    reset = _run("gpuflow", "sim", "reset", "--spec", str(_twin_spec(home)), env=env)
    assert reset.returncode == 0, reset.stderr
    with _mlflow_store(postgres_url) as (mlflow_store, password), two_hosts() as hosts:
        # The secret only in the control host's environment, as docs/scale-out.md says.
        control_env = {**env, "GPUFLOW_MLFLOW_BACKEND_URI": mlflow_store}
        try:
            up = _run(
                "gpuflow",
                "up",
                "--host",
                hosts.control,
                "--prefect-port",
                "0",
                "--mlflow-port",
                "0",
                "--node-worker",
                CONTROL_NODE,
                "--exporter-port",
                "0",
                env=control_env,
                timeout=900,
            )
            assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
            state = json.loads((home / "controlplane.json").read_text())
            joined = _run(
                "gpuflow",
                "join",
                "--control",
                state["prefect_api_url"],
                "--node",
                GPU_NODE,
                "--exporter-port",
                "0",
                env=env,
                on=hosts.gpu_prefix,
            )
            assert joined.returncode == 0, joined.stdout[-3000:] + joined.stderr[-3000:]
            # Only the tests' actions run flows: no periodic scheduler, monitor or inventory.
            assert "monitor" in pause_schedules(state["prefect_api_url"])
            client_env = {
                **env,
                "PREFECT_API_URL": state["prefect_api_url"],
                "MLFLOW_TRACKING_URI": state["mlflow_url"],
            }
            yield {
                "home": home,
                "env": env,
                "client_env": client_env,
                "state": state,
                "joined": json.loads((home / f"join-{GPU_NODE}.json").read_text()),
                "gate": gate,
                "gang_gate": gang_gate,
                "hosts": hosts,
                "password": password,
            }
        finally:
            gate.open()  # a failed test leaves no job waiting
            gang_gate.open()
            # Each host shuts down on its own, as two machines would: side by side.
            with ThreadPoolExecutor(2) as pool:
                leaving = pool.submit(
                    _run, "gpuflow", "down", "--node", GPU_NODE, env=env, on=hosts.gpu_prefix
                )
                down = _run("gpuflow", "down", env=env)
                left = leaving.result()
            assert left.returncode == 0 and down.returncode == 0, left.stderr + down.stderr


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


def _group_cmdlines(pgid: int) -> list[str]:
    """The command lines of every process in the process group ``pgid``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            cmdline = (proc / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[2]) == pgid:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
    return found


def test_the_control_plane_listens_on_its_address_and_keeps_secrets_out(box: dict) -> None:
    state, control = box["state"], box["hosts"].control
    for url in (state["prefect_api_url"], state["prefect_ui_url"], state["mlflow_url"]):
        assert url.startswith(f"http://{control}:"), url
    mlflow_port = state["mlflow_url"].rsplit(":", 1)[1]
    with urllib.request.urlopen(f"{state['mlflow_url']}/health", timeout=10) as resp:
        assert resp.status == 200
    # Bound to the control address only: nothing answers on this host's 127.0.0.1.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{mlflow_port}/health", timeout=5)  # noqa: S310
    # The GPU host's record points at the control plane, its worker owns its node.
    joined = box["joined"]
    assert joined["prefect_api_url"] == state["prefect_api_url"]
    assert joined["mlflow_url"] == state["mlflow_url"]  # saved by `up`, read by `join`
    assert [s["name"] for s in joined["services"]] == [f"worker-{GPU_NODE}", "telemetry-exporter"]
    # One telemetry exporter per host, each exporting the node it owns (the GPU host's
    # listens on its own loopback): no device is exported twice.
    exporter = next(s for s in state["services"] if s["name"] == "telemetry-exporter")
    assert exporter["url"].startswith(f"http://{control}:")
    with urllib.request.urlopen(exporter["url"], timeout=30) as resp:  # noqa: S310
        served = resp.read().decode()
    hosts_served = set(re.findall(r'^DCGM_FI_DEV_GPU_TEMP\{[^}]*Hostname="([^"]+)"', served, re.M))
    assert hosts_served == {CONTROL_NODE}

    # The MLflow store's password: in no command line of the processes either host
    # started (the servers' children included), nor in the state files.
    password = box["password"]
    services = state["services"] + joined["services"]
    assert {s["name"] for s in services} >= {"prefect-server", "mlflow-server"}
    cmdlines = [line for s in services for line in _group_cmdlines(s["pid"])]
    assert any("mlflow" in line and "server" in line for line in cmdlines), cmdlines
    assert not [line for line in cmdlines if password in line]
    for record in ("controlplane.json", f"join-{GPU_NODE}.json"):
        assert password not in (box["home"] / record).read_text()
    # Its environment holds it, and only the MLflow server's.
    holders = [s["name"] for s in services if password in _environ(s["pid"])]
    assert holders == ["mlflow-server"]


def _environ(pid: int) -> str:
    return Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")


def _flow_run_logged_by(box: dict, flow_run_id: str) -> list[str]:
    """The workers (of either host) that took the flow run, from their logs."""
    services = box["state"]["services"] + box["joined"]["services"]
    took = f"submitting flow run '{flow_run_id}'"
    return [
        s["name"]
        for s in services
        if s["name"].startswith("worker-") and took in Path(s["log"]).read_text()
    ]


def _emit_health_risk(box: dict, resource) -> None:
    """The health-risk event for ``resource``'s device, from another process, as from a
    monitor on another host (this test process's events client may already be bound to
    another server of the session)."""
    emitted = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpuflow.tasks.health.events import emit_health_risk; "
            "emit_health_risk(sys.argv[1], int(sys.argv[2]), 0.97, {'remap_pending': 1.0}, sys.argv[3]); "
            "from prefect.events.worker import EventsWorker; EventsWorker.drain_all()",
            resource.node,
            str(resource.device_index),
            resource.sku,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=box["client_env"],
        cwd=ROOT,
    )
    assert emitted.returncode == 0, emitted.stderr


def _completed_train_runs(api: str, job_id: str) -> list:
    """The job's `train` flow runs, oldest first, once all of them completed (the job is
    finished in the inventory a moment before its flow run records the end)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    def job_runs() -> list:
        with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
            found = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["train"]))
            )
        return sorted(
            (r for r in found if (r.parameters.get("spec") or {}).get("job_id") == job_id),
            key=lambda r: r.created,
        )

    return _wait(
        f"the train runs of {job_id} to complete",
        lambda: (rs := job_runs()) and all(r.state_name == "Completed" for r in rs) and rs,
        120,
    )


def _mlflow_runs(box: dict, job_id: str) -> list:
    """The job's MLflow runs in the train experiment, oldest first."""
    import mlflow

    client = mlflow.MlflowClient(box["client_env"]["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("gpuflow-train")
    return sorted(
        client.search_runs([experiment.experiment_id], f"tags.`gpuflow.job_id` = '{job_id}'"),
        key=lambda r: r.info.start_time,
    )


def _submit(box: dict, job_id: str, steps: int, interval: int, *options: str) -> None:
    """`gpuflow schedule submit` the job: llama-tiny, fp32."""
    submitted = _run(
        "gpuflow",
        "schedule",
        "submit",
        job_id,
        "--model",
        "llama-tiny",
        "--precision",
        "fp32",
        "--steps",
        str(steps),
        "--checkpoint-interval",
        str(interval),
        *options,
        env=box["client_env"],
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr


def _one_pass(box: dict) -> None:
    """One pass of the `schedule` deployment: it places the queued jobs and starts each
    through the `train` deployment on its node's work queue."""
    passed = _run(
        "prefect",
        "deployment",
        "run",
        "schedule/schedule",
        "--param",
        "passes=1",  # one pass now (the deployment's runs pass for hours)
        "--watch",
        "--watch-interval",
        "1",
        env=box["client_env"],
    )
    assert passed.returncode == 0, passed.stdout[-2000:] + passed.stderr[-2000:]


def _held_at_the_gate(inventory, gate: StepGate, job_id: str):
    """The job's record once it waits at its gate, running, with a checkpoint."""
    assert gate.wait_reached(300), f"{job_id} never reached step {gate.at_step} on a worker"
    return _wait(
        f"{job_id} to run and checkpoint",
        lambda: (j := inventory.job(job_id)).state == "running" and j.last_checkpoint_id and j,
        30,
    )


def _answer(inventory, gate: StepGate, job_id: str, at_risk) -> None:
    """Once remediation asks the job (held at its gate, surely running) for a checkpoint,
    with the device at risk cordoned first: open the gate."""
    _wait(
        f"remediation to ask {job_id} for a checkpoint",
        lambda: any(r.status == "pending" for r in inventory.control_requests(job_id)),
        180,
        0.5,
    )
    assert inventory.is_cordoned(at_risk.node, at_risk.device_index), (
        "remediation asked before it cordoned the device"
    )
    assert inventory.job(job_id).state == "running"
    gate.open()


def _finished(inventory, job_id: str, timeout_s: float):
    """The job's record once it finished."""
    return _wait(
        f"{job_id} to finish",
        lambda: (j := inventory.job(job_id)).state == "finished" and j,
        timeout_s,
        2.0,
    )


def _start_gpu_host_monitor(api: str):
    """A run of the GPU host's own monitor deployment, started once none of its runs is
    active (one at a time: a run that starts while another runs is cancelled); with a
    threshold only a lost device reaches, so it moves no job."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    name = f"monitor/node-{GPU_NODE}"
    active = [StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
    with temporary_settings({PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            dep = client.read_deployment_by_name(name)
            _wait(
                f"the scheduled runs of {name} to end",
                lambda: (
                    not client.read_flow_runs(
                        deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[dep.id])),
                        flow_run_filter=FlowRunFilter(
                            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=active))
                        ),
                    )
                ),
                150,
            )
        return run_deployment(
            name, parameters={"rounds": 1, "model_uri": "rules", "threshold": 1.0}, timeout=0
        )


@pytest.mark.timeout(900)
def test_a_job_and_a_gang_run_where_placed_and_move_to_the_other_host(
    box: dict, monkeypatch
) -> None:
    """A one-unit job (the host's A100) and a 2-rank gang (two V100s of one host), placed
    by one pass and started on the workers of their nodes. A health event on each (the
    gang's on rank 1's device, not rank 0's): `remediate`, started by the events' trigger,
    stops each at a checkpoint and relaunches it on the other host, the gang whole, two
    ranks again; each resumes at the step it stopped at and finishes."""
    _in_box(box, monkeypatch)
    from gpuflow.hardware.inventory import Inventory
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = box["client_env"]["PREFECT_API_URL"]
    watch = _start_gpu_host_monitor(api)  # checked at the end: it runs meanwhile

    # Submitted side by side, as two users would (a `gpuflow` process takes seconds to
    # start on 2 cores); one pass places both.
    job_args = (JOB, STEPS, INTERVAL, "--sku", "a100-40gb")
    # Two ranks (one per V100), each with its half of a global batch of 2.
    gang_args = (GANG, GANG_STEPS, GANG_INTERVAL, "--count", "2", "--sku", "v100")
    gang_args += ("--batch-size", "2")
    with ThreadPoolExecutor(2) as pool:
        for submitted in [pool.submit(_submit, box, *a) for a in (job_args, gang_args)]:
            submitted.result()
    _one_pass(box)

    inventory = Inventory()
    job = _held_at_the_gate(inventory, box["gate"], JOB)
    gang = _held_at_the_gate(inventory, box["gang_gate"], GANG)
    placed = inventory.resource(job.resource_ids[0])
    units = [inventory.resource(r) for r in gang.resource_ids]
    assert len(units) == 2 and len({u.node for u in units}) == 1
    at_risk = units[1]  # not rank 0's device: the whole gang moves all the same
    with ThreadPoolExecutor(2) as pool:  # two monitors' events, each from its own process
        for emitted in [pool.submit(_emit_health_risk, box, r) for r in (placed, at_risk)]:
            emitted.result()
    _answer(inventory, box["gate"], JOB, placed)
    _answer(inventory, box["gang_gate"], GANG, at_risk)
    done = _finished(inventory, JOB, 600)
    gang_done = _finished(inventory, GANG, 420)

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        remediations = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["remediate"]))
        )
    assert len(remediations) == 2 and {r.state_name for r in remediations} == {"Completed"}
    _moved_with_no_step_lost(box, inventory, JOB, placed.node, HOLD_AT, STEPS, done)
    first, second = _moved_with_no_step_lost(
        box, inventory, GANG, at_risk.node, GANG_HOLD_AT, GANG_STEPS, gang_done
    )
    other = _other(at_risk.node)
    moved_to = second.data.tags["gpuflow.resource_ids"].split(",")
    assert first.data.tags["gpuflow.resource_ids"].split(",") == [u.resource_id for u in units]
    assert len(moved_to) == 2 and {inventory.resource(r).node for r in moved_to} == {other}
    for run in (first, second):
        assert run.data.params["world_size"] == "2" and run.data.params["backend"] == "gloo"
    assert list(gang_done.resource_ids) == moved_to and inventory.leases(owner=GANG) == []

    # The GPU host's monitor ran on its worker and watched its node only.
    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        watched = _wait(
            "the GPU host's monitor run to end",
            lambda: (r := client.read_flow_run(watch.id)).state.is_final() and r,
            120,
        )
        risks = client.read_artifacts(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[watch.id]))
        )
    assert watched.state_name == "Completed" and watched.work_queue_name == f"node-{GPU_NODE}"
    assert _flow_run_logged_by(box, str(watch.id)) == [f"worker-{GPU_NODE}"]
    (table,) = [a for a in risks if a.key == "monitor-risks"]
    rows = json.loads(table.data) if isinstance(table.data, str) else table.data
    assert [row["device"] for row in rows] == [f"{GPU_NODE}:{i}" for i in range(3)]


def _other(node: str) -> str:
    return GPU_NODE if node == CONTROL_NODE else CONTROL_NODE


def _moved_with_no_step_lost(
    box: dict, inventory, job_id: str, node: str, hold_at: int, steps: int, done
) -> tuple:
    """The job's two train runs: the first on ``node``'s worker, stopped where it was held
    (its checkpoint), the second on the other host's worker, resumed there, finished.
    Returns their MLflow runs."""
    other = _other(node)
    runs = _completed_train_runs(box["client_env"]["PREFECT_API_URL"], job_id)
    assert [r.work_queue_name for r in runs] == [f"node-{node}", f"node-{other}"]
    assert [_flow_run_logged_by(box, str(r.id)) for r in runs] == [
        [f"worker-{node}"],
        [f"worker-{other}"],
    ]
    first, second = _mlflow_runs(box, job_id)
    assert [r.data.tags["gpuflow.node"] for r in (first, second)] == [node, other]
    acked = [r for r in inventory.control_requests(job_id) if r.checkpoint_id]
    assert acked, f"{job_id} never acknowledged a checkpoint request"
    stopped_at = int(acked[0].checkpoint_id.split("-")[1])
    assert stopped_at == hold_at  # it answered right where it was held
    assert first.data.metrics["steps_done"] == stopped_at  # it stopped at its checkpoint
    assert second.data.metrics["resumed_from_step"] == stopped_at  # zero steps lost
    assert second.data.metrics["steps_done"] == steps
    assert done.last_checkpoint_id.endswith(str(steps))
    return first, second
