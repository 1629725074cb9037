from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import pytest
from gpuflow.hardware.backend import HardwareError
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.sim import physics as P
from gpuflow.hardware.skus import SKUS, sku
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.mark.parametrize("name", sorted(SKUS))
def test_power_model_is_calibrated_and_rises_with_clock(name: str) -> None:
    s = SKUS[name]
    pm = P.PowerModel.from_sku(s)
    assert pm.power_mw(s.sm_clock_min_mhz, 0.0) == pytest.approx(s.power_idle_mw, rel=1e-6)
    assert pm.power_mw(s.sm_clock_max_mhz, 1.0) == pytest.approx(s.power_max_limit_mw, rel=1e-6)
    assert pm.p_static_mw > 0
    clocks = range(s.sm_clock_min_mhz, s.sm_clock_max_mhz + 1, 15)
    for load in (0.0, 0.5, 1.0):
        powers = [pm.power_mw(f, load) for f in clocks]
        assert all(b > a for a, b in zip(powers, powers[1:], strict=False))
    # Voltage: flat below the knee, rising above it.
    assert pm.voltage_v(s.sm_clock_min_mhz) == pm.voltage_v(P.KNEE_RATIO * s.sm_clock_max_mhz)
    assert pm.voltage_v(s.sm_clock_max_mhz) == pytest.approx(P.V_MAX_V)


def test_thermal_step_is_the_closed_form_rc_solution() -> None:
    s = sku("a100-40gb")
    pm = P.PowerModel.from_sku(s)
    c = P.Controls(
        load=1.0,
        power_limit_mw=s.power_max_limit_mw,
        ambient_c=30.0,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w,
    )
    t0 = 36.0
    tau = s.thermal_time_constant_s
    r = P.advance(s, pm, c, t0, 0.0, tau)
    t_ss = 30.0 + s.thermal_resistance_c_per_w * 400.0
    assert r.temperature_c == pytest.approx(t_ss + (t0 - t_ss) * math.exp(-1.0), abs=1e-9)
    assert r.energy_mj == pytest.approx(400_000 * tau)
    # One long step equals many short ones (no throttling involved).
    many = (t0, 0.0)
    for _ in range(100):
        rr = P.advance(s, pm, c, many[0], many[1], tau / 10)
        many = (rr.temperature_c, rr.energy_mj)
    long = P.advance(s, pm, c, t0, 0.0, 10 * tau)
    assert many[0] == pytest.approx(long.temperature_c, abs=1e-9)
    assert many[1] == pytest.approx(long.energy_mj, rel=1e-12)


def test_clock_rises_with_locked_clock_and_so_does_power(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "job", 1.0)
    samples = []
    for f in (600, 1000, 1410):
        quiet.set_locked_clocks("a100-0", 0, 210, f)
        samples.append(quiet.telemetry("a100-0", 0))
    assert [t.sm_clock_mhz for t in samples] == [600, 1000, 1410]
    powers = [t.power_mw for t in samples]
    assert powers[0] < powers[1] < powers[2]


def test_idle_device_reports_gpu_idle(quiet: SimBackend) -> None:
    t = quiet.telemetry("a100-0", 0)
    s = sku("a100-40gb")
    assert t.present and t.utilization_ratio == 0.0
    assert t.sm_clock_mhz == s.sm_clock_min_mhz
    assert t.power_mw == s.power_idle_mw
    assert "GpuIdle" in t.clock_event_reasons


def test_hot_device_throttles(quiet: SimBackend) -> None:
    # hot-0 sits in a 60 degC room: full load at max clock would settle at 100 degC.
    quiet.set_workload("hot-0", 0, "job", 1.0)
    quiet.set_workload("a100-0", 0, "cool", 1.0)
    quiet.advance(1800)
    hot = quiet.telemetry("hot-0", 0)
    cool = quiet.telemetry("a100-0", 0)
    s = sku("a100-40gb")
    assert cool.sm_clock_mhz == s.sm_clock_max_mhz and cool.clock_event_reasons == ()
    assert hot.sm_clock_mhz < s.sm_clock_max_mhz
    assert "SwThermalSlowdown" in hot.clock_event_reasons
    assert hot.temperature_c <= s.slowdown_temp_c
    assert hot.temperature_c == pytest.approx(s.slowdown_temp_c - P.SW_THERMAL_MARGIN_C, abs=0.5)
    assert hot.power_mw < cool.power_mw


