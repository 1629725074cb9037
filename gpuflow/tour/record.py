"""Where the tour runs and where it records.

It runs in its own GPUFLOW_HOME (``<home>/tour``, fresh each time) so it never disturbs a
twin, inventory or job of yours; it records into the Prefect database and MLflow store
that `gpuflow up` serves for your GPUFLOW_HOME (``controlplane.recording_env``), so its
flow runs, artifacts and MLflow runs are still there when you start the control plane.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpuflow import controlplane


@dataclass(frozen=True)
class Recording:
    home: Path  # the tour's own GPUFLOW_HOME
    prefect: str  # where its flow runs go: the running Prefect API, or its database
    mlflow: str  # where its MLflow runs go: the running server, or its store
    plane: controlplane.ControlPlane | None  # the control plane it records through, if up
    prefect_ui_url: str  # where to look: the running UIs, or those `gpuflow up` starts
    mlflow_url: str


def _set_env(values: dict[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if "prefect.context" in sys.modules:
        # Prefect reads its settings once, at import; a process that imported it already
        # (a test, an embedding program) has to be told.
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def _tour_experiments(tracking_uri: str, artifacts_uri: str) -> None:
    """The tour's MLflow experiments, with their artifacts in the persistent store.

    tasks/tracking.py gives an experiment it creates an artifact folder under the current
    GPUFLOW_HOME, which for the tour is wiped on the next run; created here first, they
    keep their artifacts beside the store `gpuflow up` serves.
    """
    from mlflow.tracking import MlflowClient

    from gpuflow.flows.compare_precision import EXPERIMENT as COMPARE
    from gpuflow.flows.edge_deploy import EXPERIMENT as EDGE
    from gpuflow.tasks.training.job import EXPERIMENT as TRAIN  # the remediated job's runs

    client = MlflowClient(tracking_uri)
    for name in (COMPARE, TRAIN, EDGE):
        if client.get_experiment_by_name(name) is None:
            client.create_experiment(name, artifact_location=artifacts_uri)


@contextmanager
def recording(user_home: Path) -> Iterator[Recording]:
    """Inside: GPUFLOW_HOME is a fresh ``<user_home>/tour`` and Prefect and MLflow record
    where `gpuflow up` on ``user_home`` serves from; the environment is restored after."""
    home = user_home / "tour"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env, plane = controlplane.recording_env(user_home)
    # DO_NOT_TRACK: no first-run telemetry notice from the Prefect client in a terminal.
    env = env | {"GPUFLOW_HOME": str(home), "DO_NOT_TRACK": "1"}
    previous = {key: os.environ.get(key) for key in env}
    _set_env(env)
    try:
        if plane is not None:
            rec = Recording(
                home=home,
                prefect=plane.prefect_api_url,
                mlflow=plane.mlflow_url,
                plane=plane,
                prefect_ui_url=plane.prefect_ui_url,
                mlflow_url=plane.mlflow_url,
            )
        else:
            stores = controlplane.local_stores(user_home)
            stores.mlflow_dir.mkdir(parents=True, exist_ok=True)
            _tour_experiments(stores.mlflow_backend_uri, stores.mlflow_artifacts_uri)
            urls = controlplane.local_urls()  # the ports `gpuflow up` starts on by default
            rec = Recording(
                home=home,
                prefect=str(stores.prefect_database),
                mlflow=str(stores.mlflow_database),
                plane=None,
                prefect_ui_url=urls["prefect_ui_url"],
                mlflow_url=urls["mlflow_url"],
            )
        yield rec
    finally:
        _set_env(previous)
