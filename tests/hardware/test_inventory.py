"""The durable inventory: sync, leases (incl. real multi-process races), cordons, spares,
the job control channel and the jobs registry.

Every test that takes a store runs on SQLite and on PostgreSQL (the ``inventory_url``
fixture in tests/conftest.py: a throwaway server, or GPUFLOW_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import multiprocessing as mp
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from gpuflow.hardware.backend import (
    Backend,
    DeviceInfo,
    DeviceLostError,
    InvalidRequestError,
    NodeInfo,
    Partition,
    PartitionRequest,
    TelemetrySample,
    UnsupportedError,
)
from gpuflow.hardware.inventory import (
    ControlTimeoutError,
    Inventory,
    LeaseConflictError,
    LeaseNotHeldError,
    ResourceUnavailableError,
)

from tests.helpers.clock import ManualClock

A100 = "NVIDIA A100-SXM4-40GB"
V100 = "Tesla V100-SXM2-32GB"
DCU = "Hygon DCU Z100"
MP = mp.get_context("fork")


# -- a small fake backend --------------------------------------------------------------
def _dev(node: str, index: int, sku: str = A100, uuid: str | None = None) -> DeviceInfo:
    vendor = "Hygon" if sku == DCU else "NVIDIA"
    kinds = {"A100": ("mig",), "Hygon": ("vdcu",)}
    return DeviceInfo(
        node=node,
        index=index,
        vendor=vendor,  # type: ignore[arg-type]
        sku=sku,
        uuid=uuid or f"GPU-{node}-{index}",
        memory_total_mb=32768 if sku in (V100, DCU) else 40960,
        pci_device_id="0x20B010DE" if sku == A100 else None,
        partition_kinds=kinds.get("A100" if sku == A100 else vendor, ()),  # type: ignore[arg-type]
    )


def _mig(node: str, index: int, uuid: str, profile: str, start: int) -> Partition:
    size = {"3g.20gb": 4, "2g.10gb": 2, "1g.5gb": 1}[profile]
    return Partition(
        node=node,
        device_index=index,
        uuid=uuid,
        profile=profile,
        kind="mig",
        memory_mb=size * 5120,
        placement_start=start,
        placement_size=size,
    )


class FakeBackend(Backend):
    """Discovery and partitions from plain dicts the test edits; the rest is unsupported."""

    name = "fake"

    def __init__(self) -> None:
        self.nodes: dict[str, NodeInfo] = {
            "n1": NodeInfo("n1", "r1", "active", (_dev("n1", 0), _dev("n1", 1))),
            "n2": NodeInfo("n2", "r2", "active", (_dev("n2", 0, V100), _dev("n2", 1, DCU))),
            "spare1": NodeInfo("spare1", "r1", "spare", (_dev("spare1", 0),)),
        }
        self.parts: dict[tuple[str, int], list[Partition]] = {
            ("n1", 0): [
                _mig("n1", 0, "MIG-a", "3g.20gb", 4),
                _mig("n1", 0, "MIG-b", "2g.10gb", 0),
            ],
            ("n2", 1): [
                Partition(
                    node="n2",
                    device_index=1,
                    uuid="VDCU-n2-1-0",
                    profile="vdcu",
                    kind="vdcu",
                    memory_mb=8192,
                    compute_units=15,
                )
            ],
        }
        self.lost: set[tuple[str, int]] = set()

    def discover(self) -> list[NodeInfo]:
        return list(self.nodes.values())

    def partitions(self, node: str, index: int) -> list[Partition]:
        if (node, index) in self.lost:
            raise DeviceLostError(f"{node}:{index} fell off the bus")
        return list(self.parts.get((node, index), []))

    def telemetry(self, node: str, index: int) -> TelemetrySample:
        raise UnsupportedError("fake")

    def partition_profiles(self, node: str, index: int) -> list:  # type: ignore[type-arg]
        return []

    def partition_mode(self, node: str, index: int) -> bool:
        return bool(self.parts.get((node, index)))

    def set_partition_mode(self, node: str, index: int, enabled: bool) -> None:
        raise UnsupportedError("fake")

    def create_partitions(
        self, node: str, index: int, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        raise UnsupportedError("fake")

    def destroy_partitions(self, node: str, index: int, uuids: Sequence[str] | None = None) -> None:
        raise UnsupportedError("fake")

    def clocks(self, node: str, index: int):  # type: ignore[no-untyped-def]
        raise UnsupportedError("fake")

    def set_locked_clocks(self, node: str, index: int, min_mhz: int, max_mhz: int) -> None:
        raise UnsupportedError("fake")

    def reset_locked_clocks(self, node: str, index: int) -> None:
        raise UnsupportedError("fake")

    def set_applications_clocks(
        self, node: str, index: int, mem_clock_mhz: int, sm_clock_mhz: int
    ) -> None:
        raise UnsupportedError("fake")

    def power_limits(self, node: str, index: int):  # type: ignore[no-untyped-def]
        raise UnsupportedError("fake")

    def set_power_limit_mw(self, node: str, index: int, limit_mw: int) -> None:
        raise UnsupportedError("fake")


def _sample(node: str, index: int, t: float, **kw: object) -> TelemetrySample:
    base = dict(
        node=node,
        index=index,
        timestamp_s=t,
        present=True,
        temperature_c=55.0,
        power_mw=120_000,
        energy_mj=5_000_000,
        utilization_ratio=0.5,
        memory_used_mb=1000,
        memory_total_mb=40960,
        sm_clock_mhz=1410,
        power_limit_mw=400_000,
        clock_event_reasons=("SwPowerCap",),
        xids=(48,),
    )
    base.update(kw)
    return TelemetrySample(**base)  # type: ignore[arg-type]


# -- fixtures (clock and inv: tests/hardware/conftest.py) ------------------------------
@pytest.fixture
def fake() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def synced(inv: Inventory, fake: FakeBackend) -> Inventory:
    inv.sync(fake)
    return inv


# -- storage ---------------------------------------------------------------------------
def test_default_store_is_sqlite_wal_in_gpuflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "gh"))
    with Inventory() as inv:
        assert inv.url == f"sqlite:///{tmp_path / 'gh' / 'inventory.db'}"
        inv.sync(FakeBackend())
    db = tmp_path / "gh" / "inventory.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT count(*) FROM gf_devices").fetchone()[0] == 5
    # Durable: a new Inventory on the same file sees the same fleet.
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "gh"))
    assert [n.name for n in Inventory().nodes()] == ["n1", "n2", "spare1"]


def test_bad_url_is_a_clear_error() -> None:
    with pytest.raises(InvalidRequestError, match="not a database URL"):
        Inventory("no such url")


# -- sync ------------------------------------------------------------------------------
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
        devices=(_dev("n1", 0), replace(_dev("n1", 1), memory_total_mb=81920)),
    )
    fake.parts[("n1", 0)] = [
        _mig("n1", 0, "MIG-b", "1g.5gb", 0),
        _mig("n1", 0, "MIG-c", "1g.5gb", 1),
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
    fake.nodes["n1"] = replace(fake.nodes["n1"], devices=(_dev("n1", 0),))
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
    fake.nodes["n1"] = NodeInfo("n1", "r1", "active", (_dev("n1", 0), _dev("n1", 1), _dev("n1", 2)))
    synced.sync(fake)
    synced.cordon("n1", 2, reason="flaky NVLink")
    synced.acquire_lease("GPU-n1-1", "job-1", 60)
    # GPU-n1-1 falls off; GPU-n1-2 now answers as index 1.
    fake.nodes["n1"] = NodeInfo(
        "n1", "r1", "active", (_dev("n1", 0), _dev("n1", 1, uuid="GPU-n1-2"))
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
    fake.nodes["n2"] = replace(fake.nodes["n2"], devices=(_dev("n2", 0, uuid="GPU-n1-0"),))
    with pytest.raises(InvalidRequestError, match="twice"):
        inv.sync(fake)
    assert inv.nodes() == []
    with pytest.raises(InvalidRequestError, match="Backend"):
        inv.sync("not a backend")  # type: ignore[arg-type]


def test_node_role_comes_from_backend_only_once(synced: Inventory, fake: FakeBackend) -> None:
    assert [n.name for n in synced.spare_nodes()] == ["spare1"]
    synced.set_node_role("spare1", "active")
    synced.set_node_role("n2", "spare")
    synced.sync(fake)
    assert [n.name for n in synced.spare_nodes()] == ["n2"]
    with pytest.raises(InvalidRequestError, match="active, spare"):
        synced.set_node_role("n1", "retired")
    with pytest.raises(InvalidRequestError, match="unknown node 'nope'"):
        synced.set_node_role("nope", "spare")


# -- telemetry and health --------------------------------------------------------------
def test_record_telemetry_round_trip_order_and_presence(synced: Inventory) -> None:
    assert synced.last_telemetry("n1", 1) is None
    s1 = _sample("n1", 1, 50.0)
    assert synced.record_telemetry([s1, _sample("n1", 1, 40.0, temperature_c=99.0)]) == 1
    assert synced.last_telemetry("n1", 1) == s1  # the older one did not overwrite it
    assert synced.device("n1", 1).telemetry_at_s == 50.0

    synced.record_telemetry([_sample("n1", 1, 60.0, present=False)])
    assert not synced.device("n1", 1).present
    synced.record_telemetry([_sample("n1", 1, 70.0)])
    assert synced.device("n1", 1).present


def test_record_telemetry_rejects_a_bad_batch_whole(synced: Inventory) -> None:
    with pytest.raises(InvalidRequestError, match="unknown device n1:7"):
        synced.record_telemetry([_sample("n1", 0, 10.0), _sample("n1", 7, 10.0)])
    assert synced.last_telemetry("n1", 0) is None
    with pytest.raises(InvalidRequestError, match="unknown node 'zz'"):
        synced.record_telemetry([_sample("zz", 0, 10.0)])
    with pytest.raises(InvalidRequestError, match="TelemetrySample"):
        synced.record_telemetry([{"node": "n1"}])  # type: ignore[list-item]


def test_unhealthy_device_is_not_free_nor_leasable(synced: Inventory) -> None:
    synced.set_device_health("n1", 1, False, "XID 79 twice")
    assert "GPU-n1-1" not in {r.resource_id for r in synced.free_resources()}
    with pytest.raises(ResourceUnavailableError, match="unhealthy .XID 79 twice"):
        synced.acquire_lease("GPU-n1-1", "job", 10)
    synced.set_device_health("n1", 1, True)
    assert synced.acquire_lease("GPU-n1-1", "job", 10).owner == "job"


# -- free resources --------------------------------------------------------------------
def test_free_resources_and_filters(synced: Inventory) -> None:
    free = {r.resource_id: r for r in synced.free_resources()}
    # n1:0 is split (only its partitions), spare1 is in the spare pool.
    assert set(free) == {"MIG-a", "MIG-b", "GPU-n1-1", "GPU-n2-0", "VDCU-n2-1-0"}
    assert free["MIG-a"].kind == "mig" and free["MIG-a"].profile == "3g.20gb"
    assert free["GPU-n1-1"].memory_mb == 40960 and free["GPU-n1-1"].region == "r1"

    def ids(**kw: object) -> set[str]:
        return {r.resource_id for r in synced.free_resources(**kw)}  # type: ignore[arg-type]

    assert ids(kind="device") == {"GPU-n1-1", "GPU-n2-0"}
    assert ids(kind="vdcu") == {"VDCU-n2-1-0"}
    assert ids(sku=V100) == {"GPU-n2-0"}
    assert ids(sku="a100-40gb") == {"MIG-a", "MIG-b", "GPU-n1-1"}  # an alias works
    assert ids(profile="2g.10gb") == {"MIG-b"}
    assert ids(region="r2") == {"GPU-n2-0", "VDCU-n2-1-0"}
    assert ids(region="r2", kind="mig") == set()
    with pytest.raises(InvalidRequestError, match="device, mig, vdcu"):
        synced.free_resources(kind="gpu")

    synced.acquire_lease("MIG-a", "job", 30)
    synced.cordon("n2", reason="maintenance")
    assert ids() == {"MIG-b", "GPU-n1-1"}
    assert ids(include_cordoned=True) == {"MIG-b", "GPU-n1-1", "GPU-n2-0", "VDCU-n2-1-0"}
    assert all(r.cordoned for r in synced.free_resources(region="r2", include_cordoned=True))
    synced.set_node_role("spare1", "active")
    assert "GPU-spare1-0" in ids()


def test_partition_of_a_device_leased_whole_is_not_free(
    synced: Inventory, fake: FakeBackend
) -> None:
    synced.acquire_lease("GPU-n1-1", "whole", 60)
    fake.parts[("n1", 1)] = [_mig("n1", 1, "MIG-x", "1g.5gb", 0)]
    report = synced.sync(fake)
    assert any("leased whole by 'whole'" in e for e in report.errors)
    assert "MIG-x" not in {r.resource_id for r in synced.free_resources()}
    with pytest.raises(LeaseConflictError, match="leased whole") as err:
        synced.acquire_lease("MIG-x", "part", 60)
    assert err.value.holder == "whole"


# -- leases ----------------------------------------------------------------------------
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


def _open_worker(url: str, i: int, go, out) -> None:  # type: ignore[no-untyped-def]
    try:
        go.wait(timeout=30)
        inv = Inventory(url)
        inv.record_job(f"job-{i}", {"i": i})
        out.put(None)
    except BaseException as exc:
        out.put(repr(exc))


def test_processes_creating_a_fresh_store_together(inventory_url: str) -> None:
    url = inventory_url
    n = 4
    go, out = MP.Barrier(n), MP.Queue()
    procs = [MP.Process(target=_open_worker, args=(url, i, go, out)) for i in range(n)]
    for p in procs:
        p.start()
    errors = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert errors == [None] * n
    assert len(Inventory(url).jobs()) == n


# -- cordons ---------------------------------------------------------------------------
def test_cordons(synced: Inventory) -> None:
    assert not synced.is_cordoned("n1", 0) and synced.cordons() == []
    node_cordon = synced.cordon("n1", reason="kernel upgrade")
    assert (node_cordon.node, node_cordon.index, node_cordon.reason) == (
        "n1",
        None,
        "kernel upgrade",
    )
    assert synced.is_cordoned("n1") and synced.is_cordoned("n1", 1)  # covers its devices
    synced.cordon("n1", 1, reason="XID 48")
    synced.cordon("n1", 1, reason="XID 48 again")  # replaces the reason
    assert [(c.index, c.reason) for c in synced.cordons()] == [
        (None, "kernel upgrade"),
        (1, "XID 48 again"),
    ]
    assert synced.uncordon("n1") is True
    assert not synced.is_cordoned("n1") and not synced.is_cordoned("n1", 0)
    assert synced.is_cordoned("n1", 1)  # its own cordon stays
    assert synced.uncordon("n1", 1) is True and synced.uncordon("n1", 1) is False
    with pytest.raises(InvalidRequestError, match="reason"):
        synced.cordon("n1", 0, reason=" ")
    with pytest.raises(InvalidRequestError, match="unknown device n1:9"):
        synced.cordon("n1", 9, reason="x")
    with pytest.raises(InvalidRequestError, match="unknown node"):
        synced.is_cordoned("n7")
    with pytest.raises(InvalidRequestError, match="device index"):
        synced.cordon("n1", -1, reason="x")


# -- control channel -------------------------------------------------------------------
def _ack_worker(url: str, job_id: str, checkpoint_id: str, out) -> None:  # type: ignore[no-untyped-def]
    try:
        inv = Inventory(url)
        deadline = time.monotonic() + 30
        while (req := inv.poll_control(job_id)) is None:
            if time.monotonic() > deadline:
                raise TimeoutError("no request came")
            time.sleep(0.02)
        inv.ack_control(req.request_id, checkpoint_id)
        out.put(None)
    except BaseException as exc:
        out.put(repr(exc))


def test_control_round_trip_with_a_second_process(inv: Inventory) -> None:
    inv.record_job("train-1", {"model": "lm"}, state="running")  # seeded directly
    out = MP.Queue()
    child = MP.Process(target=_ack_worker, args=(inv.url, "train-1", "ckpt-7", out))
    child.start()
    rid = inv.request_control("train-1", "checkpoint-and-stop")
    acked = inv.wait_for_ack(rid, timeout_s=30, poll_s=0.02)
    assert out.get(timeout=30) is None
    child.join(timeout=30)
    assert (acked.status, acked.checkpoint_id, acked.action) == (
        "acked",
        "ckpt-7",
        "checkpoint-and-stop",
    )
    assert acked.acked_at_s is not None
    assert inv.poll_control("train-1") is None
    assert inv.job("train-1").last_checkpoint_id == "ckpt-7"


def test_control_order_dedupe_ack_and_errors(inv: Inventory, clock: ManualClock) -> None:
    assert inv.poll_control("j") is None
    first = inv.request_control("j", "checkpoint-now")
    assert inv.request_control("j", "checkpoint-now") == first  # still pending: same id
    clock.t = 1001.0
    second = inv.request_control("j", "checkpoint-and-stop")
    other = inv.request_control("k", "checkpoint-now")
    polled = inv.poll_control("j")
    assert polled is not None and (polled.request_id, polled.status) == (first, "pending")
    assert polled.requested_at_s == 1000.0
    clock.t = 1002.0
    acked = inv.ack_control(first, "c1")
    assert (acked.status, acked.acked_at_s, acked.checkpoint_id) == ("acked", 1002.0, "c1")
    assert inv.ack_control(first, "c2").checkpoint_id == "c1"  # first ack wins
    assert inv.poll_control("j").request_id == second  # type: ignore[union-attr]
    assert inv.control_request(other).job_id == "k"
    assert [r.request_id for r in inv.control_requests("j")] == [first, second]
    assert inv.request_control("j", "checkpoint-now") not in (first, second)  # new one
    with pytest.raises(InvalidRequestError, match="checkpoint-now, checkpoint-and-stop"):
        inv.request_control("j", "stop")
    with pytest.raises(InvalidRequestError, match="unknown control request id 999"):
        inv.ack_control(999, "c")
    with pytest.raises(InvalidRequestError, match="checkpoint id"):
        inv.ack_control(second, "")


def test_wait_for_ack_times_out_with_the_request(inv: Inventory) -> None:
    rid = inv.request_control("j", "checkpoint-now")
    start = time.monotonic()
    with pytest.raises(ControlTimeoutError) as err:
        inv.wait_for_ack(rid, timeout_s=0.1, poll_s=0.02)
    assert 0.09 <= time.monotonic() - start < 2
    assert isinstance(err.value, TimeoutError) and err.value.request.status == "pending"


# -- jobs registry ---------------------------------------------------------------------
def test_jobs_registry(inv: Inventory, clock: ManualClock) -> None:
    job = inv.record_job("j1", {"model": "lm", "gpus": 2}, resource_ids=["MIG-a"])
    assert (job.state, job.resource_ids, job.last_checkpoint_id) == ("queued", ("MIG-a",), None)
    assert inv.record_job("j1", {"model": "lm", "gpus": 2}) == job  # retry-safe
    with pytest.raises(InvalidRequestError, match="another spec"):
        inv.record_job("j1", {"model": "other"})
    clock.t = 1001.0
    inv.record_job("j2", {"model": "cnn"})
    inv.place_job("j1", ["MIG-a"], attempt=1)
    inv.transition_job("j1", "running", expect_attempt=1)
    clock.t = 1005.0
    moved = inv.transition_job(
        "j1", "stopped", last_checkpoint_id="ck-3", resource_ids=[], reason="preempted"
    )
    assert (moved.state, moved.last_checkpoint_id, moved.resource_ids) == (
        "stopped",
        "ck-3",
        (),
    )
    assert moved.info == {"reason": "preempted"} and moved.updated_at_s == 1005.0
    assert inv.place_job("j1", ["MIG-a"], attempt=2, node="n1").info == {
        "reason": "preempted",
        "node": "n1",
    }
    inv.transition_job("j1", "running", expect_attempt=2)
    assert [j.job_id for j in inv.jobs()] == ["j1", "j2"]
    assert [j.job_id for j in inv.jobs("queued")] == ["j2"]
    with pytest.raises(InvalidRequestError, match="queued, placed, launching, running"):
        inv.transition_job("j1", "paused")
    with pytest.raises(InvalidRequestError, match="unknown job 'nope'"):
        inv.job("nope")
    with pytest.raises(InvalidRequestError, match="JSON"):
        inv.transition_job("j1", "running", blob=object())
    with pytest.raises(InvalidRequestError, match="resource_ids"):
        inv.record_job("j3", {}, resource_ids="MIG-a")
    assert inv.job("j1").state == "running"


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
