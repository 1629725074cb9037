"""Done-when of issue 16: a DVFS controller stopped with SIGKILL leaves no device at a
changed setting once its hold lapses and the next controller run starts (restore_stale
first), or, for a job's own settings, once the job's lease is released.

The controllers run in processes of their own (tests/helpers/dvfs_controller_entry.py,
tests/helpers/settings_holder.py); the test's gate is the settings ledger and the twin's
state, polled with a generous deadline."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.energy.controller import run_controller
from gpuflow.tasks.energy.settings import restore_stale

from tests.helpers.dvfs_job import a100_twin

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
N = "a100-0"
ORIGINAL_MW = 400_000
TTL_S = 30.0
DEADLINE_S = 120.0  # wall time for the child to start and change the device


@pytest.fixture
def twin(tmp_path: Path) -> SimBackend:
    return a100_twin(tmp_path, "dvfs-kill", 3, 1)


def limit_mw(twin: SimBackend) -> int:
    return twin.power_limits(N, 0).limit_mw


@contextmanager
def child(args: list[str], tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], IO[str]]]:
    """A Python child process; killed on the way out whatever happened."""
    stderr = (tmp_path / "child.stderr").open("w+")
    proc = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    try:
        yield proc, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        stderr.close()


def wait_for(
    what: str, ready: Callable[[], bool], proc: subprocess.Popen[str], err: IO[str]
) -> None:
    """Poll ``ready`` until it holds; fail at once, with the child's stderr, if it died."""
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        if proc.poll() is not None:
            err.seek(0)
            pytest.fail(f"the child exited ({proc.returncode}) before {what}:\n{err.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {DEADLINE_S:g} s")
        time.sleep(0.05)  # polling the gate, not timing the child


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_controllers_change_is_put_back_by_the_next_run(
    inventory_url: str, twin: SimBackend, tmp_path: Path
) -> None:
    inv = Inventory(inventory_url, now=twin.now_s)
    inv.sync(twin)
    holder = "dvfs:doomed"

    def changed() -> bool:
        row = inv.setting(N, 0)
        # Both: the journal row is written before the device is touched.
        return row is not None and row.holder == holder and limit_mw(twin) < ORIGINAL_MW

    args = [str(HELPERS / "dvfs_controller_entry.py"), inventory_url, holder, N, "0"]
    with child(args + ["job-1", str(TTL_S)], tmp_path) as (proc, err):
        wait_for("a changed power limit", changed, proc, err)
        kill(proc)
    # No stop ran: the device keeps the change, the ledger the original...
    changed_to = limit_mw(twin)
    assert changed_to < ORIGINAL_MW
    [row] = inv.settings()
    assert (row.holder, row.power_limit_mw, row.original_power_limit_mw) == (
        holder,
        changed_to,
        ORIGINAL_MW,
    )
    # ...and a run starting while its hold still lives leaves it alone (it may be alive).
    assert restore_stale(inv, twin) == [] and limit_mw(twin) == changed_to
    # Past its TTL, the next controller run puts it back before it does anything else.
    twin.advance(TTL_S + 1)
    run = run_controller(twin, inv, duration_s=0.0, holder="dvfs:next", wait=twin.advance)
    assert [(c["holder"], c["node"], c["index"], c["status"]) for c in run.cleaned] == [
        (holder, N, 0, "restored")
    ]
    assert limit_mw(twin) == ORIGINAL_MW and inv.settings() == []
    inv.close()


def test_a_killed_jobs_own_setting_is_put_back_once_its_lease_is_released(
    inventory_url: str, twin: SimBackend, tmp_path: Path
) -> None:
    inv = Inventory(inventory_url)  # the real clock, as the child's
    inv.sync(twin)
    job, uuid = "job-pins", twin.device(N, 0).uuid
    inv.record_job(job, {"model": "tiny"})
    inv.acquire_lease(uuid, job, 3600)
    args = [str(HELPERS / "settings_holder.py"), inventory_url, job, N, "0"]
    # A TTL of an hour: only the lease can make this row stale within the test.
    with child(args + ["250000", "900", "1200", "3600"], tmp_path) as (proc, err):
        wait_for("the job's power limit", lambda: limit_mw(twin) == 250_000, proc, err)
        kill(proc)
    assert limit_mw(twin) == 250_000 and [r.holder for r in inv.settings()] == [job]
    assert restore_stale(inv, twin) == []  # the job still holds its lease
    inv.release_lease(uuid, job)  # as the reaper does for a dead runner
    [outcome] = restore_stale(inv, twin)
    assert (outcome.status, outcome.holder) == ("restored", job)
    assert limit_mw(twin) == ORIGINAL_MW and inv.settings() == []
    assert twin.clocks(N, 0).locked_min_mhz is None
    inv.close()
