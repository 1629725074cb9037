"""Flows run against a real (temporary, local) Prefect server, started once per session
(tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def flows_use_prefect(prefect_server: None) -> Iterator[None]:
    yield
