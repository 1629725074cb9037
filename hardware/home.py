"""Where gpuflow keeps its state: GPUFLOW_HOME (default ~/.gpuflow)."""

from __future__ import annotations

import os
from pathlib import Path


def gpuflow_home() -> Path:
    """The state folder (twin state, inventory, checkpoints, logs, MLflow store); created."""
    home = Path(os.environ.get("GPUFLOW_HOME") or Path.home() / ".gpuflow").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home
