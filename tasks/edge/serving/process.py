"""Run a shard server as a separate process and know when it is up.

``start_shard_process`` launches ``python -m gpuflow.tasks.edge.serving.server``, waits for its
READY line (which carries the bound address, so ``port=0`` works) and returns a handle
whose ``stop()`` sends SIGTERM (graceful) and kills only if the grace period runs out. A
server that exits before it is ready (a sha256 mismatch, a port in use) raises
``ShardStartError`` with its exit code, the tail of its log and the log's path, and leaves
nothing running. Without a ``log_path`` the server logs to a temporary file, removed when
the server stops cleanly (exit code 0) and kept otherwise, for whoever looks into why.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from gpuflow.tasks.edge.serving.server import READY_PREFIX

# The repository root, so the child finds the ``tasks`` package even when it is not installed.
_REPO_ROOT = Path(__file__).resolve().parents[3]


class ShardStartError(RuntimeError):
    """A shard server process exited or stayed silent instead of becoming ready."""

    def __init__(self, message: str, returncode: int | None, log_tail: str) -> None:
        self.returncode = returncode
        self.log_tail = log_tail
        super().__init__(message)


@dataclass
class ShardProcess:
    """A running shard server process."""

    process: subprocess.Popen[str]
    address: str
    model_name: str
    log_path: Path
    ready_line: str
    _drain: threading.Thread | None = field(default=None, repr=False)
    temporary_log: bool = False  # made by start_shard_process: removed after a clean stop

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait up to timeout_s, then SIGKILL; returns the exit code."""
        code = _terminate(self.process, timeout_s)
        if code == 0 and self.temporary_log:
            self.log_path.unlink(missing_ok=True)
        return code

    def __enter__(self) -> ShardProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate(process: subprocess.Popen[str], timeout_s: float) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def _tail(path: Path, max_chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-max_chars:].strip()
    except OSError:
        return ""


def server_argv(
    shard_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    forward_to: str | None = None,
    forward_model: str | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The argv that starts a shard server (forward_to as in start_shard_server)."""
    argv = [python, "-m", "gpuflow.tasks.edge.serving.server", "--shard-dir", str(shard_dir)]
    argv += ["--host", host, "--port", str(port)]
    if forward_to == "":
        argv.append("--no-forward")
    elif forward_to is not None:
        argv += ["--forward-to", forward_to]
    if forward_model:
        argv += ["--forward-model", forward_model]
    return argv + list(extra_args)


def start_shard_process(
    shard_dir: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    forward_to: str | None = None,
    *,
    forward_model: str | None = None,
    extra_args: Sequence[str] = (),
    ready_timeout_s: float = 60.0,
    log_path: str | Path | None = None,
    python: str = sys.executable,
) -> ShardProcess:
    """Start a shard server process and wait for its READY line; ShardStartError otherwise."""
    argv = server_argv(shard_dir, host, port, forward_to, forward_model, extra_args, python)
    temporary_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="gpuflow-shard-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    with open(log_path, "w") as log_file:
        # stderr (logs) to a file, not a pipe: an unread pipe would block a chatty server.
        # argv list, no shell; the executable is this interpreter (or the caller's choice).
        process = subprocess.Popen(  # noqa: S603
            argv, stdout=subprocess.PIPE, stderr=log_file, text=True, env=env
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    reader = threading.Thread(target=drain, name=f"shard-stdout-{process.pid}", daemon=True)
    reader.start()
    deadline = time.monotonic() + ready_timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            _terminate(process, 5.0)
            raise ShardStartError(
                f"shard server for {shard_dir} not ready after {ready_timeout_s:.0f} s; "
                f"log {log_path}: {_tail(log_path)}",
                process.returncode,
                _tail(log_path),
            ) from None
        if line is None:  # stdout closed: the process is exiting
            code = process.wait()
            tail = _tail(log_path)
            raise ShardStartError(
                f"shard server for {shard_dir} exited with code {code} before it was ready "
                f"(log {log_path}): {tail}",
                code,
                tail,
            )
        if line.startswith(READY_PREFIX):
            fields = dict(
                part.split("=", 1) for part in line[len(READY_PREFIX) :].split() if "=" in part
            )
            return ShardProcess(
                process=process,
                address=fields["address"],
                model_name=fields["model"],
                log_path=log_path,
                ready_line=line.strip(),
                _drain=reader,
                temporary_log=temporary_log,
            )
