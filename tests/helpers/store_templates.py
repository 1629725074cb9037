"""Empty, migrated Prefect and MLflow databases, built once per machine and version, and
copied where a test is about to start a new store.

A new SQLite database spends its first seconds running the same migrations every time:
Prefect's ~200 (about 20 s on a 2-core VM, before its server answers), MLflow's (about
2.5 s, at the first call to a new tracking store). The suite starts dozens of new stores.
A copy of the migrated file takes milliseconds, and the server or client then finds its
schema current, as on the second start of a real store. Each template is built by the
project's own tools (`prefect server database upgrade`; an MlflowClient's first call, from
the suite's working directory as before, so MLflow's Default experiment points where it
did), once, under a lock the test processes share.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import pytest

_FOLDER = Path(tempfile.gettempdir()) / "gpuflow-test-templates"


def _template(name: str, argv: Callable[[Path], list[str]], env: Callable[[Path], dict]) -> Path:
    _FOLDER.mkdir(exist_ok=True)
    path = _FOLDER / f"{name}-{version(name)}.db"
    with open(_FOLDER / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process waits for the one build
        if not path.exists():
            building = Path(tempfile.mkdtemp(dir=_FOLDER))
            db = building / "store.db"
            done = subprocess.run(
                argv(db),
                env={**os.environ, **env(building)} | {"PREFECT_HOME": str(building)},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0 and db.exists(), done.stdout[-2000:] + done.stderr[-2000:]
            os.replace(db, path)  # whole, or not there
            shutil.rmtree(building, ignore_errors=True)
    return path


def prefect_template() -> Path:
    """The migrated, empty Prefect database of this Prefect version."""
    return _template(
        "prefect",
        lambda db: [
            str(Path(sys.executable).with_name("prefect")),
            "server",
            "database",
            "upgrade",
            "-y",
        ],
        lambda home: {
            "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'store.db'}"
        },
    )


def mlflow_template() -> Path:
    """The migrated, empty MLflow tracking database of this MLflow version."""
    return _template(
        "mlflow",
        lambda db: [
            sys.executable,
            "-c",
            "import sys; from mlflow.tracking import MlflowClient; "
            "MlflowClient(sys.argv[1]).search_experiments()",
            f"sqlite:///{db}",
        ],
        lambda home: {},
    )


def seed(database: Path, template: Callable[[], Path] = prefect_template) -> Path:
    """Put a migrated empty database at ``database`` (a new store: nothing is there)."""
    assert not database.exists(), f"{database} exists: seed only a new store"
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template(), database)
    return database


@pytest.fixture(autouse=True)  # imported by the conftest.py of the folders that use it
def mlflow_store_migrated(gpuflow_home: Path) -> Path:
    """The test's MLflow store (GPUFLOW_HOME/mlflow/mlflow.db, tasks/tracking.py) starts
    migrated and empty, as a copy (tests/helpers/store_templates.py)."""
    return seed(gpuflow_home / "mlflow" / "mlflow.db", mlflow_template)
