"""Job progress in the inventory (hardware/inventory/progress.py), on SQLite and
PostgreSQL: upsert, never back within an attempt, a newer attempt replaces, an older one
is ignored, clear input errors, and real processes reporting at once."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory, JobProgress

from tests.hardware.inventory.helpers import MP
from tests.helpers.clock import ManualClock


def test_first_report_inserts_and_later_ones_move_it_forward(
    inv: Inventory, clock: ManualClock
) -> None:
    assert inv.job_progress("job-1") is None
    first = inv.report_progress("job-1", 10)
    assert first == JobProgress("job-1", 10.0, "step", clock.t, 0)
    clock.t += 2
    assert inv.report_progress("job-1", 25).units_done == 25.0
    assert inv.job_progress("job-1") == JobProgress("job-1", 25.0, "step", clock.t, 0)
    assert inv.job_progress("job-2") is None  # one row per job


def test_units_never_go_back_and_a_report_adding_nothing_keeps_its_time(
    inv: Inventory, clock: ManualClock
) -> None:
    inv.report_progress("job-1", 50)
    reached_at = clock.t
    clock.t += 3
    assert inv.report_progress("job-1", 40).units_done == 50.0  # a late, smaller report
    same = inv.report_progress("job-1", 50)
    # updated_at is when 50 was reached: a reader timing the work sees no idle 3 s.
    assert (same.units_done, same.updated_at_s) == (50.0, reached_at)


def test_a_newer_attempt_replaces_and_an_older_one_is_ignored(
    inv: Inventory, clock: ManualClock
) -> None:
    inv.record_job("job-1", {"model": "tiny"})  # attempt 0 in the registry
    inv.report_progress("job-1", 80)
    clock.t += 1
    resumed = inv.report_progress("job-1", 50, attempt=1)  # resumed from a checkpoint
    assert (resumed.units_done, resumed.attempt) == (50.0, 1)
    zombie = inv.report_progress("job-1", 90, attempt=0)  # the old runner, still alive
    assert zombie == resumed and inv.job_progress("job-1") == resumed
    # A new attempt may change the unit; within one it is fixed.
    assert inv.report_progress("job-1", 1, unit="epoch", attempt=2).unit == "epoch"
    with pytest.raises(InvalidRequestError, match="reports progress in 'epoch's, not 'step's"):
        inv.report_progress("job-1", 2, attempt=2)
    assert inv.clear_progress("job-1") and inv.job_progress("job-1") is None
    assert not inv.clear_progress("job-1")


def test_the_attempt_defaults_to_the_registrys(inv: Inventory) -> None:
    inv.report_progress("job-unregistered", 5)
    assert inv.job_progress("job-unregistered").attempt == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("job", "units", "kw", "message"),
    [
        ("", 1, {}, "job id must be a non-empty string"),
        ("j", -1, {}, "units_done must be >= 0"),
        ("j", float("nan"), {}, "units_done must be a finite number"),
        ("j", True, {}, "units_done must be a finite number"),
        ("j", "3", {}, "units_done must be a finite number"),
        ("j", 1, {"unit": ""}, "progress unit must be a non-empty string"),
        ("j", 1, {"unit": "x" * 33}, "progress unit is longer than 32"),
        ("j", 1, {"attempt": -1}, "attempt must be an integer >= 0"),
        ("j", 1, {"now": -5}, "now must be >= 0"),
    ],
)
def test_bad_input_writes_nothing(
    inv: Inventory,
    job: str,
    units: object,
    kw: dict,
    message: str,  # type: ignore[type-arg]
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        inv.report_progress(job, units, **kw)  # type: ignore[arg-type]
    assert inv.job_progress("j") is None


# -- real processes reporting at once ------------------------------------------------
def _reporter(url: str, job: str, start: int, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        go.wait(timeout=30)
        # Interleaved values: both processes write 1..40, one the odd ones, one the even.
        for units in range(start, 41, 2):
            inv.report_progress(job, units)
            inv.report_progress("solo-" + str(start), units)
        out.put((start, None))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put((start, repr(exc)))


def test_two_processes_reporting_at_once_end_at_the_larger(inv: Inventory) -> None:
    go, out = MP.Barrier(2), MP.Queue()
    procs = [MP.Process(target=_reporter, args=(inv.url, "job-1", s, go, out)) for s in (1, 2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    assert not [err for _, err in results if err], results
    assert inv.job_progress("job-1").units_done == 40.0  # type: ignore[union-attr]
    # Each process's own job: its own last value, untouched by the other's writes.
    assert inv.job_progress("solo-1").units_done == 39.0  # type: ignore[union-attr]
    assert inv.job_progress("solo-2").units_done == 40.0  # type: ignore[union-attr]
