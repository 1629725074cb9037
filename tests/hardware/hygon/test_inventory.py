"""Discovery: models, memory, budgets, and what a driver without `virtual` offers."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend, sku_name_for

from tests.hardware.hygon.helpers import NODE, Fake, vdcu

# -- discovery ----------------------------------------------------------------------------


def test_discovery(backend: HygonBackend) -> None:
    (node,) = backend.discover()
    assert (node.name, node.region, node.role) == (NODE, "cn-north", "active")
    assert [d.index for d in node.devices] == [0, 1]
    d0 = node.devices[0]
    assert d0.vendor == "Hygon"
    assert d0.sku == "Hygon DCU Z100"  # "Z100L" maps onto the SKU table
    assert d0.uuid == "DCU0Z1000000"
    assert d0.memory_total_mb == 32752
    assert d0.partition_kinds == ("vdcu",)
    (profile,) = backend.partition_profiles(NODE, 0)
    assert (profile.name, profile.kind, profile.compute_slices, profile.memory_mb) == (
        "vdcu",
        "vdcu",
        60,
        32752,
    )
    assert profile.max_count == 4
    assert any("mig" in n for n in backend.notes())  # why MIG is absent is recorded


def test_sku_names() -> None:
    assert sku_name_for("K100_AI") == "Hygon DCU K100"
    assert sku_name_for("Z100") == "Hygon DCU Z100"
    assert sku_name_for("BW1000") == "BW1000"


def test_driver_without_virtual_subcommand(fake: Fake, backend: HygonBackend) -> None:
    # Drivers before 6.2.26 ship `hy-virtual`: devices are found, but offer no vDCU.
    fake.edit(lambda s: s.update(virtual=False, label="HCU"))
    fake.edit(lambda s: s["devices"][0].update(series="K100_AI", memory_mib=65520))
    d0 = backend.discover()[0].devices[0]
    assert (d0.sku, d0.memory_total_mb, d0.partition_kinds) == ("Hygon DCU K100", 65520, ())
    assert backend.partition_profiles(NODE, 0) == []
    assert any("hy-smi virtual" in n and "invalid choice" in n for n in backend.notes())
    with pytest.raises(UnsupportedError, match="no vDCUs"):
        backend.create_partitions(NODE, 0, [vdcu(5, 1024)])
    with pytest.raises(UnsupportedError, match="neither vDCUs nor MIG"):
        backend.set_partition_mode(NODE, 0, True)
    assert backend.partitions(NODE, 0) == []
    assert backend.clocks(NODE, 0).sm_clock_mhz == 1500  # "HCU[0]" text lines parse too
