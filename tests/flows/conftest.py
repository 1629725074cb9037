"""Flows run against a real (temporary, local) Prefect server, started once per session
(tests/conftest.py), and record into a new MLflow store of their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.store_templates import mlflow_store_migrated

__all__ = ["mlflow_store_migrated"]  # an autouse fixture for every test here


@pytest.fixture(scope="session", autouse=True)
def flows_use_prefect(prefect_server: None) -> Iterator[None]:
    yield
