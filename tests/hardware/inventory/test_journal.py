"""The change journal (hardware/inventory/journal.py) and its follower (feed.py), on SQLite
and on PostgreSQL: what the triggers record and what they leave out, pruning, the
migration of a version-2 store, and on PostgreSQL a rev that commits late or never."""

from __future__ import annotations

import pytest
from gpuflow.hardware.inventory import Inventory, schema
from gpuflow.hardware.inventory.feed import ChangeFeed, Changes
from gpuflow.hardware.inventory.triggers import FLEET, JOB, LEASE
from sqlalchemy import MetaData, create_engine, insert, text, update

from tests.hardware.inventory.helpers import FakeBackend, telemetry_sample

SPEC = {"kind": "test"}


def _tail(inv: Inventory, after: int) -> list[tuple[str, str]]:
    return [(entity, key) for _, entity, key in inv.journal_since(after).rows]


def _newest(inv: Inventory) -> int:
    return inv.journal_tail(1)[0]


def test_job_and_lease_writes_are_journaled_renewals_are_not(synced: Inventory, clock) -> None:
    start = _newest(synced)
    synced.record_job("j1", SPEC)
    synced.place_job("j1", ["GPU-n1-1"], attempt=1, expect_state="queued")
    synced.acquire_lease("GPU-n1-1", "j1", 30, attempt=1)
    after_take = _newest(synced)
    synced.renew_lease("GPU-n1-1", "j1", 30, attempt=1)
    synced.renew_leases("j1", 1, ["GPU-n1-1"], 30)
    synced.renew_leases_of({("j1", 1): ["GPU-n1-1"]}, 30)
    assert _newest(synced) == after_take, "a renewal only moves the expiry: not a change"
    synced.release_lease("GPU-n1-1", "j1")
    assert _tail(synced, start) == [
        (JOB, "j1"),
        (JOB, "j1"),
        (LEASE, "GPU-n1-1"),
        (LEASE, "GPU-n1-1"),
    ]
    # An expired lease taken over by someone else is a change of holder.
    synced.acquire_lease("GPU-n2-0", "a", 10)
    clock.t += 11
    mark = _newest(synced)
    synced.acquire_lease("GPU-n2-0", "b", 10)
    assert _tail(synced, mark) == [(LEASE, "GPU-n2-0")]


def test_fleet_changes_are_journaled_telemetry_and_unchanged_syncs_are_not(
    synced: Inventory, fake: FakeBackend
) -> None:
    start = _newest(synced)
    synced.sync(fake)  # nothing changed: only last-seen stamps move
    synced.record_telemetry([telemetry_sample("n1", 0, 5.0)])
    assert _tail(synced, start) == []
    synced.set_device_health("n1", 1, False, "xid 79")
    synced.cordon("n2", reason="maintenance")
    synced.set_node_role("spare1", "active")
    del fake.parts[("n1", 0)]
    synced.sync(fake)
    rows = _tail(synced, start)
    assert {entity for entity, _ in rows} == {FLEET}
    keys = [key for _, key in rows]
    assert keys[:3] == ["GPU-n1-1", "n2", "spare1"]
    assert set(keys[3:]) == {"MIG-a", "MIG-b"}


def test_pruning_keeps_the_newest_and_a_follower_behind_it_is_told(synced: Inventory) -> None:
    feed = ChangeFeed(synced)
    feed.start()
    for n in range(5):
        synced.record_job(f"j{n}", SPEC)
    assert feed.poll() == Changes(jobs=frozenset({"j0", "j1", "j2", "j3", "j4"}))
    assert feed.poll() == Changes()
    synced.record_job("late", SPEC)
    newest = _newest(synced)
    assert synced.prune_journal(keep=0) > 0
    assert synced.prune_journal(keep=0) == 0
    assert synced.journal_since(0).rows == ()
    assert feed.poll() is None, "pruned past the follower: it must read everything again"
    feed.start()
    synced.record_job("after", SPEC)
    assert feed.poll() == Changes(jobs=frozenset({"after"}))
    assert _newest(synced) == newest + 1, "revs go on growing after a prune"


