"""Every NVML test: its own GPUFLOW_HOME and no GPUFLOW_REGION from the caller's shell."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("GPUFLOW_REGION", raising=False)
