"""The platform as a user runs it: the tour (`gpuflow demo --quick`) into a fresh
GPUFLOW_HOME, `gpuflow up` on it, deployments run by workers, the Prefect and MLflow UIs
(the tour's runs among them) checked in a real (headless) browser, then `gpuflow down`
leaving nothing.

One control plane serves the whole module (starting one takes most of a minute).
Screenshots are kept under test-artifacts/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuflow import controlplane
from tests.helpers.precision import cpu_reduced_policy
from tests.helpers.store_templates import seed
from tests.helpers.workers import FAST_WORKERS, pause_schedules

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).parents[2]
SHOTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _gpuflow(
    *args: str, env: dict[str, str], timeout: int = 600
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("gpuflow")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def _prefect(
    *args: str, env: dict[str, str], timeout: int = 300
) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("prefect")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _group_members(pgids: set[int]) -> list[str]:
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in pgids and fields[0] != "Z":
            out.append(f"{proc.name}: {stat[:80]}")
    return out


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    home = tmp_path_factory.mktemp("plane-home")
    env = {**os.environ, "GPUFLOW_HOME": str(home), "GPUFLOW_BACKEND": "sim", **FAST_WORKERS}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    # The tour first, with no control plane up: it records into the stores `up` serves
    # (Prefect's database migrated once per machine, not per test).
    seed(controlplane.local_stores(home).prefect_database)
    tour = _gpuflow("demo", "--quick", env=env, timeout=900)
    assert tour.returncode == 0, tour.stdout[-3000:] + tour.stderr[-3000:]
    up = _gpuflow(
        "up", "--prefect-port", "0", "--mlflow-port", "0", "--exporter-port", "0", env=env,
        timeout=900,
    )  # fmt: skip
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    state = json.loads((home / "controlplane.json").read_text())
    paused = pause_schedules(state["prefect_api_url"])
    client_env = {
        **env,
        "PREFECT_API_URL": state["prefect_api_url"],
        "MLFLOW_TRACKING_URI": state["mlflow_url"],
    }
    try:
        yield {
            "home": home,
            "state": state,
            "env": env,
            "client_env": client_env,
            "tour": tour.stdout + tour.stderr,
            "paused": paused,
        }
    finally:
        _gpuflow("down", env=env)  # a no-op when the last test already stopped it


@pytest.mark.timeout(600)
def test_up_serves_and_applies_every_deployment(plane: dict) -> None:
    state = plane["state"]
    for url in (state["prefect_api_url"] + "/health", state["mlflow_url"] + "/health"):
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
    listed = _prefect("deployment", "ls", env=plane["client_env"]).stdout
    for name in (
        "partition",
        "inventory",
        "train",
        "compare_precision",
        "health_train",
        "monitor",
        "remediate",
        "reconcile",
        "schedule",
        "edge_deploy",
    ):
        assert name in listed, f"deployment {name} missing:\n{listed}"
    # `up` turned on the schedules prefect.yaml gives (the fixture turned them off again).
    scheduled = ["dvfs", "edge_supervise", "inventory", "monitor", "reconcile", "schedule"]
    assert plane["paused"] == scheduled
    again = _gpuflow("up", "--prefect-port", "0", "--mlflow-port", "0", env=plane["env"])
    assert again.returncode == 2 and "already up" in again.stderr
    # The host's telemetry exporter: every twin device, in DCGM's names, URL recorded.
    exporter = next(s for s in state["services"] if s["name"] == "telemetry-exporter")
    with urllib.request.urlopen(exporter["url"], timeout=30) as resp:
        served = resp.read().decode()
    assert served.count("\nDCGM_FI_DEV_GPU_TEMP{") == 18 and "gpuflow_health_risk{" in served


@pytest.mark.timeout(600)
def test_a_worker_runs_a_deployment(plane: dict) -> None:
    ran = _prefect("deployment", "run", "partition/partition", "--watch", env=plane["client_env"])
    assert ran.returncode == 0 and "Completed" in ran.stdout, (
        ran.stdout[-2000:] + ran.stderr[-2000:]
    )


def _browser():
    from playwright.sync_api import sync_playwright

    pw = sync_playwright().start()
    browser = pw.chromium.launch(
        executable_path=CHROMIUM,
        args=[
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    )
    return pw, browser


def _flow_runs(env: dict[str, str], flow_name: str) -> list:
    """Every run of the flow ``flow_name`` on the control plane of ``env``."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            return client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name]))
            )