def test_a_version_2_store_is_migrated_with_its_journal(inventory_url: str, clock) -> None:
    Inventory(inventory_url, now=clock).close()
    engine = create_engine(inventory_url)
    with engine.begin() as conn:  # back to what schema version 2 had
        if conn.dialect.name == "sqlite":
            names = conn.execute(text("SELECT name FROM sqlite_master WHERE type='trigger'"))
            for (name,) in list(names):
                conn.execute(text(f"DROP TRIGGER {name}"))
        else:
            conn.execute(text("DROP FUNCTION gf_journal() CASCADE"))
        schema.changes.drop(conn)
        conn.execute(
            update(schema.meta).where(schema.meta.c.key == "schema_version").values(value="2")
        )
        conn.execute(
            insert(schema.nodes).values(
                name="old", region="r", role="active", backend="fake", first_seen=0, last_seen=0
            )
        )
    engine.dispose()
    inv = Inventory(inventory_url, now=clock)
    try:
        start = _newest(inv)
        inv.record_job("j1", SPEC)
        assert _tail(inv, start) == [(JOB, "j1")]
        assert [n.name for n in inv.nodes()] == ["old"]
    finally:
        inv.close()


def _drop_tables(url: str) -> None:
    """Every table of the store at ``url`` dropped (the suite's PostgreSQL is shared)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        found = MetaData()
        found.reflect(conn)
        found.drop_all(conn)
    engine.dispose()


def _insert_job(conn, job_id: str) -> None:  # type: ignore[no-untyped-def]
    """A job row written inside the caller's own (open) transaction."""
    conn.execute(
        insert(schema.jobs).values(
            job_id=job_id,
            spec=SPEC,
            state="queued",
            resource_ids=[],
            last_checkpoint_id=None,
            info={},
            created_at=0,
            updated_at=0,
            attempt=0,
        )
    )


def test_a_feed_waits_for_a_rev_that_commits_late(postgres_url: str) -> None:
    """PostgreSQL: a transaction draws its rev, a later one commits first; the feed
    reports the later one and then, when it commits, the earlier one, once each."""
    _drop_tables(postgres_url)
    now = [0.0]
    inv = Inventory(postgres_url)
    feed = ChangeFeed(inv, gap_wait_s=30.0, clock=lambda: now[0])
    feed.start()
    slow = create_engine(postgres_url)
    try:
        with slow.connect() as conn:
            txn = conn.begin()
            _insert_job(conn, "slow")
            inv.record_job("fast", SPEC)  # a later rev, committed first
            assert feed.poll() == Changes(jobs=frozenset({"fast"}))
            low = feed.low
            txn.commit()
        assert feed.poll() == Changes(jobs=frozenset({"slow"}))
        assert feed.low is not None and low is not None and feed.low > low
        assert feed.poll() == Changes()
        # A rolled-back rev never appears: waited for, then given up on.
        with slow.connect() as conn:
            txn = conn.begin()
            _insert_job(conn, "never")
            txn.rollback()
        inv.record_job("next", SPEC)
        assert feed.poll() == Changes(jobs=frozenset({"next"}))
        stuck = feed.low
        assert feed.poll() == Changes() and feed.low == stuck
        now[0] += 31.0
        assert feed.poll() == Changes()
        assert feed.low is not None and stuck is not None and feed.low > stuck
    finally:
        slow.dispose()
        inv.close()


@pytest.mark.parametrize("gap_wait_s", [-1.0, float("nan")])
def test_a_bad_gap_wait_is_refused(synced: Inventory, gap_wait_s: float) -> None:
    with pytest.raises(ValueError, match="gap_wait_s"):
        ChangeFeed(synced, gap_wait_s=gap_wait_s)


def test_a_store_made_anew_is_a_journal_the_feed_did_not_follow(inventory_url: str, clock) -> None:
    inv = Inventory(inventory_url, now=clock)
    feed = ChangeFeed(inv)
    feed.start()
    inv.record_job("before", SPEC)
    assert feed.poll() == Changes(jobs=frozenset({"before"}))
    _drop_tables(inventory_url)
    Inventory(inventory_url, now=clock).close()  # the tables made again, revs from 1
    inv.record_job("after", SPEC)
    assert feed.poll() is None, "another journal on the same URL: read everything again"
    inv.close()
