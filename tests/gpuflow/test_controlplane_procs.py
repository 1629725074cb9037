"""How `gpuflow down` stops the processes `up` started (gpuflow.controlplane_procs.stop):
SIGTERM to each process group, SIGKILL for what outlives the grace, and which was which."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpuflow.controlplane_procs import Service, alive, start, stop

# Each prints "ready" once its SIGTERM handling is in place: the test starts stopping only then.
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"  # noqa: E501
POLITE = "import time; print('ready', flush=True); time.sleep(120)"


def _ready(service: Service, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while "ready" not in Path(service.log).read_text():
        assert time.monotonic() < deadline, f"{service.name} never started"
        time.sleep(0.05)


def test_a_service_that_ignores_sigterm_is_killed_after_the_grace_and_said_so(
    tmp_path: Path,
) -> None:
    env = dict(os.environ)
    procs, services = [], []
    for name, code in (("stubborn", STUBBORN), ("polite", POLITE)):
        proc, service = start(name, [sys.executable, "-c", code], env, tmp_path, tmp_path)
        procs.append(proc)
        services.append(service)
    try:
        for service in services:
            _ready(service)
        said: list[str] = []
        assert stop(services, 1.0, said.append) == ["stubborn", "polite"]
        stubborn, polite = services
        assert said == [
            f"killed stubborn (pid {stubborn.pid}): still running 1 s after SIGTERM",
            f"stopped polite (pid {polite.pid})",
        ]
        assert not alive(polite)
        deadline = time.monotonic() + 30  # SIGKILL lands a moment after it is sent
        while alive(stubborn):
            assert time.monotonic() < deadline, "the stubborn service outlived its SIGKILL"
            time.sleep(0.05)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
