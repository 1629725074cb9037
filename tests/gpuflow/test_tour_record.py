"""Where the tour records (gpuflow/tour/record.py): the stores `gpuflow up` serves for the
user's GPUFLOW_HOME, or the control plane that is up; the environment restored after."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from gpuflow import controlplane, controlplane_procs
from gpuflow.tour.record import recording
from gpuflow.tour.summary import where_to_look


def test_without_a_control_plane_the_tour_records_into_the_stores_up_serves(
    gpuflow_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")  # from an earlier `up`
    monkeypatch.delenv("PREFECT_HOME", raising=False)
    (gpuflow_home / "tour").mkdir()
    (gpuflow_home / "tour" / "left-over").write_text("from the last tour")
    stores = controlplane.local_stores(gpuflow_home)

    with recording(gpuflow_home) as rec:
        assert rec.home == gpuflow_home / "tour" and not (rec.home / "left-over").exists()
        assert os.environ["GPUFLOW_HOME"] == str(rec.home)
        assert "PREFECT_API_URL" not in os.environ  # Prefect starts a temporary server...
        assert os.environ["PREFECT_HOME"] == str(stores.prefect_home)
        assert os.environ["PREFECT_API_DATABASE_CONNECTION_URL"] == stores.prefect_database_url
        assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
        assert os.environ["MLFLOW_TRACKING_URI"] == stores.mlflow_backend_uri  # ...on this
        from prefect.context import GLOBAL_SETTINGS_CONTEXT  # read after the refresh

        assert GLOBAL_SETTINGS_CONTEXT.settings.home == stores.prefect_home
        assert GLOBAL_SETTINGS_CONTEXT.settings.api.url is None
        assert rec.plane is None
        assert (rec.prefect_ui_url, rec.mlflow_url) == (
            "http://127.0.0.1:4200",
            "http://127.0.0.1:5000",
        )
        looked = where_to_look(rec)
        assert "`gpuflow up` serves them" in looked and "http://127.0.0.1:4200" in looked

    assert os.environ["GPUFLOW_HOME"] == str(gpuflow_home)
    assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:9/api"
    assert "PREFECT_HOME" not in os.environ and "MLFLOW_TRACKING_URI" not in os.environ
    # The tour's experiments keep their artifacts beside the store, not in <home>/tour.
    client = MlflowClient(stores.mlflow_backend_uri)
    for name in ("gpuflow-compare-precision", "gpuflow-train", "edge"):
        experiment = client.get_experiment_by_name(name)
        assert experiment is not None, name
        assert experiment.artifact_location == stores.mlflow_artifacts_uri


@pytest.fixture
def running_plane(gpuflow_home: Path) -> Iterator[controlplane.ControlPlane]:
    """A control plane recorded as up: its "servers" are a process this test controls."""
    proc = subprocess.Popen(["sleep", "120"])  # noqa: S607 - coreutils, no input
    try:
        ticks, _state = controlplane_procs.proc_start(proc.pid) or (None, "")
        plane = controlplane.ControlPlane(
            home=str(gpuflow_home),
            project_dir=str(gpuflow_home),
            pool=controlplane.POOL,
            services=[
                controlplane.Service(name, proc.pid, ["sleep"], "-", start_ticks=ticks)
                for name in ("prefect-server", "mlflow-server")
            ],
            **controlplane.local_urls(4321, 4322),
        )
        controlplane.state_path(gpuflow_home).write_text(json.dumps(plane.to_dict()))
        yield plane
    finally:
        proc.kill()
        proc.wait()


def test_with_a_control_plane_up_the_tour_records_through_it(
    gpuflow_home: Path, running_plane: controlplane.ControlPlane
) -> None:
    with recording(gpuflow_home) as rec:
        assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:4321/api"
        assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:4322"
        assert os.environ["GPUFLOW_HOME"] == str(gpuflow_home / "tour")  # never the plane's
        assert rec.plane is not None and rec.prefect == "http://127.0.0.1:4321/api"
        looked = where_to_look(rec)
        assert "http://127.0.0.1:4321" in looked and "http://127.0.0.1:4322" in looked
    # Nothing was written to the local store (new and empty: MLflow's Default experiment
    # only): the plane's server owns the experiments.
    from mlflow.tracking import MlflowClient

    local = MlflowClient(f"sqlite:///{gpuflow_home / 'mlflow' / 'mlflow.db'}")
    assert [e.name for e in local.search_experiments()] == ["Default"]


def test_a_plane_whose_servers_are_gone_is_not_recorded_through(
    gpuflow_home: Path, running_plane: controlplane.ControlPlane
) -> None:
    os.kill(running_plane.services[0].pid, 9)
    os.waitpid(running_plane.services[0].pid, 0)
    env, plane = controlplane.recording_env(gpuflow_home)
    assert plane is None and env["PREFECT_API_URL"] is None
    assert env["MLFLOW_TRACKING_URI"] == controlplane.local_stores(gpuflow_home).mlflow_backend_uri
