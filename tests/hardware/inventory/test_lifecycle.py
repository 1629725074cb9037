"""The job lifecycle (compare-and-swap on (state, attempt)), its schema migration, leases
owned by (job, attempt) with fencing tokens, the fleet-wide pass lock and the
LeaseKeeper. On SQLite and PostgreSQL (``inventory_url``), with real processes racing.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import (
    TRANSITIONS,
    IllegalTransitionError,
    Inventory,
    JobConflictError,
    JobState,
    LeaseConflictError,
    LeaseLostError,
    LeaseNotHeldError,
    LockBusyError,
)
from gpuflow.hardware.inventory.keeper import LeaseKeeper
from gpuflow.hardware.sim import SimBackend
from sqlalchemy import create_engine, text

from tests.helpers.clock import GatedClock, ManualClock, caught_up

MP = mp.get_context("fork")


@pytest.fixture
def rid(inv: Inventory) -> str:
    """A free whole device of the twin."""
    inv.sync(SimBackend())
    return inv.free_resources(kind="device")[0].resource_id


# -- the state machine -----------------------------------------------------------------
def test_a_job_goes_round_its_lifecycle_and_each_placement_is_a_new_attempt(
    inv: Inventory,
) -> None:
    job = inv.record_job("j", {"m": 1})
    assert (job.state, job.attempt) == (JobState.QUEUED, 0)
    placed = inv.place_job("j", ["r1"], attempt=1)
    assert (placed.state, placed.attempt, placed.resource_ids) == ("placed", 1, ("r1",))
    for state in ("launching", "running", "checkpointing"):
        assert inv.transition_job("j", state, expect_attempt=1).state == state
    stopped = inv.transition_job("j", "stopped", expect_attempt=1, last_checkpoint_id="ck-9")
    assert (stopped.state, stopped.last_checkpoint_id) == ("stopped", "ck-9")
    assert inv.requeue_job("j", "stopped").state == "queued"
    again = inv.place_job("j", ["r2"], attempt=2)
    assert (again.state, again.attempt) == ("placed", 2)
    inv.transition_job("j", "running", expect_attempt=2)
    lost = inv.requeue_job("j", "lost", expect_attempt=2, why="runner gone")
    assert (lost.state, lost.attempt, lost.info["why"]) == ("queued", 2, "runner gone")


def test_an_illegal_transition_names_the_job_its_state_and_the_move(inv: Inventory) -> None:
    inv.record_job("j", {})
    inv.place_job("j", [], attempt=1)
    inv.transition_job("j", "running")
    inv.transition_job("j", "finished")
    with pytest.raises(
        IllegalTransitionError, match=r"job 'j' is finished: it cannot go to running"
    ):
        inv.transition_job("j", "running")
    with pytest.raises(IllegalTransitionError, match="queued: it cannot go to stopped"):
        inv.record_job("k", {})
        inv.transition_job("k", "stopped")
    assert inv.job("k").state == "queued" and inv.job("j").state == "finished"
    # Every state has a row in the table, and nothing leaves a state to nowhere.
    assert set(TRANSITIONS) == set(JobState) and all(TRANSITIONS.values())


def test_a_stale_attempt_or_state_is_a_conflict_and_writes_nothing(inv: Inventory) -> None:
    inv.record_job("j", {})
    inv.place_job("j", ["r1"], attempt=1)
    inv.transition_job("j", "running", expect_attempt=1)
    inv.requeue_job("j", "lost", expect_attempt=1)
    inv.place_job("j", ["r2"], attempt=2)
    before = inv.job("j")
    with pytest.raises(JobConflictError, match="attempt 1 is stale"):
        inv.transition_job("j", "finished", expect_attempt=1, last_checkpoint_id="ck-1")
    with pytest.raises(JobConflictError, match="expected state running, found state placed"):
        inv.transition_job("j", "failed", expect_state="running")
    with pytest.raises(JobConflictError, match="attempt 1"):
        inv.place_job("j", ["r3"], attempt=2)  # someone placed attempt 2 already
    with pytest.raises(IllegalTransitionError, match="job .j. is placed: it cannot go to placed"):
        inv.place_job("j", ["r3"], attempt=3)  # attempt 2 is still active
    assert inv.job("j") == before


def test_superseding_an_active_attempt_marks_it_lost_first(inv: Inventory) -> None:
    inv.record_job("j", {})
    inv.place_job("j", ["r1"], attempt=1)
    inv.transition_job("j", "running")
    job = inv.place_job("j", ["r2"], attempt=2, supersede=True)
    assert (job.state, job.attempt, job.resource_ids) == ("placed", 2, ("r2",))
    assert "superseded_at_s" in job.info


def _place_worker(url: str, name: str, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        go.wait(timeout=30)
        try:
            inv.place_job("race", [name], attempt=1, expect_state="queued")
            out.put((name, "won"))
        except JobConflictError:
            out.put((name, "conflict"))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put((name, repr(exc)))


def test_processes_racing_to_place_one_job_place_it_once(inv: Inventory) -> None:
    inv.record_job("race", {})
    n = 6
    go, out = MP.Barrier(n), MP.Queue()
    procs = [MP.Process(target=_place_worker, args=(inv.url, f"p{i}", go, out)) for i in range(n)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    assert sorted(results.values()) == ["conflict"] * (n - 1) + ["won"]
    winner = next(name for name, r in results.items() if r == "won")
    job = inv.job("race")
    assert (job.state, job.attempt, job.resource_ids) == ("placed", 1, (winner,))


# -- migration -------------------------------------------------------------------------
V1_TABLES = (
    "CREATE TABLE gf_meta (key VARCHAR(64) PRIMARY KEY, value VARCHAR(255) NOT NULL)",
    "CREATE TABLE gf_jobs (job_id VARCHAR(255) PRIMARY KEY, spec JSON NOT NULL, "
    "state VARCHAR(16) NOT NULL, resource_ids JSON NOT NULL, last_checkpoint_id VARCHAR(255), "
    "info JSON NOT NULL, created_at FLOAT NOT NULL, updated_at FLOAT NOT NULL)",
    "CREATE TABLE gf_leases (resource_id VARCHAR(255) PRIMARY KEY, owner VARCHAR(255) NOT NULL, "
    "acquired_at FLOAT NOT NULL, renewed_at FLOAT NOT NULL, expires_at FLOAT NOT NULL)",
    "INSERT INTO gf_meta VALUES ('schema_version', '1')",
    "INSERT INTO gf_jobs VALUES ('old', '{}', 'checkpointed', '[]', 'ck-4', '{}', 1, 2)",
    "INSERT INTO gf_jobs VALUES ('run', '{}', 'running', '[]', NULL, '{}', 1, 2)",
    "INSERT INTO gf_leases VALUES ('GPU-x', 'run', 1, 1, 99999999999)",
)


def test_a_version_1_database_is_migrated_in_place(inventory_url: str, clock: ManualClock) -> None:
    engine = create_engine(inventory_url)
    with engine.begin() as conn:
        for statement in V1_TABLES:
            conn.execute(text(statement))
    engine.dispose()
    inv = Inventory(inventory_url, now=clock)
    old, run = inv.job("old"), inv.job("run")
    assert (old.state, old.attempt, old.last_checkpoint_id) == ("stopped", 0, "ck-4")
    assert (run.state, run.attempt) == ("running", 0)
    (lease,) = inv.leases()
    assert (lease.owner, lease.attempt, lease.token) == ("run", 0, 0)
    assert inv.requeue_job("old", "stopped").state == "queued"
    engine = create_engine(inventory_url)
    with engine.connect() as conn:
        version = conn.execute(
            text("SELECT value FROM gf_meta WHERE key = 'schema_version'")
        ).scalar_one()
    engine.dispose()
    assert version == "3"  # through version 2 to the change journal's
    start = inv.journal_tail(1)[0]
    inv.record_job("new", {"kind": "test"})
    assert [key for _, _, key in inv.journal_since(start).rows] == ["new"]
    Inventory(inventory_url).close()  # a second open finds nothing to migrate


# -- leases owned by (job, attempt), fenced ----------------------------------------------
def test_leases_belong_to_job_and_attempt_and_tokens_only_grow(
    inv: Inventory, rid: str, clock: ManualClock
) -> None:
    first = inv.acquire_lease(rid, "job", 300, attempt=1)
    assert (first.owner, first.attempt) == ("job", 1) and first.token > 0
    again = inv.acquire_lease(rid, "job", 300, attempt=1)
    assert again.token == first.token  # the same attempt extends, same token
    second = inv.acquire_lease(rid, "job", 300, attempt=2)  # a new placement of the job
    assert second.attempt == 2 and second.token > first.token
    # The old attempt can neither renew, nor take it back, nor release its successor's.
    with pytest.raises(LeaseNotHeldError, match="attempt 2, not attempt 1"):
        inv.renew_lease(rid, "job", 300, attempt=1)
    with pytest.raises(LeaseConflictError, match="attempt 1 is stale"):
        inv.acquire_lease(rid, "job", 300, attempt=1)
    assert inv.release_lease(rid, "job", attempt=1) is False
    assert inv.renew_leases("job", 1, [rid], 300) == 0
    clock.t += 100
    assert inv.renew_leases("job", 2, [rid], 300) == 1
    assert inv.lease(rid).expires_at_s == clock.t + 300  # type: ignore[union-attr]
    # Someone else after expiry: a larger token again.
    clock.t += 1000
    other = inv.acquire_lease(rid, "other", 300)
    assert other.token > second.token


def test_renewing_many_leases_is_one_statement(inv: Inventory, rid: str) -> None:
    ids = [r.resource_id for r in inv.free_resources(kind="device")[:4]]
    for r in ids:
        inv.acquire_lease(r, "gang", 300, attempt=3)
    statements: list[str] = []
    engine = inv._engine_here()

    from sqlalchemy import event

    def count(conn, cursor, statement, *args):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE"):
            statements.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        assert inv.renew_leases("gang", 3, ids, 300) == 4
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert len(statements) == 1


# -- the pass lock ---------------------------------------------------------------------
def test_the_pass_lock_has_one_holder_names_it_and_expires(
    inv: Inventory, clock: ManualClock
) -> None:
    hold = inv.acquire_lock("scheduler-pass", "host-a:1", 60)
    with pytest.raises(LockBusyError, match=r"held by 'host-a:1' until 1060\.000"):
        inv.acquire_lock("scheduler-pass", "host-b:2", 60)
    assert inv.lock_holder("scheduler-pass") == hold
    clock.t += 61  # host-a crashed: its lock lapses and is taken over
    taken = inv.acquire_lock("scheduler-pass", "host-b:2", 60)
    assert taken.token > hold.token
    assert inv.release_lock(hold) is False  # the late first holder frees nothing
    assert inv.lock_holder("scheduler-pass") == taken
    assert inv.release_lock(taken) is True and inv.lock_holder("scheduler-pass") is None
    with pytest.raises(InvalidRequestError, match="ttl_s must be > 0"):
        inv.acquire_lock("scheduler-pass", "x", 0)


def _lock_worker(url: str, name: str, go, entered, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        go.wait(timeout=30)
        with inv.locked("scheduler-pass", name, 60, wait_s=60):
            entered.put(("in", name))
            entered.put(("out", name))
        out.put(None)
    except BaseException as exc:
        out.put(repr(exc))


def test_processes_take_the_pass_lock_one_at_a_time(inv: Inventory) -> None:
    n = 4
    go, entered, out = MP.Barrier(n), MP.Queue(), MP.Queue()
    procs = [
        MP.Process(target=_lock_worker, args=(inv.url, f"p{i}", go, entered, out)) for i in range(n)
    ]
    for p in procs:
        p.start()
    assert [out.get(timeout=120) for _ in procs] == [None] * n
    for p in procs:
        p.join(timeout=30)
    events = [entered.get(timeout=5) for _ in range(2 * n)]
    # Never two inside: every "in" is followed by the same holder's "out".
    assert all(
        events[i][0] == "in" and events[i + 1] == ("out", events[i][1]) for i in range(0, 2 * n, 2)
    )


# -- the LeaseKeeper -------------------------------------------------------------------
def test_the_keeper_renews_every_third_of_the_ttl_whatever_the_work_does(
    inventory_url: str, tmp_path: Path
) -> None:
    clock = GatedClock()
    inv = Inventory(inventory_url, now=clock)
    inv.sync(SimBackend())
    rid = inv.free_resources(kind="device")[0].resource_id
    inv.acquire_lease(rid, "slow", 300, attempt=1)
    with LeaseKeeper(inv, "slow", 1, [rid], 300, clock=clock, wait=clock.wait) as keeper:
        for _ in range(60):  # ten minutes of 10 s steps
            clock.advance(10)
            assert caught_up(keeper, clock)
            assert inv.lease(rid) is not None
            keeper.check()
    assert keeper.renewals >= 6 and not keeper.lost
    inv.close()


def test_a_keeper_whose_lease_was_taken_over_stops_the_attempt(inv: Inventory, rid: str) -> None:
    inv.acquire_lease(rid, "job", 300, attempt=1)
    keeper = LeaseKeeper(inv, "job", 1, [rid], 300)
    keeper.check()
    inv.acquire_lease(rid, "job", 300, attempt=2)  # remediation placed attempt 2
    assert keeper.renew_now() is False and keeper.lost
    with pytest.raises(LeaseLostError, match="job 'job' attempt 1 lapsed or were taken over"):
        keeper.check()
    with pytest.raises(InvalidRequestError, match="at least one resource"):
        LeaseKeeper(inv, "job", 1, [], 300)


def test_place_jobs_places_all_or_none(inv: Inventory) -> None:
    for job_id in ("a", "b"):
        inv.record_job(job_id, {"kind": "test"})
    inv.place_job("b", ["GPU-x"], attempt=1)  # b moved meanwhile: the batch is stale for it
    with pytest.raises(JobConflictError, match="'b'"):
        inv.place_jobs([("a", ["GPU-y"], 1, "queued", {}), ("b", ["GPU-z"], 1, "queued", {})])
    assert inv.job("a").state == "queued", "nothing of a refused batch is written"
    inv.record_job("c", {"kind": "test"})
    placed = inv.place_jobs(
        [("a", ["GPU-y"], 1, "queued", {"note": 1}), ("c", ["GPU-z"], 1, None, {})]
    )
    assert [(r.job_id, r.state, r.attempt, r.resource_ids) for r in placed] == [
        ("a", "placed", 1, ("GPU-y",)),
        ("c", "placed", 1, ("GPU-z",)),
    ]
    assert inv.job("a").info["note"] == 1
