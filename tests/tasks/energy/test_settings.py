"""DeviceSettings and restore_stale (tasks/energy/settings.py) on the twin: every change is
journalled before it is made and put back on stop, on an exception, after a SIGKILL
(restore_stale past the TTL) and at the end of a job's lease."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpuflow.hardware.backend import DeviceLostError, HardwareError, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, SettingsConflictError
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.energy.settings import (
    DeviceSettings,
    SettingsRestoreError,
    restore_stale,
)

from tests.helpers.clock import ManualClock

HOLDER_SCRIPT = Path(__file__).resolve().parents[2] / "helpers" / "settings_holder.py"
N = "a100-0"  # A100 40GB: power 100..400 W (default 400 W), SM clock 210..1410 MHz, mem 1215
QUIET_FLEET = {
    "name": "energy",
    "seed": 11,
    "faults": {"natural": False},
    "nodes": [
        {
            "name": N,
            "region": "r1",
            "role": "active",
            "devices": [{"sku": "a100-40gb", "count": 2}],
        },
        {"name": "dcu-0", "region": "r2", "role": "active", "devices": [{"sku": "dcu-z100"}]},
    ],
}


class FlakyTwin(SimBackend):
    """The twin whose power-limit setter fails (as NVML without root does) while asked to."""

    fail_power = False

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        if self.fail_power:
            raise HardwareError(f"{node}:{index}: setting the power limit: no permission")
        super().set_power_limit_mw(node, index, limit_mw)


@pytest.fixture
def twin(tmp_path: Path) -> FlakyTwin:
    spec = tmp_path / "energy.yaml"
    spec.write_text(yaml.safe_dump(QUIET_FLEET), encoding="utf-8")
    return FlakyTwin(spec_path=spec)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def inv(tmp_path: Path, clock: ManualClock) -> Iterator[Inventory]:
    inventory = Inventory(f"sqlite:///{tmp_path / 'inv.db'}", now=clock)
    yield inventory
    inventory.close()


def state(twin: SimBackend, index: int = 0) -> tuple[int, int | None, int | None, int | None]:
    """(power limit, locked min, locked max, applications SM clock) of a100-0:index."""
    c = twin.clocks(N, index)
    return (
        twin.power_limits(N, index).limit_mw,
        c.locked_min_mhz,
        c.locked_max_mhz,
        c.applications_sm_clock_mhz,
    )


ORIGINAL = (400_000, None, None, None)


def test_changes_are_journalled_with_the_original_and_put_back(
    twin: FlakyTwin, inv: Inventory
) -> None:
    assert state(twin) == ORIGINAL
    s = DeviceSettings(twin, inv, "dvfs:run-1", ttl_s=30)
    s.apply_power_limit(N, 0, 300_000)
    s.apply_power_limit(N, 0, 250_000)  # a second change: the original stays 400 W
    s.apply_locked_clocks(N, 0, 900, 1200)
    row = s.apply_applications_clocks(N, 0, 1215, 1100)
    assert state(twin) == (250_000, 900, 1200, 1100)
    assert (row.original_power_limit_mw, row.original_locked_mhz) == (400_000, None)
    assert row.original_applications_mhz is None and row.device_uuid == twin.device(N, 0).uuid
    assert row.changed == ("power_limit", "locked_clocks", "applications_clocks")
    outcome = s.restore(N, 0)
    assert outcome is not None and outcome.status == "restored", outcome
    assert state(twin) == ORIGINAL and inv.settings() == []
    assert s.restore(N, 0) is None  # nothing journalled any more


def test_refused_input_changes_nothing_and_records_nothing(twin: FlakyTwin, inv: Inventory) -> None:
    s = DeviceSettings(twin, inv, "dvfs:run-1")
    refused = [
        (lambda: s.apply_power_limit(N, 0, 50_000), r"a100-0:0: power limit 50000 mW .*100000"),
        (lambda: s.apply_power_limit(N, 0, 250_000.0), "limit_mw must be an integer"),  # type: ignore[arg-type]
        (lambda: s.apply_locked_clocks(N, 0, 900, 1500), r"locked max clock 1500 MHz .*1410"),
        (lambda: s.apply_locked_clocks(N, 0, 1200, 900), "min > max"),
        (lambda: s.apply_power_limit(N, 7, 250_000), "no device a100-0:7"),
        (lambda: s.apply_power_limit("elsewhere", 0, 250_000), "not one backend 'sim' sees"),
        # Past our own range check: the twin's memory-clock table refuses it (rewound).
        (lambda: s.apply_applications_clocks(N, 0, 999, 1100), r"memory clock 999"),
    ]
    for attempt, message in refused:
        with pytest.raises(InvalidRequestError, match=message):
            attempt()
        assert state(twin) == ORIGINAL and inv.settings() == [], message
    # A refusal after an accepted change rewinds only itself.
    kept = s.apply_power_limit(N, 0, 300_000)
    with pytest.raises(InvalidRequestError, match="memory clock 999"):
        s.apply_applications_clocks(N, 0, 999, 1100)
    row = inv.setting(N, 0)
    assert row is not None and row.changed == ("power_limit",) and row.applications_mhz is None
    assert (row.power_limit_mw, row.original_power_limit_mw) == (kept.power_limit_mw, 400_000)
    assert state(twin) == (300_000, None, None, None)


def test_a_second_holder_is_refused_while_the_first_is_live(
    twin: FlakyTwin, inv: Inventory
) -> None:
    first = DeviceSettings(twin, inv, "dvfs:run-1", ttl_s=30)
    second = DeviceSettings(twin, inv, "tuner:other", ttl_s=30)
    first.apply_power_limit(N, 0, 300_000)
    with pytest.raises(SettingsConflictError, match="a100-0:0 .*journalled by 'dvfs:run-1'"):
        second.apply_locked_clocks(N, 0, 900, 1000)
    assert state(twin) == (300_000, None, None, None)
    second.apply_power_limit(N, 1, 200_000)  # another device is free
    first.restore_all()
    second.apply_power_limit(N, 0, 200_000)
    assert inv.setting(N, 0).original_power_limit_mw == 400_000  # type: ignore[union-attr]
    second.restore_all()
    assert state(twin) == ORIGINAL and state(twin, 1) == ORIGINAL and inv.settings() == []


def test_the_context_manager_restores_on_an_exception(twin: FlakyTwin, inv: Inventory) -> None:
    with pytest.raises(RuntimeError, match="training diverged"):
        with DeviceSettings(twin, inv, "dvfs:run-1") as s:
            s.apply_power_limit(N, 0, 300_000)
            s.apply_locked_clocks(N, 1, 1000, 1100)
            raise RuntimeError("training diverged")
    assert state(twin) == ORIGINAL and state(twin, 1) == ORIGINAL and inv.settings() == []


def test_renewed_rows_stay_and_a_lapsed_holders_change_is_restored_first(
    twin: FlakyTwin, inv: Inventory, clock: ManualClock
) -> None:
    old = DeviceSettings(twin, inv, "dvfs:run-1", ttl_s=10)
    old.apply_power_limit(N, 0, 300_000)
    old.apply_locked_clocks(N, 0, 900, 1200)
    clock.t += 8
    assert old.renew() == 1
    clock.t += 8
    assert restore_stale(inv, twin) == []  # renewed in time: still live
    clock.t += 10  # it stopped renewing
    new = DeviceSettings(twin, inv, "dvfs:run-2")
    row = new.apply_power_limit(N, 0, 200_000)  # restores run-1's change first
    assert row.holder == "dvfs:run-2" and row.original_power_limit_mw == 400_000
    assert state(twin) == (200_000, None, None, None)  # run-1's lock was reset
    assert old.renew() == 0  # its row is gone
    new.restore_all()
    assert state(twin) == ORIGINAL


def test_a_jobs_tuner_is_restored_when_the_lease_ends(
    twin: FlakyTwin, inv: Inventory, clock: ManualClock
) -> None:
    inv.sync(twin)
    job = "job-42"
    inv.record_job(job, {"model": "tiny"})
    tuner = DeviceSettings(twin, inv, job, ttl_s=600)
    with pytest.raises(InvalidRequestError, match="'job-42' is a job .*no live lease on a100-0:0"):
        tuner.apply_power_limit(N, 0, 300_000)
    assert inv.settings() == [] and state(twin) == ORIGINAL
    inv.acquire_lease(twin.device(N, 0).uuid, job, 30)
    tuner.apply_power_limit(N, 0, 300_000)
    assert restore_stale(inv, twin) == []  # the job holds its lease
    inv.release_lease(twin.device(N, 0).uuid, job)
    [outcome] = restore_stale(inv, twin)  # at once: the row's own 600 s are not waited for
    assert (outcome.status, outcome.holder) == ("restored", job)
    assert state(twin) == ORIGINAL and inv.settings() == []


def test_a_device_gone_is_reported_lost_and_its_row_dropped(
    twin: FlakyTwin, inv: Inventory, clock: ManualClock
) -> None:
    s = DeviceSettings(twin, inv, "dvfs:run-1", ttl_s=10)
    s.apply_power_limit(N, 0, 300_000)
    s.apply_power_limit(N, 1, 300_000)
    twin.inject_fault(N, 0, "xid79")
    with pytest.raises(DeviceLostError):
        twin.power_limits(N, 0)
    outcomes = {o.index: o for o in s.restore_all()}  # a lost device is no failure
    assert (outcomes[0].status, outcomes[1].status) == ("lost", "restored")
    assert "went away" in outcomes[0].detail and inv.settings() == []
    # Another physical device now at a journalled slot: reported lost, left alone.
    inv.record_setting(
        "dvfs:gone",
        N,
        1,
        ttl_s=5,
        device_uuid="GPU-replaced-long-ago",
        power_limit_mw=150_000,
        original_power_limit_mw=250_000,
    )
    [outcome] = restore_stale(inv, twin, now=clock.t + 10)
    assert outcome.status == "lost" and "not touching the newcomer" in outcome.detail
    assert state(twin, 1) == ORIGINAL and inv.settings() == []


def test_a_failed_restore_keeps_the_row_for_the_next_run(
    twin: FlakyTwin, inv: Inventory, clock: ManualClock
) -> None:
    s = DeviceSettings(twin, inv, "dvfs:run-1", ttl_s=10)
    s.apply_locked_clocks(N, 0, 900, 1200)
    twin.fail_power = True
    # Not a refusal: the device's state is unknown, so the journal entry stays.
    with pytest.raises(HardwareError, match="no permission"):
        s.apply_power_limit(N, 0, 300_000)
    assert inv.setting(N, 0).changed == ("power_limit", "locked_clocks")  # type: ignore[union-attr]
    with pytest.raises(SettingsRestoreError, match="a100-0:0: power limit: .*no permission"):
        s.restore_all()
    assert state(twin)[1:3] == (None, None)  # what could be put back was
    assert [r.holder for r in inv.settings()] == ["dvfs:run-1"]
    twin.fail_power = False
    [outcome] = restore_stale(inv, twin, now=clock.t + 11)
    assert outcome.status == "restored" and state(twin) == ORIGINAL and inv.settings() == []


def test_rows_of_nodes_the_backend_does_not_see_are_left_alone(
    twin: FlakyTwin, inv: Inventory, clock: ManualClock
) -> None:
    inv.record_setting(
        "dvfs:other-host", "gpu-host-9", 0, ttl_s=5, power_limit_mw=1, original_power_limit_mw=2
    )
    assert restore_stale(inv, twin, now=clock.t + 10) == []
    assert [r.node for r in inv.settings()] == ["gpu-host-9"]


def test_sigkill_leaves_the_change_and_restore_stale_puts_it_back(
    inventory_url: str, twin: FlakyTwin, tmp_path: Path
) -> None:
    inv = Inventory(inventory_url)  # the real clock, as the child's
    ttl_s = 30
    stderr = (tmp_path / "holder.stderr").open("w+")
    child = subprocess.Popen(
        [sys.executable, str(HOLDER_SCRIPT), inventory_url, "dvfs:doomed", N, "0"]
        + ["250000", "900", "1200", str(ttl_s)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )
    try:
        # The gate: the child says "ready" once both changes are made (EOF if it died).
        ready = child.stdout.readline()  # type: ignore[union-attr]
        stderr.seek(0)
        assert ready == "ready\n", stderr.read()
        killed_at = time.time()
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        stderr.close()
    assert child.returncode == -signal.SIGKILL
    # Its `with` block never ran its restore: the device keeps the change...
    assert state(twin) == (250_000, 900, 1200, None)
    [row] = inv.settings()
    assert (row.holder, row.original_power_limit_mw, row.original_locked_mhz) == (
        "dvfs:doomed",
        400_000,
        None,
    )
    # ...until its hold lapses: before that restore_stale leaves it alone.
    assert restore_stale(inv, twin, now=killed_at) == [] and state(twin)[0] == 250_000
    outcomes = restore_stale(inv, twin, now=killed_at + ttl_s + 1)
    assert [(o.status, o.holder, o.node, o.index) for o in outcomes] == [
        ("restored", "dvfs:doomed", N, 0)
    ]
    assert state(twin) == ORIGINAL and inv.settings() == []
    inv.close()
