"""SimBackend.device_delay_s: the extra time a tenant's work takes at the clock its device
runs now, for the tenant's character; and the cluster spec's workload_defaults."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.sim import SimBackend, physics
from gpuflow.hardware.sim.cluster_spec import (
    DEFAULT_ACTIVITY,
    DEFAULT_MEMORY_BOUND_RATIO,
    ClusterSpecError,
    parse_cluster_spec,
)
from gpuflow.hardware.sim.dvfs_model import V100_FITTED_SHAPE
from gpuflow.hardware.skus import sku

V = ("v100-0", 0)
FMAX = 1530  # Tesla V100-SXM2: 135..1530 MHz, 100..300 W
FLEET = {
    "name": "delay",
    "seed": 3,
    "faults": {"natural": False},
    "nodes": [
        {"name": "v100-0", "region": "r1", "role": "active", "devices": [{"sku": "v100"}]},
        {"name": "a100-0", "region": "r1", "role": "active", "devices": [{"sku": "a100-40gb"}]},
    ],
}


def _expected_delay(busy_s: float, limit_mw: int, m: float, activity: float) -> float:
    """From physics alone: the clock the V100's cap allows, then the time formula."""
    pm = physics.PowerModel.from_sku(sku("v100"))
    f = pm.max_clock_for_power(limit_mw * V100_FITTED_SHAPE.cap_headroom, 1.0, 135, FMAX, activity)
    assert f < FMAX  # the limit binds
    return busy_s * (m + (1.0 - m) * FMAX / f - 1.0)


def test_no_delay_at_max_clock_with_nothing_limiting(quiet: SimBackend) -> None:
    quiet.report_workload(*V, "job", 1.0, memory_bound_ratio=0.0, activity=0.6)
    assert quiet.clocks(*V).sm_clock_mhz == FMAX
    assert abs(quiet.device_delay_s(*V, "job", 10.0)) < 1e-9
    quiet.report_workload("a100-0", 0, "other", 1.0, memory_bound_ratio=0.0, activity=0.8)
    assert abs(quiet.device_delay_s("a100-0", 0, "other", 10.0)) < 1e-9
    assert quiet.device_delay_s(*V, "job", 0.0) == 0.0


def test_a_lower_power_limit_delays_by_the_time_ratio(quiet: SimBackend) -> None:
    quiet.report_workload(*V, "job", 1.0, memory_bound_ratio=0.2, activity=0.8)
    quiet.set_power_limit_mw(*V, 150_000)
    delay = quiet.device_delay_s(*V, "job", 10.0)
    assert delay > 0.5
    assert delay == pytest.approx(_expected_delay(10.0, 150_000, 0.2, 0.8), rel=1e-9)
    # and it scales with the work
    assert quiet.device_delay_s(*V, "job", 20.0) == pytest.approx(2 * delay, rel=1e-9)


def test_a_memory_bound_tenant_is_slowed_less(quiet: SimBackend) -> None:
    quiet.report_workload(*V, "mem", 0.5, memory_bound_ratio=0.9, activity=0.8)
    quiet.report_workload(*V, "gemm", 0.5, memory_bound_ratio=0.0, activity=0.8)
    quiet.set_power_limit_mw(*V, 150_000)
    mem = quiet.device_delay_s(*V, "mem", 10.0)
    gemm = quiet.device_delay_s(*V, "gemm", 10.0)
    assert 0.0 < mem < gemm
    assert mem == pytest.approx(_expected_delay(10.0, 150_000, 0.9, 0.8), rel=1e-9)
    assert gemm == pytest.approx(_expected_delay(10.0, 150_000, 0.0, 0.8), rel=1e-9)


def test_an_unregistered_tenant_counts_with_the_specs_defaults(
    write_spec: Callable[..., Path],
) -> None:
    spec = {**FLEET, "workload_defaults": {"memory_bound_ratio": 0.7, "activity": 0.9}}
    twin = SimBackend(spec_path=write_spec(spec, "defaults.yaml"))
    twin.set_power_limit_mw(*V, 150_000)
    delay = twin.device_delay_s(*V, "not-yet", 10.0)  # idle device: clock with its kernel
    assert delay == pytest.approx(_expected_delay(10.0, 150_000, 0.7, 0.9), rel=1e-9)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "1"])
def test_invalid_busy_time_is_rejected(quiet: SimBackend, bad: object) -> None:
    quiet.report_workload(*V, "job", 1.0)
    with pytest.raises(InvalidRequestError, match="busy_s"):
        quiet.device_delay_s(*V, "job", bad)  # type: ignore[arg-type]


