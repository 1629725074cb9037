"""The hard-isolation study: who an event interrupts, and what the sums over fleets say."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from gpuflow.hardware.sim.hazard import DAY_S, fleet_schedule
from gpuflow.tasks.health.isolation_study import (
    CONTAINED,
    CONTAINED_XID,
    CONTEXT,
    DEVICE,
    PARTITIONED,
    SHARED,
    DeviceEvent,
    Events,
    IsolationConfig,
    contained_share,
    draw_device_events,
    expected_reduction,
    interrupted,
    multi_tenant_incidents,
    ratio_needed,
    reduction_ceiling,
    run_study,
    tenant_interruptions,
)

SMALL = IsolationConfig(n_gpus=48, horizon_days=200.0)


def _one_app_error(gpu: int = 0, tenant: int = 0) -> Events:
    return Events((), np.array([gpu]), np.array([tenant]), np.array([10.0]))


@pytest.mark.parametrize("tenants", [1, 2, 4, 7])
def test_a_tenants_fatal_error_interrupts_its_instance_under_mig_and_everyone_under_mps(tenants):
    events = _one_app_error()
    assert tenant_interruptions(events, tenants, SHARED) == tenants
    assert tenant_interruptions(events, tenants, PARTITIONED) == 1
    assert multi_tenant_incidents(events, tenants, SHARED) == (1 if tenants >= 2 else 0)
    assert multi_tenant_incidents(events, tenants, PARTITIONED) == 0


@pytest.mark.parametrize("tenants", [2, 7])
def test_device_faults_take_every_tenant_whatever_the_partitioning(tenants):
    lost = DeviceEvent(0, 5.0, "xid79", 79, DEVICE)
    contained = DeviceEvent(1, 6.0, "hbm", CONTAINED_XID, CONTAINED)
    for mode in (SHARED, PARTITIONED):
        assert tenant_interruptions(Events((lost,), *[np.array([])] * 3), tenants, mode) == tenants
    both = Events((contained,), *[np.array([])] * 3)
    assert tenant_interruptions(both, tenants, SHARED) == tenants
    assert tenant_interruptions(both, tenants, PARTITIONED) == 1


def test_software_sharing_never_interrupts_fewer_tenants_than_partitions():
    for scope in (DEVICE, CONTAINED, CONTEXT):
        for n in range(1, 8):
            assert interrupted(scope, n, SHARED) >= interrupted(scope, n, PARTITIONED)
    for tenants, ratio in ((1, 2.0), (3, 0.5), (7, 4.0)):
        cfg = dataclasses.replace(SMALL, tenants=tenants, app_fatal_ratio=ratio)
        r = run_study(cfg, seeds=3)
        assert np.all(r.per_1000[SHARED] >= r.per_1000[PARTITIONED])
        if tenants == 1:  # one tenant: nothing to isolate it from
            assert np.array_equal(r.per_1000[SHARED], r.per_1000[PARTITIONED])


def test_without_application_errors_only_contained_ecc_errors_make_a_difference():
    tenants, seeds = 4, 3
    plain = dataclasses.replace(SMALL, tenants=tenants, app_fatal_ratio=0.0)
    no_containment = run_study(dataclasses.replace(plain, contained_in_partition=False), seeds)
    assert no_containment.app_events.sum() == 0
    assert np.array_equal(no_containment.per_1000[SHARED], no_containment.per_1000[PARTITIONED])

    contained = run_study(plain, seeds)
    n94 = [
        sum(e.scope == CONTAINED for e in draw_device_events(plain, s)) for s in range(1, seeds + 1)
    ]
    assert sum(n94) > 0  # the fleet is big enough to see some
    gap = (contained.per_1000[SHARED] - contained.per_1000[PARTITIONED]) * plain.tenant_days()
    assert np.allclose(gap / 1000.0, np.array(n94) * (tenants - 1))


def test_device_events_are_the_twins_failures_within_the_horizon():
    events = draw_device_events(SMALL, seed=5)
    horizon = SMALL.horizon_days * DAY_S
    _, schedule = fleet_schedule(5, SMALL.n_gpus, SMALL.hazard, horizon)
    expected = sorted(
        (d.failure_s, g) for g, ds in schedule.items() for d in ds if d.failure_s < horizon
    )
    assert [(e.time_s, e.gpu) for e in events] == expected
    assert all((e.scope == CONTAINED) == (e.xid == CONTAINED_XID) for e in events)


def test_seeds_reproduce_and_differ():
    cfg = dataclasses.replace(SMALL, app_fatal_ratio=1.0)
    a, b = run_study(cfg, seeds=2), run_study(cfg, seeds=2)
    for mode in (SHARED, PARTITIONED):
        assert np.array_equal(a.per_1000[mode], b.per_1000[mode])
    other = run_study(cfg, seeds=2, first_seed=50)
    assert not np.array_equal(a.per_1000[SHARED], other.per_1000[SHARED])


def test_the_monte_carlo_agrees_with_the_closed_form():
    cfg = IsolationConfig(tenants=4, n_gpus=256, horizon_days=365.0, app_fatal_ratio=1.0)
    row = run_study(cfg, seeds=6).summary()
    assert row["reduction_lo"] < row["reduction"] < row["reduction_hi"]
    assert abs(row["reduction"] - row["expected_reduction"]) < 0.03
    assert abs(row["incident_reduction"] - row["expected_incident_reduction"]) < 0.05


def test_the_ratio_needed_reaches_the_target_and_none_above_the_ceiling():
    c = contained_share(IsolationConfig())
    assert 0.0 < c < 1.0
    for n in (6, 7):
        r = ratio_needed(n, 0.82, c)
        assert r is not None and r > 0
        assert math.isclose(expected_reduction(n, r, c), 0.82, rel_tol=1e-9)
        assert expected_reduction(n, r * 0.9, c) < 0.82
    for n in (2, 4):
        assert reduction_ceiling(n) < 0.82
        assert ratio_needed(n, 0.82, c) is None
        assert expected_reduction(n, 1e6, c) < reduction_ceiling(n)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenants", 0),
        ("tenants", 8),
        ("tenants", 2.0),
        ("app_fatal_ratio", -0.1),
        ("app_fatal_ratio", float("nan")),
        ("n_gpus", 0),
        ("horizon_days", 0.0),
        ("horizon_days", float("inf")),
    ],
)
def test_bad_input_is_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        IsolationConfig(**{field: value})


def test_bad_seeds_and_modes_are_refused():
    with pytest.raises(ValueError, match="seeds"):
        run_study(SMALL, seeds=0)
    with pytest.raises(ValueError, match="mode"):
        interrupted(CONTEXT, 2, "timeslice")
    with pytest.raises(ValueError, match="scope"):
        interrupted("node", 2, SHARED)
