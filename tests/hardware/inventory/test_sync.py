"""Refreshing the inventory from a backend: fleet, partitions, missing and renumbered
devices, telemetry, and a sync of the digital twin. On SQLite and PostgreSQL
(``inventory_url``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from gpuflow.hardware.backend import InvalidRequestError, NodeInfo, PartitionRequest
from gpuflow.hardware.inventory import Inventory, ResourceUnavailableError

from tests.hardware.inventory.helpers import (
    A100,
    FakeBackend,
    device_info,
    mig_partition,
    telemetry_sample,
)


def test_sync_records_fleet_and_is_idempotent(inv: Inventory, fake: FakeBackend) -> None:
    report = inv.sync(fake)
    assert report.nodes_added == ("n1", "n2", "spare1")
    assert set(report.devices_added) == {"n1:0", "n1:1", "n2:0", "n2:1", "spare1:0"}
    assert set(report.partitions_added) == {"MIG-a", "MIG-b", "VDCU-n2-1-0"}
    assert report.changed and not report.errors

    node = inv.node("n2")
    assert (node.region, node.role, node.backend) == ("r2", "active", "fake")
    dev = inv.device("n1", 0)
    assert (dev.sku, dev.uuid, dev.memory_total_mb, dev.pci_device_id) == (
        A100,
        "GPU-n1-0",
        40960,
        "0x20B010DE",
    )
    assert dev.present and dev.healthy and dev.partition_kinds == ("mig",)
    parts = inv.partitions("n1", 0)
    assert [(p.uuid, p.placement_start, p.compute_units) for p in parts] == [
        ("MIG-b", 0, 2),
        ("MIG-a", 4, 3),
    ]
    vdcu = inv.partitions("n2")[0]
    assert (vdcu.kind, vdcu.compute_units, vdcu.memory_mb) == ("vdcu", 15, 8192)

    again = inv.sync(fake)
    assert not again.changed, again


def test_sync_updates_changes_and_removes_partitions_ending_leases(
    synced: Inventory, fake: FakeBackend
) -> None:
    synced.acquire_lease("MIG-a", "job-1", 60)
    synced.acquire_lease("GPU-n1-1", "job-2", 60)
    fake.nodes["n1"] = replace(
        fake.nodes["n1"],
        region="r9",
        devices=(device_info("n1", 0), replace(device_info("n1", 1), memory_total_mb=81920)),
    )
    fake.parts[("n1", 0)] = [
        mig_partition("n1", 0, "MIG-b", "1g.5gb", 0),
        mig_partition("n1", 0, "MIG-c", "1g.5gb", 1),
    ]
    report = synced.sync(fake)
    assert report.nodes_updated == ("n1",)
    assert report.devices_updated == ("n1:1",)
    assert report.partitions_removed == ("MIG-a",)
    assert report.partitions_added == ("MIG-c",)
    assert report.partitions_updated == ("MIG-b",)
    (ended,) = report.leases_ended
    assert (ended.resource_id, ended.owner, ended.node, ended.device_index, ended.kind) == (
        "MIG-a",
        "job-1",
        "n1",
        0,
        "mig",
    )
    assert [lease.resource_id for lease in synced.leases()] == ["GPU-n1-1"]
    assert synced.device("n1", 1).memory_total_mb == 81920
    assert synced.node("n1").region == "r9"
    assert {p.uuid: p.profile for p in synced.partitions("n1", 0)} == {
        "MIG-b": "1g.5gb",
        "MIG-c": "1g.5gb",
    }


def test_sync_marks_missing_devices_and_keeps_their_leases(
    synced: Inventory, fake: FakeBackend
) -> None:
    synced.acquire_lease("GPU-n1-1", "job-1", 60)
    fake.nodes["n1"] = replace(fake.nodes["n1"], devices=(device_info("n1", 0),))
    report = synced.sync(fake)
    assert report.devices_missing == ("n1:1",)
    assert [lease.owner for lease in report.leases_at_risk] == ["job-1"]
    assert not synced.device("n1", 1).present
    assert synced.lease("GPU-n1-1") is not None  # the holder decides, not sync
    with pytest.raises(ResourceUnavailableError, match="not present"):
        synced.acquire_lease("GPU-n1-1", "job-2", 60)

    fake.nodes["n1"] = FakeBackend().nodes["n1"]
    assert synced.sync(fake).devices_returned == ("n1:1",)
    assert synced.device("n1", 1).present


def test_sync_follows_devices_renumbered_by_uuid(synced: Inventory, fake: FakeBackend) -> None:
    """NVML renumbers survivors when a GPU drops off: state stays with the uuid."""
    fake.nodes["n1"] = NodeInfo(
        "n1", "r1", "active", (device_info("n1", 0), device_info("n1", 1), device_info("n1", 2))
    )
    synced.sync(fake)
    synced.cordon("n1", 2, reason="flaky NVLink")
    synced.acquire_lease("GPU-n1-1", "job-1", 60)
    # GPU-n1-1 falls off; GPU-n1-2 now answers as index 1.
    fake.nodes["n1"] = NodeInfo(
        "n1", "r1", "active", (device_info("n1", 0), device_info("n1", 1, uuid="GPU-n1-2"))
    )
    report = synced.sync(fake)
    assert "n1:1" in report.devices_missing and "n1:1" in report.devices_updated
    moved = synced.device("n1", 1)
    assert (moved.uuid, moved.present) == ("GPU-n1-2", True)
    assert synced.is_cordoned("n1", 1)  # the cordon followed the flaky part
    lease = synced.lease("GPU-n1-1")
    assert lease is not None and lease.owner == "job-1"
    lost = [d for d in synced.devices("n1", present=False)]
    assert [(d.uuid, d.index) for d in lost] == [("GPU-n1-1", 1)]


def test_sync_keeps_partitions_of_a_lost_device_and_reports_it(
    synced: Inventory, fake: FakeBackend
) -> None:
    fake.lost.add(("n1", 0))
    report = synced.sync(fake)
    assert report.devices_missing == ("n1:0",)
    assert any("fell off the bus" in e for e in report.errors)
    assert {p.uuid for p in synced.partitions("n1", 0)} == {"MIG-a", "MIG-b"}
    assert not [r for r in synced.free_resources() if r.node == "n1" and r.device_index == 0]


def test_sync_rejects_inconsistent_backend_before_writing(
    inv: Inventory, fake: FakeBackend
) -> None:
    fake.nodes["n2"] = replace(fake.nodes["n2"], devices=(device_info("n2", 0, uuid="GPU-n1-0"),))
    with pytest.raises(InvalidRequestError, match="twice"):
        inv.sync(fake)
    assert inv.nodes() == []
    with pytest.raises(InvalidRequestError, match="Backend"):
        inv.sync("not a backend")  # type: ignore[arg-type]


# -- telemetry -------------------------------------------------------------------------
def test_record_telemetry_round_trip_order_and_presence(synced: Inventory) -> None:
    assert synced.last_telemetry("n1", 1) is None
    s1 = telemetry_sample("n1", 1, 50.0)
    assert synced.record_telemetry([s1, telemetry_sample("n1", 1, 40.0, temperature_c=99.0)]) == 1
    assert synced.last_telemetry("n1", 1) == s1  # the older one did not overwrite it
    assert synced.device("n1", 1).telemetry_at_s == 50.0

    synced.record_telemetry([telemetry_sample("n1", 1, 60.0, present=False)])
    assert not synced.device("n1", 1).present
    synced.record_telemetry([telemetry_sample("n1", 1, 70.0)])
    assert synced.device("n1", 1).present


def test_record_telemetry_rejects_a_bad_batch_whole(synced: Inventory) -> None:
    with pytest.raises(InvalidRequestError, match="unknown device n1:7"):
        synced.record_telemetry([telemetry_sample("n1", 0, 10.0), telemetry_sample("n1", 7, 10.0)])
    assert synced.last_telemetry("n1", 0) is None
    with pytest.raises(InvalidRequestError, match="unknown node 'zz'"):
        synced.record_telemetry([telemetry_sample("zz", 0, 10.0)])
    with pytest.raises(InvalidRequestError, match="TelemetrySample"):
        synced.record_telemetry([{"node": "n1"}])  # type: ignore[list-item]


# -- against the digital twin ------------------------------------------------------------
def test_sync_the_twin_fleet_partitions_and_leases(inv: Inventory) -> None:
    from gpuflow.hardware.sim import SimBackend

    twin = SimBackend()
    report = inv.sync(twin)
    assert len(report.devices_added) == len(twin.devices()) and not report.errors
    assert not inv.sync(twin).changed
    spare = {n.name for n in inv.spare_nodes()}
    assert spare and not {r.node for r in inv.free_resources()} & spare

    a100 = next(d for d in twin.devices() if "mig" in d.partition_kinds and d.node not in spare)
    twin.set_partition_mode(a100.node, a100.index, True)
    made = twin.create_partitions(a100.node, a100.index, [PartitionRequest("3g.20gb")])
    inv.sync(twin)
    (res,) = inv.free_resources(profile="3g.20gb")
    assert (res.resource_id, res.compute_units, res.node) == (made[0].uuid, 3, a100.node)
    assert a100.uuid not in {r.resource_id for r in inv.free_resources()}

    inv.acquire_lease(res.resource_id, "job", 60)
    twin.destroy_partitions(a100.node, a100.index)
    ended = inv.sync(twin).leases_ended
    assert [(x.resource_id, x.owner) for x in ended] == [(res.resource_id, "job")]

    sample = twin.telemetry(a100.node, a100.index)
    inv.record_telemetry([sample])
    assert inv.last_telemetry(a100.node, a100.index) == sample