def test_unknown_device_and_a_tenant_elsewhere_are_rejected(quiet: SimBackend) -> None:
    quiet.report_workload("a100-0", 0, "job", 1.0)
    with pytest.raises(InvalidRequestError, match="no device nope:0"):
        quiet.device_delay_s("nope", 0, "job", 1.0)
    with pytest.raises(InvalidRequestError, match=r"'job' runs on a100-0:0, not v100-0:0"):
        quiet.device_delay_s(*V, "job", 1.0)
    assert quiet.tenants()["job"]["index"] == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"memory_bound_ratio": 1.5}, "memory_bound_ratio"),
        ({"memory_bound_ratio": math.nan}, "memory_bound_ratio"),
        ({"activity": 0.0}, "activity"),
        ({"activity": True}, "activity"),
    ],
)
def test_bad_character_changes_nothing(
    quiet: SimBackend, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        quiet.report_workload(*V, "new", 1.0, **kwargs)  # type: ignore[arg-type]
    assert quiet.workload_status("new") == "absent"
    quiet.report_workload(*V, "job", 0.5, memory_mb=10, memory_bound_ratio=0.3, activity=0.7)
    before = quiet.tenants()["job"]
    with pytest.raises(InvalidRequestError, match=field):
        quiet.set_workload(*V, "job", 1.0, memory_mb=20, **kwargs)  # type: ignore[arg-type]
    after = quiet.tenants()["job"]
    assert after == before
    assert (after["memory_bound_ratio"], after["activity"], after["memory_mb"]) == (0.3, 0.7, 10)


# -- workload_defaults in the cluster spec --------------------------------------------------


def test_workload_defaults_parse_and_default() -> None:
    spec = parse_cluster_spec(
        {**FLEET, "workload_defaults": {"memory_bound_ratio": 0.5, "activity": 0.75}}
    )
    assert (spec.workload_defaults.memory_bound_ratio, spec.workload_defaults.activity) == (
        0.5,
        0.75,
    )
    plain = parse_cluster_spec(FLEET).workload_defaults
    assert (plain.memory_bound_ratio, plain.activity) == (
        DEFAULT_MEMORY_BOUND_RATIO,
        DEFAULT_ACTIVITY,
    )
    partial = parse_cluster_spec({**FLEET, "workload_defaults": {"activity": 0.5}})
    assert partial.workload_defaults.memory_bound_ratio == DEFAULT_MEMORY_BOUND_RATIO


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        ({"memory_bound": 0.5}, r"workload_defaults: .*memory_bound"),
        ([0.5], r"workload_defaults: expected a mapping"),
        ({"memory_bound_ratio": -0.1}, r"workload_defaults\.memory_bound_ratio: .*-0\.1"),
        ({"memory_bound_ratio": True}, r"workload_defaults\.memory_bound_ratio"),
        ({"activity": 0}, r"workload_defaults\.activity: .*got 0"),
        ({"activity": 1.2}, r"workload_defaults\.activity: .*1\.2"),
    ],
)
def test_bad_workload_defaults_name_the_field(raw: object, where: str) -> None:
    with pytest.raises(ClusterSpecError, match=where):
        parse_cluster_spec({**FLEET, "workload_defaults": raw}, source="s.yaml")


def test_a_state_from_before_workload_defaults_still_loads(
    gpuflow_home: Path, write_spec: Callable[..., Path]
) -> None:
    path = write_spec(FLEET, "delay.yaml")
    SimBackend(spec_path=path)
    state_file = gpuflow_home / "twin" / "state.json"
    state = json.loads(state_file.read_text())
    assert "workload_defaults" in state["spec"]
    del state["spec"]["workload_defaults"]
    state_file.write_text(json.dumps(state))
    twin = SimBackend(spec_path=path)  # the same fleet: no "different fleet" error
    twin.set_power_limit_mw(*V, 150_000)
    expected = _expected_delay(10.0, 150_000, DEFAULT_MEMORY_BOUND_RATIO, DEFAULT_ACTIVITY)
    assert twin.device_delay_s(*V, "not-yet", 10.0) == pytest.approx(expected, rel=1e-9)
    twin.report_workload(*V, "job", 1.0)
    assert twin.device_delay_s(*V, "job", 10.0) == pytest.approx(expected, rel=1e-9)