def _show_flow_run(plane: dict, run, flow_name: str, artifact_key: str, shot: str) -> str:
    """The run's page in the Prefect UI (its name, Completed, its flow), then its Artifacts
    tab showing ``artifact_key``; returns the text of that tab. Screenshots: shot-*.png."""
    SHOTS.mkdir(exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{plane['state']['prefect_ui_url']}/runs/flow-run/{run.id}")
        page.get_by_text(run.name).first.wait_for(timeout=60_000)
        page.get_by_text("Completed").first.wait_for(timeout=60_000)
        page.get_by_text(flow_name).first.wait_for(timeout=60_000)
        page.screenshot(path=str(SHOTS / f"{shot}-run.png"), full_page=True)
        page.get_by_text("Artifacts", exact=True).first.click()
        page.get_by_text(artifact_key).first.wait_for(timeout=60_000)
        page.screenshot(path=str(SHOTS / f"{shot}-artifact.png"), full_page=True)
        return page.inner_text("body")
    finally:
        browser.close()
        pw.stop()


def _show_comparison(mlflow_url: str, parent_run_id: str, shot: str) -> str:
    """MLflow's compare view of a precision comparison's child runs; returns its text."""
    import mlflow

    client = mlflow.MlflowClient(mlflow_url)
    experiment = client.get_experiment_by_name("gpuflow-compare-precision")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent_run_id}'"
    )
    assert len(children) >= 2, f"no fp32 and candidate runs under {parent_run_id}"
    ids = json.dumps([r.info.run_id for r in children])
    url = f"{mlflow_url}/#/compare-runs?runs={ids}&experiments={json.dumps([experiment.experiment_id])}"
    SHOTS.mkdir(exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(url)
        page.get_by_text("convergence_delta").first.wait_for(timeout=60_000)
        page.screenshot(path=str(SHOTS / f"{shot}.png"), full_page=True)
        return page.inner_text("body")
    finally:
        browser.close()
        pw.stop()


NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: `make test` installs Debian's chromium where it can (root + apt-get)",
)


@pytest.mark.timeout(600)
@NEEDS_CHROMIUM
def test_prefect_ui_shows_the_remediation_run_and_its_artifact(plane: dict) -> None:
    env = plane["client_env"]
    ran = _prefect(
        "deployment",
        "run",
        "remediate/remediate",
        "--param",
        "device=a100-1:0",
        "--param",
        "reason=browser check",
        "--watch",
        env=env,
    )
    assert ran.returncode == 0 and "Completed" in ran.stdout, (
        ran.stdout[-2000:] + ran.stderr[-2000:]
    )
    # The deployment's run (the tour's remediate run, called in-process, has none).
    runs = [r for r in _flow_runs(env, "remediate") if r.deployment_id is not None]
    assert runs, "no remediate flow run on the server"
    # The artifact card: its key and its description (the notification subject).
    shown = _show_flow_run(plane, runs[0], "remediate", "remediation-a100-1-0", "prefect-remediate")
    assert "a100-1:0 (NVIDIA A100-SXM4-40GB) done" in shown


