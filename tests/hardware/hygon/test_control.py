"""Clocks and power cap: levels, locks, limits, and setters the driver lacks."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    InvalidRequestError,
    UnsupportedError,
)
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import NODE, Fake, mutating

# -- clocks and power ------------------------------------------------------------------------


def test_clocks_lock_and_reset(fake: Fake, backend: HygonBackend) -> None:
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.sm_clock_min_mhz, c.sm_clock_max_mhz) == (1500, 300, 1500)
    assert c.locked_min_mhz is None
    fake.clear()
    backend.set_locked_clocks(NODE, 0, 700, 1300)
    assert [c for c in fake.calls() if mutating(c)] == [["-d", "0", "--setsclk", "1", "2"]]
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.locked_min_mhz, c.locked_max_mhz) == (1200, 800, 1200)
    backend.reset_locked_clocks(NODE, 0)
    c = backend.clocks(NODE, 0)
    assert (c.sm_clock_mhz, c.locked_min_mhz) == (1500, None)


@pytest.mark.parametrize(
    ("lo", "hi", "match"),
    [
        (900, 1100, "no sclk level"),
        (1600, 1700, "no sclk level"),
        (1300, 700, "min_mhz <= max_mhz"),
        (0, 700, "0 < min_mhz"),
        (700.0, 1300, "ints"),
    ],
)
def test_bad_clock_locks_run_no_setter(
    fake: Fake, backend: HygonBackend, lo: object, hi: object, match: str
) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        backend.set_locked_clocks(NODE, 0, lo, hi)  # type: ignore[arg-type]
    assert not any(mutating(c) for c in fake.calls())


def test_power_limits_and_cap(fake: Fake, backend: HygonBackend) -> None:
    lim = backend.power_limits(NODE, 0)
    assert (lim.limit_mw, lim.min_limit_mw, lim.max_limit_mw) == (300_000, 100_000, 300_000)
    fake.clear()
    backend.set_power_limit_mw(NODE, 0, 250_000)
    assert [c for c in fake.calls() if mutating(c)] == [["-d", "0", "--setpoweroverdrive", "250"]]
    assert backend.power_limits(NODE, 0).limit_mw == 250_000
    fake.clear()
    for bad, match in [
        (250_500, "whole watts"),
        (400_000, "outside"),
        (50_000, "outside"),
        ("250000", "int"),
    ]:
        with pytest.raises(InvalidRequestError, match=match):
            backend.set_power_limit_mw(NODE, 0, bad)  # type: ignore[arg-type]
    assert not any(mutating(c) for c in fake.calls())


def test_unknown_model_power_range_is_the_current_cap(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s["devices"][0].update(series="BW1000", max_power_w=450.0))
    lim = backend.power_limits(NODE, 0)
    assert lim.min_limit_mw == lim.max_limit_mw == lim.limit_mw == 450_000


def test_setters_missing_from_help_are_unsupported(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s.update(control=False))
    with pytest.raises(UnsupportedError, match="--setsclk"):
        backend.set_locked_clocks(NODE, 0, 300, 1500)
    with pytest.raises(UnsupportedError, match="--setpoweroverdrive"):
        backend.set_power_limit_mw(NODE, 0, 200_000)
    with pytest.raises(UnsupportedError, match="--resetclocks"):
        backend.reset_locked_clocks(NODE, 0)
    with pytest.raises(UnsupportedError, match="applications clocks"):
        backend.set_applications_clocks(NODE, 0, 1000, 1500)
    assert not any(mutating(c) for c in fake.calls())
