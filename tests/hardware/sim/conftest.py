"""Fixtures for the twin's tests: a twin in the test's GPUFLOW_HOME, and spec files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from gpuflow.hardware.sim import SimBackend

# The default fleet with natural faults off, so a test sees only what it injects.
QUIET_FLEET = {
    "name": "quiet",
    "seed": 7,
    "faults": {"natural": False},
    "nodes": [
        {
            "name": "a100-0",
            "region": "r1",
            "role": "active",
            "devices": [{"sku": "a100-40gb", "count": 2}],
        },
        {
            "name": "v100-0",
            "region": "r2",
            "role": "active",
            "devices": [{"sku": "v100", "count": 1}],
        },
        {
            "name": "dcu-0",
            "region": "r2",
            "role": "active",
            "devices": [{"sku": "dcu-z100", "count": 1}],
        },
        {
            "name": "hot-0",
            "region": "r1",
            "role": "spare",
            "ambient_c": 60,
            "devices": [{"sku": "a100-40gb", "count": 1}],
        },
    ],
}


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    counter = iter(range(1_000_000))

    def write(data: object, name: str | None = None) -> Path:
        path = tmp_path / (name or f"spec-{next(counter)}.yaml")
        path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
        return path

    return write


@pytest.fixture
def twin() -> SimBackend:
    """The packaged default fleet in this test's GPUFLOW_HOME."""
    return SimBackend()


@pytest.fixture
def quiet(write_spec: Callable[..., Path]) -> SimBackend:
    """A small fleet without natural faults (one node in a 60 degC room)."""
    return SimBackend(spec_path=write_spec(QUIET_FLEET, "quiet.yaml"))
