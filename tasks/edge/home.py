"""Where an edge deployment name keeps its state, and the error every edge step raises.

GPUFLOW_HOME/edge/<name>/          current (the serving version), target (its head's
                                   address, for the stable endpoint), endpoint.json
GPUFLOW_HOME/edge/<name>/<version>/ deployment.json, model/, shards/, logs/
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from gpuflow.hardware.home import gpuflow_home

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
REPO_ROOT = Path(__file__).resolve().parents[2]  # child processes find the tasks package here
TARGET_FILE = "target"  # the current head's address, for the stable endpoint


class EdgeDeployError(RuntimeError):
    """A deployment could not be started, checked or found."""


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise EdgeDeployError(f"deployment name must match [A-Za-z0-9_.-]+, got {name!r}")
    return name


def edge_root() -> Path:
    return gpuflow_home() / "edge"


def name_dir(name: str) -> Path:
    return edge_root() / check_name(name)


def version_dir(name: str, version: str) -> Path:
    return name_dir(name) / version


def target_file(name: str) -> Path:
    return name_dir(name) / TARGET_FILE


def process_running(pid: int, *markers: str) -> bool:
    """True when ``pid`` is alive and its argv holds every one of ``markers`` (pids get
    reused: a marker names what it must be). A zombie child is reaped, and is not alive."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    if state == "Z":
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        return False
    args = [a.decode(errors="replace") for a in cmdline]
    return all(marker in args for marker in markers)


def spawn_detached(argv: Sequence[str], log_path: Path) -> subprocess.Popen:
    """Start ``argv`` (a list, no shell) in a session of its own, so it outlives the command
    that started it and gets no stray SIGINT; stdout and stderr to ``log_path``; the tasks
    package on its path even where gpuflow is not installed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        return subprocess.Popen(  # noqa: S603 (argv list built by the caller, no shell)
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
