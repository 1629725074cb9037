from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim import SimBackend


def test_clock_and_power_ranges_are_validated(quiet: SimBackend) -> None:
    with pytest.raises(InvalidRequestError, match=r"a100-0:0 .*1500 MHz .*210\.\.1410"):
        quiet.set_locked_clocks("a100-0", 0, 210, 1500)
    with pytest.raises(InvalidRequestError, match="min > max"):
        quiet.set_locked_clocks("a100-0", 0, 1000, 900)
    with pytest.raises(InvalidRequestError, match=r"memory clock 999 .*\[1215\]"):
        quiet.set_applications_clocks("a100-0", 0, 999, 1000)
    with pytest.raises(InvalidRequestError, match=r"v100-0:0 .*50000 mW .*100000\.\.300000"):
        quiet.set_power_limit_mw("v100-0", 0, 50_000)
    with pytest.raises(InvalidRequestError, match="no device a100-0:7"):
        quiet.clocks("a100-0", 7)
    c = quiet.clocks("a100-0", 0)
    assert (c.locked_min_mhz, c.locked_max_mhz, c.sm_clock_max_mhz) == (None, None, 1410)


def test_settings_stick_and_reset(quiet: SimBackend) -> None:
    quiet.set_locked_clocks("a100-0", 0, 1000, 1200)
    quiet.set_power_limit_mw("a100-0", 0, 300_000)
    c = quiet.clocks("a100-0", 0)
    assert (c.locked_min_mhz, c.locked_max_mhz) == (1000, 1200)
    assert c.sm_clock_mhz == 1000  # idle runs at the locked floor
    limits = quiet.power_limits("a100-0", 0)
    assert (limits.limit_mw, limits.min_limit_mw, limits.max_limit_mw, limits.default_limit_mw) == (
        300_000,
        100_000,
        400_000,
        400_000,
    )
    quiet.set_workload("a100-0", 0, "j", 1.0)
    assert quiet.clocks("a100-0", 0).sm_clock_mhz == 1200
    quiet.reset_locked_clocks("a100-0", 0)
    assert quiet.clocks("a100-0", 0).sm_clock_mhz < 1410  # the 300 W cap still binds
    assert "SwPowerCap" in quiet.telemetry("a100-0", 0).clock_event_reasons


def test_advance_rejects_negative_time(quiet: SimBackend) -> None:
    with pytest.raises(InvalidRequestError, match="advance"):
        quiet.advance(-1)
