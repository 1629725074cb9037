"""The CLI, the tour and the control plane: each test records into a new MLflow store of
its own (GPUFLOW_HOME's)."""

from __future__ import annotations

from tests.helpers.store_templates import mlflow_store_migrated

__all__ = ["mlflow_store_migrated"]  # an autouse fixture for every test here
