"""The scheduler's one-read snapshot and the by-id resource look-up: the same facts as the
separate reads they replace. On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import DeviceSlot, Inventory

from tests.hardware.inventory.helpers import FakeBackend
from tests.helpers.clock import ManualClock


def test_snapshot_holds_what_the_separate_reads_return(
    synced: Inventory, fake: FakeBackend, clock: ManualClock
) -> None:
    synced.acquire_lease("MIG-a", "job-a", 10)  # a partition's lease; lapses below
    synced.acquire_lease("MIG-b", "job-a", 100)
    synced.acquire_lease("GPU-n2-0", "job-b", 100)
    synced.cordon("n2", 0, reason="ECC storm")
    synced.cordon("n1", reason="maintenance")
    synced.set_device_health("n1", 1, False, reason="XID 48")
    synced.record_job("job-a", {"model": "tiny"})
    fake.nodes["n2"] = replace(fake.nodes["n2"], devices=fake.nodes["n2"].devices[:1])
    synced.sync(fake)  # n2:1 is no longer present
    clock.t = 1050.0
    snap = synced.snapshot()
    assert snap.at_s == 1050.0
    assert list(snap.nodes) == synced.nodes()
    assert list(snap.partitions) == synced.partitions()
    assert list(snap.cordons) == synced.cordons() and len(snap.cordons) == 2
    assert [x.resource_id for x in snap.leases] == ["GPU-n2-0", "MIG-b"]
    assert list(snap.leases) == synced.leases()
    assert snap.leases[1].kind == "mig" and snap.leases[1].node == "n1"
    assert list(snap.jobs) == synced.jobs()
    present = synced.devices(present=True)
    assert "GPU-n2-1" not in {d.uuid for d in snap.devices}
    assert [d.healthy for d in snap.devices if d.uuid == "GPU-n1-1"] == [False]
    assert list(snap.devices) == [
        DeviceSlot(
            d.node,
            d.index,
            d.uuid,
            d.vendor,
            d.sku,
            d.memory_total_mb,
            d.partition_kinds,
            d.healthy,
        )
        for d in present
    ]


def test_resources_by_id_in_order_with_cordons_and_a_clear_error(synced: Inventory) -> None:
    synced.cordon("n1", reason="maintenance")
    listed = {r.resource_id: r for r in synced.free_resources(include_cordoned=True)}
    got = synced.resources_by_id(["VDCU-n2-1-0", "MIG-a", "GPU-n2-0"])
    assert got == [listed["VDCU-n2-1-0"], listed["MIG-a"], listed["GPU-n2-0"]]
    assert [r.cordoned for r in got] == [False, True, False]
    assert (got[1].kind, got[1].device_uuid, got[1].region) == ("mig", "GPU-n1-0", "r1")
    assert synced.resource("MIG-a") == got[1]
    # Leased or split, a resource is still found by its id.
    synced.acquire_lease("GPU-n2-0", "job", 30)
    assert synced.resource("GPU-n2-0") == listed["GPU-n2-0"]
    assert synced.resource("GPU-n1-0").kind == "device"
    assert synced.resources_by_id([]) == []
    with pytest.raises(InvalidRequestError, match="unknown resource 'GPU-nope'"):
        synced.resources_by_id(["MIG-a", "GPU-nope"])
