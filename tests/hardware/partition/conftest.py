"""Fixtures for the partition plan tests: the default twin in the test's own home."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.backend import Backend

from tests.hardware.partition.helpers import make_backend


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path))
    return make_backend(tmp_path)
