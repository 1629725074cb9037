"""Leases: conflicts, expiry and take-over, renewal, release, validation, and real
processes racing for the same resources. On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import (
    Inventory,
    LeaseConflictError,
    LeaseNotHeldError,
    ResourceUnavailableError,
)

from tests.hardware.inventory.helpers import MP
from tests.helpers.clock import ManualClock


def test_lease_conflict_names_holder_and_expiry(synced: Inventory, clock: ManualClock) -> None:
    lease = synced.acquire_lease("GPU-n1-1", "job-a", 30)
    assert (lease.owner, lease.expires_at_s, lease.kind, lease.node) == (
        "job-a",
        1030.0,
        "device",
        "n1",
    )
    with pytest.raises(LeaseConflictError, match="'job-a' until 1030") as err:
        synced.acquire_lease("GPU-n1-1", "job-b", 30)
    assert (err.value.holder, err.value.expires_at_s) == ("job-a", 1030.0)
    # The holder asking again extends its own lease, keeping the acquisition time.
    clock.t = 1010.0
    again = synced.acquire_lease("GPU-n1-1", "job-a", 30)
    assert (again.acquired_at_s, again.expires_at_s) == (1000.0, 1040.0)


def test_expired_lease_is_taken_over(synced: Inventory, clock: ManualClock) -> None:
    synced.acquire_lease("MIG-b", "old", 10)
    clock.t = 1010.0  # expires_at == now counts as expired
    taken = synced.acquire_lease("MIG-b", "new", 10)
    assert (taken.owner, taken.acquired_at_s, taken.expires_at_s) == ("new", 1010.0, 1020.0)
    assert synced.release_lease("MIG-b", "old") is False  # a late release cannot hurt "new"
    assert synced.lease("MIG-b").owner == "new"  # type: ignore[union-attr]


def test_renew_only_by_live_owner(synced: Inventory, clock: ManualClock) -> None:
    synced.acquire_lease("GPU-n2-0", "job-a", 10)
    with pytest.raises(LeaseNotHeldError, match="held by 'job-a', not 'job-b'"):
        synced.renew_lease("GPU-n2-0", "job-b", 10)
    clock.t = 1005.0
    renewed = synced.renew_lease("GPU-n2-0", "job-a", 10)
    assert (renewed.renewed_at_s, renewed.expires_at_s) == (1005.0, 1015.0)
    clock.t = 1016.0
    with pytest.raises(LeaseNotHeldError, match="expired"):
        synced.renew_lease("GPU-n2-0", "job-a", 10)
    with pytest.raises(LeaseNotHeldError, match="no lease"):
        synced.renew_lease("GPU-n1-1", "job-a", 10)


def test_release_is_idempotent(synced: Inventory) -> None:
    synced.acquire_lease("GPU-n1-1", "job-a", 10)
    assert synced.release_lease("GPU-n1-1", "job-b") is False
    assert synced.release_lease("GPU-n1-1", "job-a") is True
    assert synced.release_lease("GPU-n1-1", "job-a") is False
    assert synced.release_lease("gone-partition", "job-a") is False  # no error either
    assert synced.acquire_lease("GPU-n1-1", "job-b", 10).owner == "job-b"


def test_leases_listing_and_expire(synced: Inventory, clock: ManualClock) -> None:
    synced.acquire_lease("MIG-a", "job-a", 10)
    synced.acquire_lease("MIG-b", "job-a", 100)
    synced.acquire_lease("GPU-n2-0", "job-b", 100)
    assert [x.resource_id for x in synced.leases(owner="job-a")] == ["MIG-a", "MIG-b"]
    clock.t = 1050.0
    assert [x.resource_id for x in synced.leases()] == ["GPU-n2-0", "MIG-b"]
    assert len(synced.leases(include_expired=True)) == 3
    ended = synced.expire_leases()
    assert [(x.resource_id, x.owner) for x in ended] == [("MIG-a", "job-a")]
    assert synced.expire_leases(2000.0) and synced.leases(include_expired=True) == []


def test_lease_input_validation_and_unavailable(synced: Inventory) -> None:
    with pytest.raises(InvalidRequestError, match="unknown resource 'GPU-nope'"):
        synced.acquire_lease("GPU-nope", "job", 10)
    for ttl in (0, -1, float("nan"), True, "10"):
        with pytest.raises(InvalidRequestError, match="ttl_s"):
            synced.acquire_lease("GPU-n1-1", "job", ttl)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="lease owner"):
        synced.acquire_lease("GPU-n1-1", "", 10)
    with pytest.raises(ResourceUnavailableError, match="2 partition.s.; lease one of them"):
        synced.acquire_lease("GPU-n1-0", "job", 10)
    with pytest.raises(ResourceUnavailableError, match="spare pool"):
        synced.acquire_lease("GPU-spare1-0", "job", 10)
    synced.cordon("n1", 1, reason="ECC storm")
    with pytest.raises(ResourceUnavailableError, match="cordoned: ECC storm"):
        synced.acquire_lease("GPU-n1-1", "job", 10)
    assert synced.leases(include_expired=True) == []


# -- real processes racing -------------------------------------------------------------
def _race_worker(url: str, ids: list[str], owner: str, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        rng = random.Random(owner)
        order = ids[:]
        rng.shuffle(order)
        go.wait(timeout=30)
        won, conflicts = [], 0
        for rid in order:
            try:
                inv.acquire_lease(rid, owner, 600)
                won.append(rid)
            except LeaseConflictError as exc:
                assert exc.holder != owner
                conflicts += 1
        out.put((owner, won, conflicts, None))
    except BaseException as exc:  # report, so the parent fails with the reason
        out.put((owner, [], 0, repr(exc)))


def _race(url: str, ids: list[str], n: int = 8) -> list[tuple[str, list[str], int]]:
    go = MP.Barrier(n)
    out = MP.Queue()
    procs = [
        MP.Process(target=_race_worker, args=(url, ids, f"proc-{i}", go, out)) for i in range(n)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    errors = [r[3] for r in results if r[3]]
    assert not errors, errors
    return [r[:3] for r in results]


def test_processes_racing_never_share_a_resource(synced: Inventory) -> None:
    ids = ["GPU-n1-1", "MIG-a", "MIG-b"]
    results = _race(synced.url, ids)
    won = Counter(rid for _, w, _ in results for rid in w)
    assert won == Counter(ids)  # each resource leased exactly once
    assert sum(c for *_, c in results) == 8 * 3 - 3
    holders = {x.resource_id: x.owner for x in synced.leases()}
    assert holders == {rid: owner for owner, w, _ in results for rid in w}


def test_processes_racing_to_take_over_expired_leases(
    synced: Inventory, clock: ManualClock
) -> None:
    ids = ["GPU-n1-1", "MIG-a", "MIG-b"]
    clock.t = 1000.0  # the children use the real clock: these leases are long expired
    for rid in ids:
        synced.acquire_lease(rid, "dead-job", 5)
    results = _race(synced.url, ids)
    won = Counter(rid for _, w, _ in results for rid in w)
    assert won == Counter(ids)
    assert {x.owner for x in synced.leases(include_expired=True)} <= {
        owner for owner, w, _ in results if w
    }