def test_power_cap_lowers_clock_and_power(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 1, "job", 1.0)
    quiet.advance(600)
    before = quiet.telemetry("a100-0", 1)
    quiet.set_power_limit_mw("a100-0", 1, 250_000)
    quiet.advance(600)
    after = quiet.telemetry("a100-0", 1)
    assert after.sm_clock_mhz < before.sm_clock_mhz
    assert after.power_mw <= 250_000 < before.power_mw
    assert after.power_limit_mw == 250_000
    assert "SwPowerCap" in after.clock_event_reasons
    assert after.temperature_c < before.temperature_c


def test_application_clocks_cap_the_clock(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "job", 1.0)
    quiet.set_applications_clocks("a100-0", 0, 1215, 1095)
    t = quiet.telemetry("a100-0", 0)
    assert t.sm_clock_mhz == 1095
    assert "ApplicationsClocksSetting" in t.clock_event_reasons
    c = quiet.clocks("a100-0", 0)
    assert (c.applications_sm_clock_mhz, c.applications_mem_clock_mhz) == (1095, 1215)
    quiet.reset_applications_clocks("a100-0", 0)
    assert quiet.telemetry("a100-0", 0).sm_clock_mhz == 1410


def test_a_year_of_fast_forward_takes_seconds(twin: SimBackend) -> None:
    twin.set_workload("a100-0", 0, "job", 0.7)
    start = time.perf_counter()
    twin.advance(365 * 86_400)
    twin.telemetry("a100-0", 0)
    assert time.perf_counter() - start < 5.0


QUIET_YAML = """
name: hyp
seed: 3
faults: {natural: false}
nodes:
  - {name: a100-0, region: r, role: active, devices: [{sku: a100-40gb, count: 2}]}
  - {name: hot-0, region: r, role: active, ambient_c: 60, devices: [{sku: a100-40gb, count: 1}]}
"""

OPS = st.one_of(
    st.tuples(
        st.just("load"), st.sampled_from(["a100-0:0", "a100-0:1", "hot-0:0"]), st.floats(0, 1)
    ),
    st.tuples(st.just("clear"), st.sampled_from(["a100-0:0", "a100-0:1", "hot-0:0"]), st.none()),
    st.tuples(st.just("advance"), st.none(), st.floats(0, 7 * 86_400)),
    st.tuples(
        st.just("cap"), st.sampled_from(["a100-0:0", "hot-0:0"]), st.integers(100_000, 400_000)
    ),
    st.tuples(st.just("lock"), st.sampled_from(["a100-0:0", "a100-0:1"]), st.integers(210, 1410)),
    st.tuples(
        st.just("fault"),
        st.sampled_from(["a100-0:0", "a100-0:1", "hot-0:0"]),
        st.sampled_from(["xid79", "thermal", "hbm", "ecc-uncorrectable"]),
    ),
    st.tuples(st.just("repair"), st.sampled_from(["a100-0:0", "a100-0:1", "hot-0:0"]), st.none()),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, min_size=1, max_size=12))
def test_energy_counter_never_falls(ops: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "spec.yaml"
        spec.write_text(QUIET_YAML, encoding="utf-8")
        twin = SimBackend(home=Path(d), spec_path=spec)
        keys = ["a100-0:0", "a100-0:1", "hot-0:0"]
        last = {k: twin.energy_mj(*_split(k)) for k in keys}
        for op, key, arg in ops:
            try:
                if op == "load":
                    twin.set_workload(*_split(key), owner=f"w-{key}", utilization_ratio=arg)
                elif op == "clear":
                    twin.clear_workload(f"w-{key}")
                elif op == "advance":
                    twin.advance(arg)
                elif op == "cap":
                    twin.set_power_limit_mw(*_split(key), arg)
                elif op == "lock":
                    twin.set_locked_clocks(*_split(key), 210, arg)
                elif op == "fault":
                    twin.inject_fault(*_split(key), arg)
                else:
                    twin.repair(*_split(key))
            except HardwareError:
                pass  # refused on a lost/failed device: fine, nothing changed
            for k in keys:
                e = twin.energy_mj(*_split(k))
                assert e >= last[k]
                last[k] = e


def _split(key: str) -> tuple[str, int]:
    node, index = key.split(":")
    return node, int(index)
