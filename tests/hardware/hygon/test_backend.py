"""HygonBackend's checks: node, index and requests are refused before any command runs."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    InvalidRequestError,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend
from gpuflow.hardware.placement import LayoutError

from tests.hardware.hygon.helpers import FAKE, NODE, Fake, mutating, vdcu


def test_partition_mode(fake: Fake, backend: HygonBackend) -> None:
    backend.set_partition_mode(NODE, 0, True)  # vDCUs need no mode: a no-op
    backend.create_partitions(NODE, 0, [vdcu(10, 1024)])
    with pytest.raises(InvalidRequestError, match="destroy them first"):
        backend.set_partition_mode(NODE, 0, False)
    backend.set_partition_mode(NODE, 1, False)
    assert not any(mutating(c) for c in fake.calls() if "-create-vdevices" not in c)


# -- validation happens before any command ------------------------------------------------------

INVALID = [
    pytest.param(0, [vdcu(5, 1024)] * 5, LayoutError, "at most 4", id="five-vdcus"),
    pytest.param(
        0, [vdcu(40, 1024), vdcu(21, 1024)], LayoutError, "61 compute units", id="cu-over"
    ),
    pytest.param(0, [vdcu(5, 30000), vdcu(5, 3000)], LayoutError, "MiB", id="memory-over"),
    pytest.param(0, [vdcu(5, -1)], LayoutError, "memory", id="negative-memory"),
    pytest.param(0, [vdcu(0, 1024)], LayoutError, "compute unit", id="zero-cu"),
    pytest.param(0, [vdcu(5.5, 1024)], InvalidRequestError, "must be an int", id="float-cu"),
    pytest.param(0, [vdcu(True, 1024)], InvalidRequestError, "must be an int", id="bool-cu"),
    pytest.param(0, [vdcu(5, "1024")], InvalidRequestError, "must be an int", id="str-memory"),
    pytest.param(0, [], InvalidRequestError, "no partition", id="empty"),
    pytest.param(0, vdcu(5, 1024), InvalidRequestError, "list of PartitionRequest", id="not-list"),
    pytest.param(
        0,
        [vdcu(5, 1024), PartitionRequest(profile="2g.15gb")],
        InvalidRequestError,
        "one request",
        id="mixed-kinds",
    ),
    pytest.param(
        0,
        [PartitionRequest(profile="vdcu", compute_units=5, memory_mb=64, placement_start=0)],
        InvalidRequestError,
        "MIG only",
        id="placement-on-vdcu",
    ),
    pytest.param(
        "0; rm -rf /", [vdcu(5, 1024)], InvalidRequestError, "must be an int", id="shell-id"
    ),
    pytest.param(-1, [vdcu(5, 1024)], InvalidRequestError, ">= 0", id="negative-id"),
    pytest.param(7, [vdcu(5, 1024)], InvalidRequestError, "no DCU 7", id="unknown-id"),
    pytest.param(0, [PartitionRequest(profile="2g.15gb")], UnsupportedError, "no MIG", id="no-mig"),
]


@pytest.mark.parametrize(("index", "requests", "error", "match"), INVALID)
def test_invalid_requests_run_no_command(
    fake: Fake, backend: HygonBackend, index: object, requests: object, error: type, match: str
) -> None:
    backend.discover()  # the budgets come from discovery, done once and cached
    fake.clear()
    with pytest.raises(error, match=match):
        backend.create_partitions(NODE, index, requests)  # type: ignore[arg-type]
    assert fake.calls() == []


def test_cold_backend_never_mutates_on_invalid_requests(fake: Fake) -> None:
    for index, requests in [("0; rm -rf /", [vdcu(5, 1)]), (0, [vdcu(5, 1024)] * 5)]:
        cold = HygonBackend(executable=str(FAKE), node_name=NODE)
        with pytest.raises(InvalidRequestError):
            cold.create_partitions(NODE, index, requests)  # type: ignore[arg-type]
    calls = fake.calls()
    assert not any(mutating(c) for c in calls)
    assert not any("rm -rf" in a for c in calls for a in c)


def test_wrong_node_is_refused(fake: Fake, backend: HygonBackend) -> None:
    with pytest.raises(InvalidRequestError, match="not this host"):
        backend.partitions("other-host", 0)
    assert fake.calls() == []
