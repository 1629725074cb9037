"""Leases taken and renewed in batches, one transaction each: the same outcome as one at a
time, all or nothing. On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory, LeaseConflictError, ResourceUnavailableError

from tests.helpers.clock import ManualClock


def test_acquire_leases_takes_all_or_none(synced: Inventory) -> None:
    taken = synced.acquire_leases(["MIG-a", "GPU-n1-1"], "gang", 30, attempt=2)
    assert [(x.resource_id, x.owner, x.attempt, x.kind) for x in taken] == [
        ("MIG-a", "gang", 2, "mig"),
        ("GPU-n1-1", "gang", 2, "device"),
    ]
    assert taken[0].token < taken[1].token  # each new holder gets its own fencing token
    with pytest.raises(LeaseConflictError, match="'gang'"):
        synced.acquire_leases(["GPU-n2-0", "GPU-n1-1"], "other", 30)
    assert synced.lease("GPU-n2-0") is None  # the first one was not taken either
    with pytest.raises(ResourceUnavailableError, match="spare pool"):
        synced.acquire_leases(["MIG-b", "GPU-spare1-0"], "other", 30)
    assert synced.lease("MIG-b") is None
    with pytest.raises(InvalidRequestError, match="unknown resource 'GPU-nope'"):
        synced.acquire_leases(["GPU-nope"], "other", 30)
    # Asked again by the same (owner, attempt): extended, same tokens.
    again = synced.acquire_leases(["MIG-a", "GPU-n1-1"], "gang", 60, attempt=2)
    assert [x.token for x in again] == [x.token for x in taken]


def test_renew_leases_of_counts_per_owner_and_attempt(
    synced: Inventory, clock: ManualClock
) -> None:
    synced.acquire_leases(["MIG-a", "MIG-b"], "a", 100, attempt=1)
    synced.acquire_lease("GPU-n2-0", "b", 10, attempt=3)
    synced.acquire_lease("GPU-n1-1", "c", 100, attempt=2)
    clock.t = 1050.0  # b's lease has lapsed
    renewed = synced.renew_leases_of(
        {
            ("a", 1): ["MIG-a", "MIG-b"],
            ("b", 3): ["GPU-n2-0"],
            ("c", 1): ["GPU-n1-1"],  # c holds it for attempt 2, not 1
            ("d", 0): ["MIG-a"],  # someone else's
            ("e", 0): [],
        },
        300,
    )
    assert renewed == {("a", 1): 2, ("b", 3): 0, ("c", 1): 0, ("d", 0): 0, ("e", 0): 0}
    expiry = {x.resource_id: x.expires_at_s for x in synced.leases()}
    assert expiry == {"MIG-a": 1350.0, "MIG-b": 1350.0, "GPU-n1-1": 1100.0}
    assert synced.renew_leases_of({}, 300) == {}
    with pytest.raises(InvalidRequestError, match="ttl_s"):
        synced.renew_leases_of({("a", 1): ["MIG-a"]}, 0)


def test_acquire_leases_of_takes_every_owners_leases_or_none(synced: Inventory) -> None:
    taken = synced.acquire_leases_of({("a", 1): ["MIG-a", "GPU-n1-1"], ("b", 2): ["MIG-b"]}, 30)
    assert {k: [x.resource_id for x in v] for k, v in taken.items()} == {
        ("a", 1): ["MIG-a", "GPU-n1-1"],
        ("b", 2): ["MIG-b"],
    }
    tokens = [x.token for v in taken.values() for x in v]
    assert len(set(tokens)) == 3, "one fencing token per new holder"
    # One conflict anywhere in the batch: nothing of it is written.
    with pytest.raises(LeaseConflictError, match="'a'"):
        synced.acquire_leases_of({("c", 1): ["GPU-n2-0"], ("d", 1): ["GPU-n1-1"]}, 30)
    assert synced.lease("GPU-n2-0") is None
    with pytest.raises(InvalidRequestError, match="asked for by both"):
        synced.acquire_leases_of({("c", 1): ["GPU-n2-0"], ("d", 1): ["GPU-n2-0"]}, 30)
    # A device split into partitions is refused whole, as one at a time.
    synced.release_lease("MIG-a", "a")
    with pytest.raises(ResourceUnavailableError, match="partition"):
        synced.acquire_leases_of({("e", 1): ["GPU-n1-0"]}, 30)


def test_release_leases_ends_only_the_owners(synced: Inventory) -> None:
    synced.acquire_leases(["MIG-a", "MIG-b"], "a", 30, attempt=1)
    synced.acquire_lease("GPU-n1-1", "b", 30)
    assert synced.release_leases(["MIG-a", "MIG-b", "GPU-n1-1", "GPU-n2-0"], "a") == 2
    assert [x.resource_id for x in synced.leases()] == ["GPU-n1-1"]
    assert synced.release_leases([], "a") == 0
