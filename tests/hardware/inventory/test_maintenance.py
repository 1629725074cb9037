"""Reserving devices for a layout change: refused while leased, cordoned otherwise, only
its own cordons lifted; a reservation and a lease of one device never both succeed, even
from two processes at once; jobs placed on vanished partitions are requeued."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import DeviceBusyError, InvalidRequestError
from gpuflow.hardware.inventory import Inventory, JobState, ResourceUnavailableError

from tests.hardware.inventory.helpers import MP, FakeBackend
from tests.helpers.clock import ManualClock

REASON = "partition apply of config 'x'"


def test_a_lease_on_a_partition_refuses_the_reservation_and_nothing_is_cordoned(
    synced: Inventory, clock: ManualClock
) -> None:
    synced.acquire_lease("MIG-b", "job-a", 30)
    with pytest.raises(DeviceBusyError) as ei:
        synced.reserve_devices([("n1", 0), ("n1", 1)], REASON)
    assert ei.value.busy == {"n1:0": ["lease of 'job-a' on MIG-b"]}
    assert synced.cordons() == []
    clock.t += 31  # an expired lease holds nothing
    assert synced.reserve_devices([("n1", 0)], REASON) == [("n1", 0)]


def test_a_reservation_cordons_and_lifts_only_its_own_cordons(synced: Inventory) -> None:
    synced.cordon("n1", 1, reason="health: XID 79")
    assert synced.reserve_devices([("n1", 0), ("n1", 1)], REASON) == [("n1", 0)]
    with pytest.raises(ResourceUnavailableError, match="cordoned: partition apply"):
        synced.acquire_lease("MIG-a", "job-b", 30)
    assert synced.release_devices([("n1", 0), ("n1", 1)], REASON) == 1
    assert [(c.node, c.index, c.reason) for c in synced.cordons()] == [("n1", 1, "health: XID 79")]
    assert synced.acquire_lease("MIG-a", "job-b", 30).owner == "job-b"


def test_bad_reservations_are_refused_naming_what_is_wrong(synced: Inventory) -> None:
    with pytest.raises(InvalidRequestError, match="needs a reason"):
        synced.reserve_devices([("n1", 0)], " ")
    with pytest.raises(InvalidRequestError, match="unknown device n1:7"):
        synced.reserve_devices([("n1", 0), ("n1", 7)], REASON)
    assert synced.cordons() == []


def test_active_jobs_on_vanished_partitions_are_requeued_with_the_reason(
    synced: Inventory, fake: FakeBackend
) -> None:
    synced.record_job("on-a", {"gpus": 1}, state=str(JobState.PLACED), resource_ids=["MIG-a"])
    synced.record_job("on-dev", {"gpus": 1}, state=str(JobState.PLACED), resource_ids=["GPU-n1-1"])
    synced.record_job("done", {"gpus": 1}, state=str(JobState.FINISHED), resource_ids=["MIG-a"])
    fake.parts[("n1", 0)] = fake.parts[("n1", 0)][1:]  # MIG-a destroyed
    synced.sync(fake)
    requeued = synced.invalidate_vanished("repartitioned by test")
    assert [j.job_id for j in requeued] == ["on-a"]
    job = synced.job("on-a")
    assert job.state == JobState.QUEUED and job.resource_ids == ()
    assert job.info["detail"] == "MIG-a no longer exist(s): repartitioned by test"
    assert synced.job("on-dev").state == JobState.PLACED
    assert synced.job("done").state == JobState.FINISHED


def _reserve_paused(url: str, reached, gate, out) -> None:
    """Reserve n1:0, pausing inside the transaction after its lease check."""
    inv = Inventory(url)
    original = Inventory._cordon_rows

    def paused(conn, node, device_uuid):
        reached.set()
        gate.wait(60)
        return original(conn, node, device_uuid)

    Inventory._cordon_rows = staticmethod(paused)  # type: ignore[method-assign]
    try:
        inv.reserve_devices([("n1", 0)], REASON)
        out.put("reserved")
    except DeviceBusyError:
        out.put("busy")
    finally:
        inv.close()


def _lease(url: str, out) -> None:
    inv = Inventory(url)
    try:
        inv.acquire_lease("MIG-a", "job-b", 600)
        out.put("leased")
    except ResourceUnavailableError:
        out.put("cordoned")
    finally:
        inv.close()


def test_a_lease_racing_a_reservation_from_another_process_never_both_succeed(
    synced: Inventory, inventory_url: str
) -> None:
    reached, gate = MP.Event(), MP.Event()
    got_reserve, got_lease = MP.Queue(), MP.Queue()
    reserver = MP.Process(target=_reserve_paused, args=(inventory_url, reached, gate, got_reserve))
    reserver.start()
    assert reached.wait(60)  # the reservation checked leases and holds its transaction
    leaser = MP.Process(target=_lease, args=(inventory_url, got_lease))
    leaser.start()
    leaser.join(timeout=2)  # a lease that does not wait for the reservation ends here
    gate.set()
    reserver.join(timeout=60)
    leaser.join(timeout=60)
    outcome = (got_reserve.get(timeout=5), got_lease.get(timeout=5))
    assert outcome == ("reserved", "cordoned")
