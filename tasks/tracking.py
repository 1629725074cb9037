"""MLflow: where runs are recorded, and a cheap per-step metrics logger.

The store defaults to SQLite under GPUFLOW_HOME (artifacts beside it); MLFLOW_TRACKING_URI
points it at a tracking server instead. One experiment per capability (DESIGN.md §3).
"""

from __future__ import annotations

import os
import time
from typing import Any

import mlflow
from gpuflow.hardware.home import gpuflow_home
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient


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
    return client.create_experiment(name, artifact_location=artifacts)


class StepMetricsLogger:
    """Buffers per-step metrics and sends them in batches: one call per ``flush_every`` steps."""

    def __init__(self, run_id: str, flush_every: int = 50) -> None:
        self.client = MlflowClient(tracking_uri())
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
        for i in range(0, len(self._buffer), 1000):  # MLflow caps a batch at 1000 metrics
            self.client.log_batch(self.run_id, metrics=self._buffer[i : i + 1000])
        self._buffer.clear()


def flat_params(prefix: str, values: dict[str, Any]) -> dict[str, str]:
    return {f"{prefix}{k}": str(v) for k, v in values.items() if v is not None}
