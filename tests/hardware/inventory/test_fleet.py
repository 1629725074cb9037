"""Reading the fleet: spare roles, device health, what is free to lease, and cordons.
On SQLite and PostgreSQL (``inventory_url``)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import (
    Inventory,
    LeaseConflictError,
    ResourceUnavailableError,
)

from tests.hardware.inventory.helpers import V100, FakeBackend, mig_partition


# -- spares and health -----------------------------------------------------------------
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
    fake.parts[("n1", 1)] = [mig_partition("n1", 1, "MIG-x", "1g.5gb", 0)]
    report = synced.sync(fake)
    assert any("leased whole by 'whole'" in e for e in report.errors)
    assert "MIG-x" not in {r.resource_id for r in synced.free_resources()}
    with pytest.raises(LeaseConflictError, match="leased whole") as err:
        synced.acquire_lease("MIG-x", "part", 60)
    assert err.value.holder == "whole"


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
