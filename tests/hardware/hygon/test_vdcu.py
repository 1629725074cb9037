"""vDCUs: create a set, show, destroy per DCU, and a tool that refuses or does nothing."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    HardwareError,
    InvalidRequestError,
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import HAMI, NODE, Fake, mutating, vdcu

# -- vDCU round trip ------------------------------------------------------------------------


def test_create_show_destroy_round_trip(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()
    fake.clear()
    created = backend.create_partitions(NODE, 0, HAMI)
    creates = [c for c in fake.calls() if "-create-vdevices" in c]
    assert [c for c in creates] == [
        [
            "virtual",
            "-create-vdevices",
            "4",
            "-d",
            "0",
            "-vdevice-compute-units",
            "5,15,20,20",
            "-vdevice-memory-size",
            "4096,8192,8192,8192",
        ]
    ]
    assert [(p.compute_units, p.memory_mb) for p in created] == [
        (5, 4096),
        (15, 8192),
        (20, 8192),
        (20, 8192),
    ]
    assert [p.uuid for p in created] == ["vdcu-0", "vdcu-1", "vdcu-2", "vdcu-3"]
    assert all(p.kind == "vdcu" and p.device_index == 0 and p.node == NODE for p in created)
    assert backend.partitions(NODE, 0) == created
    assert backend.partitions(NODE, 1) == []
    assert backend.partition_mode(NODE, 0) and not backend.partition_mode(NODE, 1)

    # vDCU numbers are host-wide: the next DCU's vDCUs continue after them.
    more = backend.create_partitions(NODE, 1, [vdcu(30, 16000)])
    assert [p.uuid for p in more] == ["vdcu-4"]

    fake.clear()
    backend.destroy_partitions(NODE, 0)
    assert [c for c in fake.calls() if mutating(c)] == [["virtual", "-d", "0", "-destroy-vdevice"]]
    assert backend.partitions(NODE, 0) == []
    assert not backend.partition_mode(NODE, 0)
    assert [p.uuid for p in backend.partitions(NODE, 1)] == ["vdcu-4"]


def test_destroy_with_every_uuid_named_is_allowed(fake: Fake, backend: HygonBackend) -> None:
    created = backend.create_partitions(NODE, 0, HAMI[:2])
    backend.destroy_partitions(NODE, 0, [p.uuid for p in reversed(created)])
    assert backend.partitions(NODE, 0) == []


def test_destroy_subset_unknown_and_bad_ids(fake: Fake, backend: HygonBackend) -> None:
    created = backend.create_partitions(NODE, 0, HAMI[:2])
    fake.clear()
    with pytest.raises(UnsupportedError, match="destroys all vDCUs of a DCU"):
        backend.destroy_partitions(NODE, 0, [created[0].uuid])
    with pytest.raises(InvalidRequestError, match="no partitions"):
        backend.destroy_partitions(NODE, 0, ["vdcu-99"])
    with pytest.raises(InvalidRequestError, match="list of partition ids"):
        backend.destroy_partitions(NODE, 0, "vdcu-0")  # a bare string is not a list
    assert not any(mutating(c) for c in fake.calls())
    assert len(backend.partitions(NODE, 0)) == 2


def test_destroy_nothing_runs_no_destroy(fake: Fake, backend: HygonBackend) -> None:
    backend.destroy_partitions(NODE, 1)
    assert not any(mutating(c) for c in fake.calls())


def test_existing_vdcus_are_refused_before_creating(fake: Fake, backend: HygonBackend) -> None:
    backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    fake.clear()
    with pytest.raises(InvalidRequestError, match="already has partitions"):
        backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    assert not any(mutating(c) for c in fake.calls())


def test_tool_refusing_a_create_is_reported(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()  # the backend believes in 60 CUs ...
    fake.edit(lambda s: s["devices"][0].update(compute_units=30))  # ... the driver now says 30
    with pytest.raises(HardwareError) as err:
        backend.create_partitions(NODE, 0, HAMI)
    assert "-create-vdevices 4" in str(err.value)
    assert "not enough compute units on device 0" in str(err.value)


def test_create_that_silently_does_nothing_is_caught(
    backend: HygonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.discover()
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "noop")
    with pytest.raises(HardwareError, match="created successfully.*not the requested"):
        backend.create_partitions(NODE, 0, HAMI)
