"""The platform as a user runs it: `gpuflow up`, deployments run by workers, the Prefect
and MLflow UIs checked in a real (headless) browser, then `gpuflow down` leaving nothing.

One control plane serves the whole module (starting one takes most of a minute).
Screenshots are kept under test-artifacts/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
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
    env = {**os.environ, "GPUFLOW_HOME": str(home), "GPUFLOW_BACKEND": "sim"}
    for key in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI"):
        env.pop(key, None)
    up = _gpuflow("up", "--prefect-port", "0", "--mlflow-port", "0", env=env, timeout=900)
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    state = json.loads((home / "controlplane.json").read_text())
    client_env = {
        **env,
        "PREFECT_API_URL": state["prefect_api_url"],
        "MLFLOW_TRACKING_URI": state["mlflow_url"],
    }
    try:
        yield {"home": home, "state": state, "env": env, "client_env": client_env}
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
        "schedule",
        "edge_deploy",
    ):
        assert name in listed, f"deployment {name} missing:\n{listed}"
    again = _gpuflow("up", "--prefect-port", "0", "--mlflow-port", "0", env=plane["env"])
    assert again.returncode == 2 and "already up" in again.stderr


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


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: `make test` installs Debian's chromium where it can (root + apt-get)",
)
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
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["remediate"]))
            )
    assert runs, "no remediate flow run on the server"
    run = runs[0]
    SHOTS.mkdir(exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(f"{plane['state']['prefect_ui_url']}/runs/flow-run/{run.id}")
        page.get_by_text(run.name).first.wait_for(timeout=60_000)
        page.get_by_text("Completed").first.wait_for(timeout=60_000)
        page.get_by_text("remediate").first.wait_for(timeout=60_000)  # flow and deployment
        page.screenshot(path=str(SHOTS / "prefect-remediate-run.png"), full_page=True)
        page.get_by_text("Artifacts", exact=True).first.click()
        # The artifact card: its key and its description (the notification subject).
        page.get_by_text("remediation-a100-1-0").first.wait_for(timeout=60_000)
        assert "a100-1:0 (NVIDIA A100-SXM4-40GB) done" in page.inner_text("body")
        page.screenshot(path=str(SHOTS / "prefect-remediate-artifact.png"), full_page=True)
    finally:
        browser.close()
        pw.stop()


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium: `make test` installs Debian's chromium where it can (root + apt-get)",
)
def test_mlflow_compare_view_shows_speedup_and_convergence_delta(plane: dict) -> None:
    env = plane["client_env"]
    done = _gpuflow(
        "compare-precision",
        "--model",
        "llama-tiny",
        "--steps",
        "12",
        "--candidate",
        "bf16",
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    parent = done.stdout.split("MLflow parent run:")[1].split()[0]
    import mlflow

    client = mlflow.MlflowClient(env["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("gpuflow-compare-precision")
    children = client.search_runs(
        [experiment.experiment_id], f"tags.mlflow.parentRunId = '{parent}'"
    )
    ids = json.dumps([r.info.run_id for r in children])
    url = f"{env['MLFLOW_TRACKING_URI']}/#/compare-runs?runs={ids}&experiments={json.dumps([experiment.experiment_id])}"
    SHOTS.mkdir(exist_ok=True)
    pw, browser = _browser()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1600})
        page.goto(url)
        page.get_by_text("convergence_delta").first.wait_for(timeout=60_000)
        body = page.inner_text("body")
        assert "speedup" in body and "convergence_delta" in body
        page.screenshot(path=str(SHOTS / "mlflow-compare-precision.png"), full_page=True)
    finally:
        browser.close()
        pw.stop()


@pytest.mark.timeout(300)
def test_down_stops_everything_up_started(plane: dict) -> None:
    pgids = {s["pid"] for s in plane["state"]["services"]}
    assert len(pgids) == 3  # Prefect server, MLflow server, one worker
    down = _gpuflow("down", env=plane["env"])
    assert down.returncode == 0, down.stderr
    assert _group_members(pgids) == []
    assert not (plane["home"] / "controlplane.json").exists()
    assert "nothing to stop" in _gpuflow("down", env=plane["env"]).stdout
