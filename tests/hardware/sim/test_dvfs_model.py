"""The voltage curve and workload character (hardware/sim/dvfs_model.py), and what the
character does in the twin's physics (hardware/sim/physics.py)."""

from __future__ import annotations

import math

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim import physics
from gpuflow.hardware.sim.dvfs_model import (
    ESTIMATED_SHAPE,
    V100_FITTED_SHAPE,
    DvfsShape,
    check_character,
    shape_of,
    time_ratio,
)
from gpuflow.hardware.skus import sku

# -- time_ratio -----------------------------------------------------------------------------


@pytest.mark.parametrize("m", [0.0, 0.25, 0.39, 1.0])
def test_time_ratio_is_one_at_the_max_clock(m: float) -> None:
    assert time_ratio(1530, 1530, m) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("f", [135, 700, 1200, 1530])
def test_fully_memory_bound_work_does_not_slow_down(f: int) -> None:
    assert time_ratio(f, 1530, 1.0) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("f", [135, 700, 1200, 1530])
def test_compute_bound_work_scales_with_the_clock(f: int) -> None:
    assert time_ratio(f, 1530, 0.0) == pytest.approx(1530 / f)


def test_time_ratio_mixes_the_two_parts() -> None:
    assert time_ratio(700, 1400, 0.5) == pytest.approx(0.5 + 0.5 * 2.0)
    assert time_ratio(0, 1400, 0.5) == math.inf


# -- check_character ------------------------------------------------------------------------


@pytest.mark.parametrize("m", [None, 0.0, 0.39, 1.0, 1])
@pytest.mark.parametrize("a", [None, 1e-3, 0.72, 1.0])
def test_check_character_accepts_values_in_range(m: float | None, a: float | None) -> None:
    check_character(m, a)


@pytest.mark.parametrize("bad", [-0.01, 1.01, math.nan, math.inf, True, False, "0.5"])
def test_check_character_rejects_memory_bound_ratio(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match="memory_bound_ratio") as e:
        check_character(bad, None)  # type: ignore[arg-type]
    assert repr(bad) in str(e.value)


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.01, math.nan, -math.inf, True, "1"])
def test_check_character_rejects_activity(bad: object) -> None:
    with pytest.raises(InvalidRequestError, match="activity") as e:
        check_character(0.5, bad)  # type: ignore[arg-type]
    assert repr(bad) in str(e.value)


# -- the voltage curve ----------------------------------------------------------------------


@pytest.mark.parametrize("shape", [ESTIMATED_SHAPE, V100_FITTED_SHAPE])
def test_voltage_is_flat_below_the_knee_and_v_max_at_f_max(shape: DvfsShape) -> None:
    fmax = 1530
    knee = shape.knee_ratio * fmax
    for f in (0.0, 135, 0.5 * knee, knee):
        assert shape.voltage_v(f, fmax) == shape.v_min_v
    assert shape.voltage_v(fmax, fmax) == pytest.approx(shape.v_max_v)
    above = [shape.voltage_v(knee + d, fmax) for d in (1.0, 50.0, 100.0, fmax - knee)]
    assert all(a < b for a, b in zip(above, above[1:], strict=False))
    assert shape.v_min_v < above[0]
    assert shape.switching(fmax, fmax) == pytest.approx(shape.v_max_v**2 * fmax / 1000.0)


def test_shapes_say_where_they_come_from() -> None:
    assert V100_FITTED_SHAPE.fitted and "summary_power_v100.csv" in V100_FITTED_SHAPE.source
    assert not ESTIMATED_SHAPE.fitted
    assert ESTIMATED_SHAPE.cap_headroom == 1.0
    assert 0.0 < V100_FITTED_SHAPE.cap_headroom < 1.0


# -- physics with a workload's activity -----------------------------------------------------


def test_the_v100_uses_the_fitted_shape_and_the_others_the_estimate() -> None:
    assert shape_of("Tesla V100-SXM2-32GB") is V100_FITTED_SHAPE
    assert physics.PowerModel.from_sku(sku("v100")).shape is V100_FITTED_SHAPE
    for name in ("a100-40gb", "h100", "h200"):
        assert physics.PowerModel.from_sku(sku(name)).shape is ESTIMATED_SHAPE
    assert shape_of("no such GPU") is ESTIMATED_SHAPE


@pytest.mark.parametrize("name", ["v100", "a100-40gb", "h100"])
@pytest.mark.parametrize("override", [None, ESTIMATED_SHAPE, V100_FITTED_SHAPE])
def test_every_shape_keeps_the_skus_two_calibration_points(
    name: str, override: DvfsShape | None
) -> None:
    s = sku(name)
    pm = physics.PowerModel.from_sku(s, override)
    assert pm.power_mw(s.sm_clock_max_mhz, 1.0, 1.0) == pytest.approx(s.power_max_limit_mw)
    assert pm.power_mw(s.sm_clock_min_mhz, 0.0, 0.5) == pytest.approx(s.power_idle_mw)


def _controls(s, limit_mw: int, activity: float) -> physics.Controls:  # noqa: ANN001
    return physics.Controls(
        load=1.0,
        power_limit_mw=limit_mw,
        ambient_c=25.0,
        thermal_resistance_c_per_w=s.thermal_resistance_c_per_w,
        activity=activity,
    )


@pytest.mark.parametrize("name", ["v100", "a100-40gb"])
def test_a_light_workload_is_not_capped_by_a_limit_above_what_it_draws(name: str) -> None:
    s = sku(name)
    pm = physics.PowerModel.from_sku(s)
    fmax = s.sm_clock_max_mhz
    light = pm.power_mw(fmax, 1.0, 0.6)
    full = pm.power_mw(fmax, 1.0, 1.0)
    assert light < full
    # A limit the light workload fits under (with the SKU's headroom), the full one not.
    limit = int(light / pm.shape.cap_headroom) + 10_000
    assert limit * pm.shape.cap_headroom < full
    op_light = physics.decide(s, pm, _controls(s, limit, 0.6), 25.0)
    assert op_light.clock_mhz == fmax and "SwPowerCap" not in op_light.reasons
    assert op_light.power_mw == pytest.approx(light)
    op_full = physics.decide(s, pm, _controls(s, limit, 1.0), 25.0)
    assert op_full.clock_mhz < fmax and "SwPowerCap" in op_full.reasons
    assert op_full.power_mw <= limit * pm.shape.cap_headroom


def test_a_binding_limit_settles_at_the_fitted_headroom_on_the_v100() -> None:
    s = sku("v100")
    pm = physics.PowerModel.from_sku(s)
    op = physics.decide(s, pm, _controls(s, 150_000, 0.8), 25.0)
    cap = 150_000 * V100_FITTED_SHAPE.cap_headroom
    assert "SwPowerCap" in op.reasons
    assert op.power_mw <= cap < pm.power_mw(op.clock_mhz + 1, 1.0, 0.8)
