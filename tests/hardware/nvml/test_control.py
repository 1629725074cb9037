"""Clocks and power limits, validated before they are set (hardware/nvml/control.py)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    InvalidRequestError,
)

from tests.hardware.nvml.helpers import NODE, FakeNvml, backend


def _set_calls(fake: FakeNvml) -> list[str]:
    return [c for c in fake.calls if c.startswith("nvmlDeviceSet")]


def test_clock_state():
    fake = FakeNvml(["a100-40gb"])
    c = backend(fake).clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.sm_clock_min_mhz, c.sm_clock_max_mhz) == (210, 210, 1410)
    assert (c.applications_sm_clock_mhz, c.applications_mem_clock_mhz) == (1095, 1215)
    assert c.locked_min_mhz is None


def test_locked_clocks_are_validated_then_set():
    fake = FakeNvml(["a100-40gb"])
    b = backend(fake)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_locked_clocks(NODE, 0, 100, 1410)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_locked_clocks(NODE, 0, 210, 2000)
    with pytest.raises(InvalidRequestError, match="above"):
        b.set_locked_clocks(NODE, 0, 1200, 900)
    with pytest.raises(InvalidRequestError, match="integer"):
        b.set_locked_clocks(NODE, 0, 900.5, 1200)
    assert _set_calls(fake) == []
    b.set_locked_clocks(NODE, 0, 900, 1200)
    assert fake.device(0).locked_clocks_mhz == (900, 1200)
    c = b.clocks(NODE, 0)
    assert (c.locked_min_mhz, c.locked_max_mhz) == (900, 1200) and c.sm_clock_mhz == 900
    b.reset_locked_clocks(NODE, 0)
    assert fake.device(0).locked_clocks_mhz is None and b.clocks(NODE, 0).locked_min_mhz is None


def test_applications_clocks_are_validated_then_set():
    fake = FakeNvml(["v100"])
    b = backend(fake)
    with pytest.raises(InvalidRequestError, match="memory clock 1000"):
        b.set_applications_clocks(NODE, 0, 1000, 1312)
    with pytest.raises(InvalidRequestError, match="SM clock 1313"):
        b.set_applications_clocks(NODE, 0, 877, 1313)
    assert _set_calls(fake) == []
    b.set_applications_clocks(NODE, 0, 877, 1305)
    c = b.clocks(NODE, 0)
    assert (c.applications_mem_clock_mhz, c.applications_sm_clock_mhz) == (877, 1305)


def test_power_limits_validated_then_set():
    fake = FakeNvml(["h100"])
    b = backend(fake)
    lim = b.power_limits(NODE, 0)
    assert (lim.min_limit_mw, lim.max_limit_mw, lim.default_limit_mw, lim.limit_mw) == (
        200_000,
        700_000,
        700_000,
        700_000,
    )
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_power_limit_mw(NODE, 0, 150_000)
    with pytest.raises(InvalidRequestError, match="outside"):
        b.set_power_limit_mw(NODE, 0, 800_000)
    assert _set_calls(fake) == []
    b.set_power_limit_mw(NODE, 0, 450_000)
    assert b.power_limits(NODE, 0).limit_mw == 450_000
    assert b.telemetry(NODE, 0).power_limit_mw == 450_000
