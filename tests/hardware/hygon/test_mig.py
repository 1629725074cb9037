"""MIG through `hy-smi mig`: profiles, create largest first, destroy."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    InvalidRequestError,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend
from gpuflow.hardware.placement import LayoutError

from tests.hardware.hygon.helpers import NODE, Fake, mutating

# -- MIG ---------------------------------------------------------------------------------------


def _mig_state(s: dict) -> None:
    # The C-3000 "BW" geometry GPUStack's runbook reports: 4 slices, 80 CUs, 65520 MiB.
    s["mig"] = True
    s["devices"][0].update(
        series="BW1000",
        compute_units=80,
        memory_mib=65520,
        mig_profiles=[
            {
                "name": "2g.15gb",
                "id": 5,
                "slices": 1,
                "memory_mib": 16380,
                "max": 4,
                "starts": [0, 1, 2, 3],
                "cus": 20,
            },
            {
                "name": "4g.31gb",
                "id": 3,
                "slices": 2,
                "memory_mib": 32760,
                "max": 2,
                "starts": [0, 2],
                "cus": 40,
            },
            {
                "name": "8g.63gb",
                "id": 0,
                "slices": 4,
                "memory_mib": 65520,
                "max": 1,
                "starts": [0],
                "cus": 80,
            },
        ],
    )


def test_mig_discovery_create_destroy(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(_mig_state)
    d0, d1 = backend.discover()[0].devices
    assert d0.partition_kinds == ("vdcu", "mig") and d1.partition_kinds == ("vdcu",)
    profiles = {p.name: p for p in backend.partition_profiles(NODE, 0) if p.kind == "mig"}
    assert profiles["4g.31gb"].profile_id == 3
    assert profiles["4g.31gb"].placement_starts == (0, 2)
    assert profiles["4g.31gb"].placement_size == 2
    assert profiles["2g.15gb"].max_count == 4
    assert profiles["2g.15gb"].memory_mb == 16384  # hy-smi prints GiB with 2 decimals

    fake.clear()
    created = backend.create_partitions(
        NODE,
        0,
        [PartitionRequest("2g.15gb"), PartitionRequest("4g.31gb"), PartitionRequest("2g.15gb")],
    )
    cgi = [c for c in fake.calls() if "-cgi" in c]
    assert cgi == [  # largest first, the documented syntax
        ["mig", "-cgi", "3", "-C", "-i", "0"],
        ["mig", "-cgi", "5", "-C", "-i", "0"],
        ["mig", "-cgi", "5", "-C", "-i", "0"],
    ]
    assert sorted((p.profile, p.placement_start) for p in created) == [
        ("2g.15gb", 2),
        ("2g.15gb", 3),
        ("4g.31gb", 0),
    ]
    assert backend.partition_mode(NODE, 0)

    fake.clear()
    with pytest.raises(LayoutError):  # no room for 4 more slices
        backend.create_partitions(NODE, 0, [PartitionRequest("8g.63gb")])
    with pytest.raises(UnsupportedError, match="placement"):
        backend.create_partitions(NODE, 0, [PartitionRequest("2g.15gb", placement_start=3)])
    with pytest.raises(InvalidRequestError, match="vDCUs only"):
        backend.create_partitions(NODE, 0, [PartitionRequest("2g.15gb", memory_mb=5)])
    assert not any(mutating(c) for c in fake.calls())

    one = next(p for p in created if p.profile == "4g.31gb")
    backend.destroy_partitions(NODE, 0, [one.uuid])
    assert sorted(p.profile for p in backend.partitions(NODE, 0)) == ["2g.15gb", "2g.15gb"]
    fake.clear()
    backend.destroy_partitions(NODE, 0)
    assert [c for c in fake.calls() if mutating(c)] == [
        ["mig", "-dci", "-i", "0"],
        ["mig", "-dgi", "-i", "0"],
    ]
    assert backend.partitions(NODE, 0) == []
