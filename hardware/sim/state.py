"""The twin's persistent state: one JSON file under GPUFLOW_HOME/twin/, shared by processes.

A flow, a monitor and the CLI each open their own SimBackend; they see one fleet because
every operation is a read-modify-write of this file under an exclusive ``fcntl.flock`` on
a separate lock file, and every write is atomic (temp file in the same folder, fsync,
rename): a reader sees the old state or the new one, never half.
An operation that raises writes nothing, so a rejected request changes nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import HardwareError
from gpuflow.hardware.home import replace_atomically

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"


class StateStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.state_path = self.root / STATE_FILE
        self.lock_path = self.root / LOCK_FILE

    def exists(self) -> bool:
        return self.state_path.exists()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the exclusive lock (per open file, so threads and processes both wait)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def read(self) -> dict[str, Any] | None:
        """The state, or None when there is none yet. Call with the lock held."""
        try:
            text = self.state_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise HardwareError(
                f"twin state {self.state_path} is corrupt ({e}); reset the twin "
                "(SimBackend().reset()) to start over"
            ) from None
        if not isinstance(data, dict):
            raise HardwareError(
                f"twin state {self.state_path} is not a JSON object; reset the twin"
            )
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Atomically replace the state. Call with the lock held."""
        # dumps (C encoder) then one write: json.dump streams in pure Python.
        text = json.dumps(data, separators=(",", ":"))
        replace_atomically(self.state_path, text.encode("utf-8"), ".state-")

    @contextlib.contextmanager
    def transaction(self, create: Callable[[], dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Lock, read (``create()`` when absent), yield for changes, write on success."""
        with self.locked():
            data = self.read()
            if data is None:
                data = create()
            yield data
            self.write(data)
