"""The processes a control plane starts (servers, workers) and how they are stopped.

Each gets its own session (process group) and a log; a ``Service`` records its pid with
its /proc start time, so stopping never signals a process that merely reuses the pid.
Secrets reach a process through its environment, never its argv: a ``Service``'s argv is
written to the state file, and every user of the machine can read /proc/<pid>/cmdline.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

Report = Callable[[str], None]


class ControlPlaneError(RuntimeError):
    """A service did not come up; what was started has been stopped again."""


@dataclass
class Service:
    name: str
    pid: int
    argv: list[str]
    log: str
    url: str | None = None
    start_ticks: int | None = None  # /proc start time: tells our process from a reused pid


def console_script(name: str) -> str:
    """A console script of this environment (prefect, mlflow), never one found on PATH."""
    path = Path(sys.executable).with_name(name)
    if not path.exists():
        raise ControlPlaneError(f"{name} is not installed in {Path(sys.executable).parent}")
    return str(path)


def worker_argv(pool: str, name: str, queue: str) -> list[str]:
    """`prefect worker start` for one worker that takes runs from ``queue`` of ``pool``."""
    return [
        console_script("prefect"),
        "worker",
        "start",
        "--pool",
        pool,
        "--name",
        name,
        "--work-queue",
        queue,
    ]


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ControlPlaneError(
                f"{url} never came up: the process exited ({proc.returncode}):\n{tail}"
            )
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - a URL we built
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise ControlPlaneError(f"{url} did not answer within {timeout_s:.0f} s (log: {log})")


def start(
    name: str, argv: list[str], env: dict[str, str], logs: Path, cwd: Path
) -> tuple[subprocess.Popen[bytes], Service]:
    log = logs / f"{name}.log"
    out = log.open("ab")
    proc = subprocess.Popen(  # noqa: S603 - argv list of our own console scripts
        argv,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        cwd=str(cwd),
        start_new_session=True,
    )
    out.close()
    started = proc_start(proc.pid)
    return proc, Service(
        name=name,
        pid=proc.pid,
        argv=argv,
        log=str(log),
        start_ticks=started[0] if started else None,
    )


def run(argv: list[str], env: dict[str, str], cwd: Path, what: str, timeout_s: float = 300) -> str:
    done = subprocess.run(  # noqa: S603 - argv list of our own console scripts
        argv,
        env=env,
        cwd=str(cwd),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise ControlPlaneError(
            f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def proc_start(pid: int) -> tuple[int, str] | None:
    """(start time in clock ticks, state) of a process, from /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces
    return int(fields[19]), fields[0]


def alive(service: Service) -> bool:
    """The pid runs and is still the process we started (pids get reused)."""
    found = proc_start(service.pid)
    return found is not None and found[1] != "Z" and found[0] == service.start_ticks


def stop(services: Iterable[Service], timeout_s: float, report: Report) -> list[str]:
    """SIGTERM every live service's process group at once, SIGKILL those still alive
    after ``timeout_s``: they stop side by side, so a slow one costs its own wait, not
    everyone's."""
    stopping = []
    for service in services:
        if not alive(service):
            continue
        try:
            os.killpg(service.pid, signal.SIGTERM)  # its own session: the whole group
        except ProcessLookupError:
            continue
        stopping.append(service)
    deadline = time.monotonic() + timeout_s
    while any(alive(s) for s in stopping) and time.monotonic() < deadline:
        time.sleep(0.2)
    for service in stopping:
        if alive(service):
            os.killpg(service.pid, signal.SIGKILL)
            # Said apart from a clean stop: a service that ignores SIGTERM costs every
            # `down` its whole grace, and its log is where to look why.
            report(
                f"killed {service.name} (pid {service.pid}): still running {timeout_s:g} s after SIGTERM"
            )
        else:
            report(f"stopped {service.name} (pid {service.pid})")
        _reap(service.pid)
    return [service.name for service in stopping]


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child (started by another `gpuflow up` process)
