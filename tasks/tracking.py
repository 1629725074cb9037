"""MLflow: where runs are recorded, one way to open, tag, log and close a run, and a cheap
per-step metrics logger.

The store defaults to SQLite under GPUFLOW_HOME (artifacts beside it); MLFLOW_TRACKING_URI
points it at a tracking server instead. One experiment per capability (DESIGN.md §3).

Every flow records its runs through the plain functions here (tests call them without
Prefect, and this module does not import it); each capability's ``recording`` module wraps
them in Prefect tasks, so the bookkeeping shows in the Prefect UI and is retried where a
retry is harmless.
"""

from __future__ import annotations

import logging
import numbers
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import mlflow
from gpuflow.hardware.home import gpuflow_home
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)

# MLflow's limits on one log_batch call.
_MAX_PARAMS_OR_TAGS = 100
_MAX_METRICS = 1000
END_STATUSES = ("FINISHED", "FAILED", "KILLED")


def tracking_uri() -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    store = gpuflow_home() / "mlflow"
    store.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{store / 'mlflow.db'}"


def use_experiment(name: str) -> str:
    """Point mlflow at gpuflow's store and experiment ``name``; return its id."""
    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    artifacts = None
    if uri.startswith("sqlite:"):
        artifacts = (gpuflow_home() / "mlflow" / "artifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifacts)
    except MlflowException as exc:
        # Two runs starting at once on a fresh store (two jobs one pass placed) both find
        # no experiment; the one that creates it second gets RESOURCE_ALREADY_EXISTS and
        # uses the one the first made.
        exp = client.get_experiment_by_name(name)
        if exp is None or exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        return exp.experiment_id


def tracking_client() -> MlflowClient:
    """A client on gpuflow's store (not mlflow's process-wide default)."""
    return MlflowClient(tracking_uri())


def open_run(
    experiment: str,
    run_name: str,
    tags: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
) -> str:
    """Create a RUNNING run in ``experiment`` with ``tags`` and ``params``; return its id.

    ``parent_run_id`` nests it under that run (MLflow's ``mlflow.parentRunId`` tag), which
    must exist. Values are logged as strings; None means "not set" and is skipped.
    """
    if not isinstance(experiment, str) or not experiment:
        raise ValueError(f"experiment must be a non-empty string, got {experiment!r}")
    if not isinstance(run_name, str) or not run_name:
        raise ValueError(f"run_name must be a non-empty string, got {run_name!r}")
    client = tracking_client()
    run_tags = flat_params("", tags or {})
    if parent_run_id:
        try:
            client.get_run(parent_run_id)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise ValueError(
                f"parent run {parent_run_id!r} not found in {tracking_uri()}: {exc.message}"
            ) from None
        run_tags["mlflow.parentRunId"] = parent_run_id
    experiment_id = use_experiment(experiment)
    run_id = client.create_run(experiment_id, run_name=run_name, tags=run_tags).info.run_id
    with fail_on_error(run_id):  # a run whose params could not be logged is not left RUNNING
        log_params(run_id, params or {})
    return run_id


def log_params(run_id: str, params: dict[str, Any]) -> None:
    """Log ``params`` as strings in batches (None skipped)."""
    items = [Param(k, v) for k, v in flat_params("", params).items()]
    client = tracking_client()
    for i in range(0, len(items), _MAX_PARAMS_OR_TAGS):
        client.log_batch(run_id, params=items[i : i + _MAX_PARAMS_OR_TAGS])


def log_tags(run_id: str, tags: dict[str, Any]) -> None:
    """Set ``tags`` as strings in batches (None skipped); setting a tag again overwrites it."""
    items = [RunTag(k, v) for k, v in flat_params("", tags).items()]
    client = tracking_client()
    for i in range(0, len(items), _MAX_PARAMS_OR_TAGS):
        client.log_batch(run_id, tags=items[i : i + _MAX_PARAMS_OR_TAGS])


def log_metrics(run_id: str, metrics: dict[str, float | int | None], step: int = 0) -> None:
    """Log ``metrics`` at ``step`` in batches, skipping None; every value must be a number
    (checked for all of them before any is sent)."""
    ts = int(time.time() * 1000)
    items = []
    for key, value in metrics.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"metric {key!r} must be a number, got {value!r}")
        items.append(Metric(key, float(value), ts, step))
    client = tracking_client()
    for i in range(0, len(items), _MAX_METRICS):
        client.log_batch(run_id, metrics=items[i : i + _MAX_METRICS])


def log_json(run_id: str, value: Any, artifact_file: str) -> None:
    """``value`` (a dict or list) as an indented JSON artifact at ``artifact_file``."""
    tracking_client().log_dict(run_id, value, artifact_file)


def log_text(run_id: str, text: str, artifact_file: str) -> None:
    tracking_client().log_text(run_id, text, artifact_file)


def log_figure(run_id: str, figure: Any, artifact_file: str) -> None:
    """A matplotlib (or plotly) figure as an image artifact at ``artifact_file``."""
    tracking_client().log_figure(run_id, figure, artifact_file)


def close_run(run_id: str, status: str = "FINISHED") -> None:
    """End the run with ``status`` (FINISHED, FAILED or KILLED); closing again overwrites it."""
    if status not in END_STATUSES:
        raise ValueError(f"status must be one of {', '.join(END_STATUSES)}, got {status!r}")
    tracking_client().set_terminated(run_id, status)


@contextmanager
def fail_on_error(run_id: str) -> Iterator[str]:
    """Mark the run FAILED if the body raises (cancellation included), then re-raise.

    A store that cannot be reached then only logs a warning: the body's error is the one
    worth seeing.
    """
    try:
        yield run_id
    except BaseException:
        try:
            close_run(run_id, "FAILED")
        except Exception:  # noqa: BLE001 - never mask the body's error
            log.warning("could not mark MLflow run %s FAILED", run_id, exc_info=True)
        raise


class StepMetricsLogger:
    """Buffers per-step metrics and sends them in batches: one call per ``flush_every`` steps."""

    def __init__(self, run_id: str, flush_every: int = 50) -> None:
        self.client = tracking_client()
        self.run_id = run_id
        self.flush_every = flush_every
        self._buffer: list[Metric] = []

    def log(self, step: int, metrics: dict[str, float | None]) -> None:
        ts = int(time.time() * 1000)
        self._buffer.extend(
            Metric(key, float(value), ts, step)
            for key, value in metrics.items()
            if value is not None
        )
        if len(self._buffer) >= self.flush_every * max(1, len(metrics)):
            self.flush()

    def flush(self) -> None:
        for i in range(0, len(self._buffer), _MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=self._buffer[i : i + _MAX_METRICS])
        self._buffer.clear()


def flat_params(prefix: str, values: dict[str, Any]) -> dict[str, str]:
    return {f"{prefix}{k}": str(v) for k, v in values.items() if v is not None}
