"""Suite-wide fixtures: every test gets its own GPUFLOW_HOME and the digital twin."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def gpuflow_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "gpuflow-home"
    home.mkdir()
    monkeypatch.setenv("GPUFLOW_HOME", str(home))
    monkeypatch.setenv("GPUFLOW_BACKEND", "sim")
    return home
