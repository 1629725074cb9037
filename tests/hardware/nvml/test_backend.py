"""NvmlBackend itself: request checks, and a lost GPU across every kind of call."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    DeviceLostError,
    InvalidRequestError,
)

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend


def test_node_and_index_are_checked():
    b = backend(FakeNvml(["a100-40gb"]))
    with pytest.raises(InvalidRequestError, match="not this host"):
        b.telemetry("other-node", 0)
    with pytest.raises(InvalidRequestError, match="no GPU index 3"):
        b.clocks(NODE, 3)


def test_gpu_lost():
    fake = FakeNvml(["h100", "h100"])
    b = backend(fake)
    b.discover()
    fake.inject_xid(1, 79)
    fake.lose_gpu(1)
    s = b.telemetry(NODE, 1)
    assert s.present is False and s.xids == (79,) and s.memory_total_mb == 81559
    with pytest.raises(DeviceLostError, match="lost"):
        b.clocks(NODE, 1)
    with pytest.raises(DeviceLostError):
        b.set_power_limit_mw(NODE, 1, 300_000)
    with pytest.raises(DeviceLostError):
        b.partitions(NODE, 1)
    [node] = b.discover()
    assert [d.index for d in node.devices] == [0]
    assert b.telemetry(NODE, 0).present