@pytest.mark.timeout(600)
@NEEDS_CHROMIUM
def test_mlflow_compare_view_shows_speedup_and_convergence_delta(plane: dict) -> None:
    env = plane["client_env"]
    done = _gpuflow(
        "compare-precision",
        "--model",
        "llama-tiny",
        "--steps",
        "4",
        "--candidate",
        cpu_reduced_policy(),  # bf16 where the CPU has it natively, else fp16
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    parent = done.stdout.split("MLflow parent run:")[1].split()[0]
    body = _show_comparison(env["MLFLOW_TRACKING_URI"], parent, "mlflow-compare-precision")
    assert "speedup" in body and "convergence_delta" in body


# A traceback, a log line at WARNING or ERROR (Prefect's, MLflow's), a Python warning.
NOISE = re.compile(r"Traceback|\bWARNING\b|\bERROR\b|\w+Warning: ")


@pytest.mark.timeout(600)
@NEEDS_CHROMIUM
def test_the_tour_ran_quietly_and_up_shows_its_runs(plane: dict) -> None:
    """The tour ran before `up` (the fixture): its flow runs, artifacts and MLflow runs
    are in the stores `up` serves, in both UIs."""
    from gpuflow.tasks.health.events import parse_resource_id
    from gpuflow.tasks.remediation.notify import artifact_key

    assert not NOISE.findall(plane["tour"]), plane["tour"][-4000:]
    env = plane["client_env"]
    tour_compare = [
        r
        for r in _flow_runs(env, "compare_precision")
        if r.parameters.get("spec", {}).get("job_id") == "tour-compare"
    ]
    assert len(tour_compare) == 1, "the tour's compare_precision run is not on the server"
    _show_flow_run(
        plane, tour_compare[0], "compare_precision", "precision-comparison", "prefect-tour-compare"
    )
    tour_remediate = [
        r for r in _flow_runs(env, "remediate") if r.parameters.get("trigger") == "predicted"
    ]
    assert len(tour_remediate) == 1, "the tour's remediate run is not on the server"
    run = tour_remediate[0]
    node, index = parse_resource_id(run.parameters["resource_id"])
    shown = _show_flow_run(
        plane, run, "remediate", artifact_key(f"{node}:{index}"), "prefect-tour-remediate"
    )
    assert f"{node}:{index}" in shown and "done" in shown

    import mlflow

    mlflow_url = env["MLFLOW_TRACKING_URI"]
    client = mlflow.MlflowClient(mlflow_url)
    experiment = client.get_experiment_by_name("gpuflow-compare-precision")
    (parent,) = client.search_runs(
        [experiment.experiment_id], "attributes.run_name = 'tour-compare-compare'"
    )
    # Its artifacts live beside the store `up` serves, not in the tour's own (wiped) home.
    assert parent.info.artifact_uri.startswith((plane["home"] / "mlflow" / "artifacts").as_uri())
    listed = f"{mlflow_url}/ajax-api/2.0/mlflow/artifacts/list?run_id={parent.info.run_id}"
    with urllib.request.urlopen(listed, timeout=30) as resp:
        files = [f["path"] for f in json.load(resp).get("files", [])]
    assert "comparison.json" in files
    body = _show_comparison(mlflow_url, parent.info.run_id, "mlflow-tour-compare")
    assert "speedup" in body and "convergence_delta" in body


def _tour_health_line(tour: str) -> str:
    """The tour's predicted-fault panel from "health model:" to "top features:", panel
    borders and line wraps removed."""
    flat = " ".join(line.strip(" │|") for line in tour.splitlines())
    found = re.search(r"health model: (.*?)top features:", flat)
    assert found, tour[-4000:]
    return " ".join(found.group(1).split())


def _tour_champion(tour: str) -> str:
    """The fault panel's model that decided (before its risk; the challenger follows)."""
    return _tour_health_line(tour).split(" risk: ")[0]


def test_the_tours_fault_says_what_decided(plane: dict) -> None:
    """The tour's predicted fault names the model that decided, its risk and the rule."""
    line = _tour_health_line(plane["tour"])
    assert re.search(r"risk: [0-9.]+", line), line
    assert re.search(r"decision: [\w-]+ \((drain level|cost rule|device \w+)", line), line


def test_the_tour_trains_the_champion_its_monitor_runs(plane: dict) -> None:
    """health_train ran in the tour, registered the cheapest candidate on validation, and
    the predicted fault was decided by that registered champion, not by the rules that a
    fresh home falls back on."""
    flat = " ".join(line.strip(" │|") for line in plane["tour"].splitlines())
    figures = re.search(r"validation net GPU-h saved / 1,000 device-days: (.*?) validation", flat)
    assert figures, plane["tour"][-4000:]
    ranked = re.findall(r"(rules|gbt|lstm) ([+-]\d+) \((\d+h)\)", figures.group(1))
    assert {m for m, _, _ in ranked} == {"rules", "gbt", "lstm"}, figures.group(1)
    saved = [int(v) for _, v, _ in ranked]
    assert saved == sorted(saved, reverse=True)  # best first: the first is the champion
    assert re.search(rf"champion: {ranked[0][0]} decided by: {ranked[0][0]} within", flat)
    line = _tour_champion(plane["tour"])
    assert line.startswith(f"champion by cost: {ranked[0][0]} P(fail within"), line
    # its own name: the tour leaves the platform's gpuflow-health@champion alone
    assert re.search(r"\[models:/gpuflow-health-tour@champion v\d+\]$", line), line
    # The runner-up on validation, of another kind, watched the same fault in shadow,
    # and the panel says whether it would have acted, at which risk and level.
    shadow = re.search(
        r"challenger \(in shadow\): (.*?) decision:", _tour_health_line(plane["tour"])
    )
    assert shadow, _tour_health_line(plane["tour"])
    assert re.match(
        rf"{ranked[1][0]} P\(fail within \d+h\) \[models:/gpuflow-health-tour@challenger v\d+\]: "
        r"would (not have acted by then|have acted) .*risk [0-9.]+",
        shadow.group(1),
    ), shadow.group(1)
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = plane["client_env"]["MLFLOW_TRACKING_URI"]
    client = mlflow.MlflowClient(uri, registry_uri=uri)
    registered = client.get_model_version_by_alias("gpuflow-health-tour", "champion")
    assert registered.tags["champion"] == ranked[0][0]
    challenger = client.get_model_version_by_alias("gpuflow-health-tour", "challenger")
    assert challenger.tags["challenger"] == ranked[1][0]
    with pytest.raises(MlflowException):
        client.get_model_version_by_alias("gpuflow-health", "champion")


@pytest.mark.xfail(
    strict=True,
    reason="issue 15, Done-when 3 holds for `make demo` (the full tour trains on the "
    "production fleet at its real fault rate, where the trees win on validation), not for "
    "the quick tour run here: on its small raised-hazard history the rules win on "
    "validation cost (+196 GPU-h per 1,000 device-days against -155 for the trees and -783 "
    "for the LSTM), so they decide; docs/health.md, 'At the fleet's real fault rate'",
)
def test_the_tours_fault_is_decided_by_a_learned_model(plane: dict) -> None:
    line = _tour_champion(plane["tour"])
    assert "champion by cost" in line and re.search(r"\b(lstm|gbt)\b", line, re.I), line


@pytest.mark.timeout(300)
def test_down_stops_everything_up_started(plane: dict) -> None:
    pgids = {s["pid"] for s in plane["state"]["services"]}
    assert len(pgids) == 4  # Prefect server, MLflow server, one worker, telemetry exporter
    down = _gpuflow("down", env=plane["env"])
    assert down.returncode == 0, down.stderr
    assert _group_members(pgids) == []
    assert not (plane["home"] / "controlplane.json").exists()
    assert "nothing to stop" in _gpuflow("down", env=plane["env"]).stdout
