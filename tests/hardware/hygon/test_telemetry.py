"""Telemetry samples, the energy estimate, and missing or unreadable fields."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    TELEMETRY_FIELDS,
    HardwareError,
)
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import FAKE, NODE, Fake

# -- telemetry -------------------------------------------------------------------------------


def test_telemetry_and_energy_estimate(fake: Fake) -> None:
    now = [100.0]
    b = HygonBackend(executable=str(FAKE), node_name=NODE, clock=lambda: now[0])
    s = b.telemetry(NODE, 0)
    assert s.present
    assert s.temperature_c == 41.0  # junction sensor
    assert s.power_mw == 120_000
    assert s.utilization_ratio == pytest.approx(0.35)
    assert (s.memory_used_mb, s.memory_total_mb) == (1024, 32752)
    assert s.sm_clock_mhz == 1500
    assert s.power_limit_mw == 300_000
    assert s.energy_mj == 0  # the estimate starts with this instance
    # hy-smi's output has no ECC, page/row, clock-event or XID fields: absent, not zero.
    assert (s.ecc_corrected_total, s.xids, s.remapped_rows_pending) == (None, None, None)
    assert s.unreadable_fields() == TELEMETRY_FIELDS
    assert b.telemetry_fields(NODE, 0) == frozenset()
    now[0] = 110.0
    assert b.telemetry(NODE, 0).energy_mj == 1_200_000  # 120 W for 10 s
    fake.edit(lambda st: st["devices"][0].update(power_w=200.0))
    now[0] = 120.0
    assert b.energy_mj(NODE, 0) == 1_200_000 + 1_600_000  # trapezoid 120 -> 200 W
    assert b.telemetry(NODE, 1).energy_mj == 0  # per device


def test_telemetry_of_a_device_that_fell_off(fake: Fake, backend: HygonBackend) -> None:
    backend.discover()
    fake.edit(lambda s: s["devices"][1].update(present=False))
    s = backend.telemetry(NODE, 1)
    assert not s.present and s.power_mw == 0
    assert s.xids is None and s.ecc_uncorrected_total is None  # hy-smi never reads them
    assert backend.telemetry(NODE, 0).present


def test_telemetry_missing_or_bad_field_is_an_error(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(lambda s: s["devices"][0].update(hide_fields=["Average Graphics Package Power (W)"]))
    with pytest.raises(HardwareError, match="lacks 'Average Graphics Package Power"):
        backend.telemetry(NODE, 0)
    fake.edit(lambda s: s["devices"][0].update(hide_fields=[], use_pct=250.0))
    with pytest.raises(HardwareError, match="outside 0..100"):
        backend.telemetry(NODE, 0)
    # Fields hy-smi may not report at all are optional.
    fake.edit(
        lambda s: s["devices"][0].update(
            use_pct=1.0, hide_fields=["sclk clock speed:", "Max Graphics Package Power (W)"]
        )
    )
    s = backend.telemetry(NODE, 0)
    assert (s.sm_clock_mhz, s.power_limit_mw) == (0, 0)


def test_garbage_telemetry_after_discovery(
    backend: HygonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend.discover()
    monkeypatch.setenv("FAKE_HY_SMI_MODE", "garbage")
    with pytest.raises(HardwareError, match="Segmentation fault"):
        backend.telemetry(NODE, 0)
    with pytest.raises(HardwareError, match="GARBAGE"):
        backend.partitions(NODE, 0)
