"""Where gpuflow keeps its state (GPUFLOW_HOME, default ~/.gpuflow), and how a state file
is replaced: whole, so that the next reader (a later round, another process) sees the old
file or the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def gpuflow_home() -> Path:
    """The state folder (twin state, inventory, checkpoints, logs, MLflow store); created."""
    home = Path(os.environ.get("GPUFLOW_HOME") or Path.home() / ".gpuflow").expanduser()
    home.mkdir(parents=True, exist_ok=True)
    return home


def replace_atomically(path: Path, data: bytes, prefix: str) -> None:
    """Write ``data`` to a temporary file beside ``path`` (``prefix`` names it; unique, so
    two processes writing at once never share one), flush it to disk, then rename it over
    ``path``. On any error the temporary file is removed and ``path`` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=path.suffix, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
