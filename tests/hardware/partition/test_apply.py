"""Applying plans: all or nothing, idempotent, rolled back on failure."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import Backend, HardwareError, PartitionRequest
from gpuflow.hardware.partition import (
    DeviceLayout,
    PlanApplyError,
    PlanError,
    apply_plan,
    assert_plan,
    load_plan,
    plan_layouts,
)
from gpuflow.hardware.skus import SKU_ALIASES, sku
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hardware.partition.helpers import (
    A100_NODES,
    EXAMPLES,
    PLANS,
    Proxy,
    exact_state,
    make_backend,
)


@pytest.mark.parametrize(
    ("config", "rule", "device"),
    [
        ("too-many-1g", "max-count", "a100-0:0 (NVIDIA A100-SXM4-40GB)"),
        ("too-many-3g", "max-count", "a100-0:1 (NVIDIA A100-SXM4-40GB)"),
        ("over-compute", "compute-slices", "a100-0:0 (NVIDIA A100-SXM4-40GB)"),
        ("mig-on-v100", "no-mig", "v100-0:0 (Tesla V100-SXM2-32GB)"),
        ("vdcu-over-budget", "compute-units", "dcu-0:0 (Hygon DCU Z100)"),
        ("unknown-profile", "unknown-profile", "a100-0:0 (NVIDIA A100-SXM4-40GB)"),
    ],
)
def test_impossible_plans_are_refused_before_anything_changes(
    backend, config, rule, device
) -> None:
    plan = load_plan(PLANS / "impossible.yaml")
    apply_plan(backend, load_plan(EXAMPLES / "mixed-vdcu.yaml"))  # a non-trivial layout
    before = exact_state(backend)
    proxy = Proxy(backend)
    with pytest.raises(PlanError) as ei:
        apply_plan(proxy, plan, config)
    err = ei.value
    assert err.rule == rule and err.device == device and err.config == config
    assert device in str(err) and rule in str(err)
    assert proxy.mutations == 0
    assert exact_state(backend) == before
    with pytest.raises(PlanError):
        assert_plan(backend, plan, config)


def test_one_bad_device_stops_the_whole_plan(backend: Backend) -> None:
    # Entry 0 is fine for a100-0; entry 1 is impossible on a100-1: nothing may change.
    text = """
version: v1
mig-configs:
  c:
    - {nodes: [a100-0], devices: all, mig-enabled: true, mig-devices: {"1g.5gb": 7}}
    - {nodes: [a100-1], devices: [3], mig-enabled: true, mig-devices: {"7g.40gb": 1, "1g.5gb": 1}}
"""
    before = exact_state(backend)
    with pytest.raises(PlanError) as ei:
        apply_plan(backend, load_plan(text), "c")
    assert ei.value.device == "a100-1:3 (NVIDIA A100-SXM4-40GB)" and ei.value.entry == 1
    assert exact_state(backend) == before


def test_nvidia_example_applies_to_the_twins_a100s(backend: Backend) -> None:
    plan = load_plan(PLANS / "nvidia_config.yaml")
    for config, counts in [
        ("all-1g.5gb", {"1g.5gb": 7}),
        ("all-2g.10gb", {"2g.10gb": 3}),
        ("all-3g.20gb", {"3g.20gb": 2}),
        ("all-balanced", {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        ("all-enabled", {}),
    ]:
        report = apply_plan(backend, plan, config, nodes=A100_NODES)
        assert len(report.changed) == 12, config
        assert assert_plan(backend, plan, config, nodes=A100_NODES) == []
        for d in backend.devices():
            if d.node in A100_NODES:
                assert backend.partition_mode(d.node, d.index)
                got = sorted(p.profile for p in backend.partitions(d.node, d.index))
                assert got == sorted(p for p, n in counts.items() for _ in range(n)), config
    report = apply_plan(backend, plan, "custom-config", nodes=["a100-0"])
    by_index = {c.index: c.after for c in report.devices}
    assert not by_index[0].mig_enabled and not by_index[1].mig_enabled
    assert by_index[2].mig_counts() == {"1g.5gb": 7}
    apply_plan(backend, plan, "all-disabled", nodes=A100_NODES)
    assert all(not backend.partitions(n, i) for n in A100_NODES for i in range(4))


def test_apply_is_idempotent_and_touches_nothing_the_second_time(backend: Backend) -> None:
    plan = load_plan(EXAMPLES / "mixed-vdcu.yaml")
    first = apply_plan(backend, plan)
    assert first.changed
    proxy = Proxy(backend)
    second = apply_plan(proxy, plan)
    assert second.changed == [] and len(second.unchanged) == len(first.devices)
    assert proxy.mutations == 0
    for change in second.devices:
        assert change.before == change.after


def test_same_profiles_at_other_placements_count_as_applied(backend: Backend) -> None:
    backend.set_partition_mode("a100-0", 0, True)
    backend.create_partitions(
        "a100-0",
        0,
        [
            PartitionRequest("3g.20gb", placement_start=0),
            PartitionRequest("1g.5gb", placement_start=6),
        ],
    )
    plan = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - {nodes: [a100-0], devices: [0], mig-enabled: true, mig-devices: {3g.20gb: 1, 1g.5gb: 1}}\n"
    )
    wanted = plan_layouts(backend, plan, "c")[0]
    # The plan would place them elsewhere, and still counts the device as done.
    assert {r.placement_start for r in wanted.partitions} != {0, 6}
    proxy = Proxy(backend)
    report = apply_plan(proxy, plan, "c")
    assert report.changed == [] and proxy.mutations == 0
    assert assert_plan(backend, plan, "c") == []


def test_vdcu_plans_size_virtual_dcus(backend: Backend) -> None:
    apply_plan(backend, load_plan(EXAMPLES / "mixed-vdcu.yaml"), nodes=["dcu-0"])
    for i in (0, 1):
        parts = backend.partitions("dcu-0", i)
        assert sorted((p.compute_units, p.memory_mb) for p in parts) == [
            (5, 4096),
            (15, 8192),
            (20, 8192),
            (20, 8192),
        ]
        assert all(p.kind == "vdcu" for p in parts)
    five = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - device-filter: dcu-z100\n      devices: [0]\n      mig-enabled: true\n"
        "      vdcu-devices: [" + ", ".join(["{compute-units: 1, memory-mb: 1024}"] * 5) + "]\n"
    )
    with pytest.raises(PlanError) as ei:
        apply_plan(backend, five, "c")
    assert ei.value.rule == "max-count" and ei.value.device == "dcu-0:0 (Hygon DCU Z100)"
    apply_plan(backend, load_plan(EXAMPLES / "all-disabled.yaml"), nodes=["dcu-0"])
    assert not backend.partitions("dcu-0", 0) and not backend.partition_mode("dcu-0", 0)


def test_user_examples_apply_to_the_default_fleet(backend: Backend) -> None:
    for name in ("all-1g.yaml", "all-balanced.yaml", "mixed-vdcu.yaml", "all-disabled.yaml"):
        plan = load_plan(EXAMPLES / name)
        apply_plan(backend, plan)
        assert assert_plan(backend, plan) == [], name


# -- rollback ---------------------------------------------------------------------------------


def _messy_start(backend: Backend) -> None:
    """A layout no plan would produce: odd placements, vDCUs, mode on with nothing."""
    backend.set_partition_mode("a100-0", 0, True)
    backend.create_partitions(
        "a100-0",
        0,
        [
            PartitionRequest("1g.5gb", placement_start=5),
            PartitionRequest("3g.20gb", placement_start=0),
        ],
    )
    backend.set_partition_mode("a100-0", 2, True)
    backend.set_partition_mode("dcu-0", 1, True)
    backend.create_partitions(
        "dcu-0", 1, [PartitionRequest("vdcu", compute_units=7, memory_mb=3000)]
    )


@pytest.mark.parametrize("fail_create", [1, 3, 5])
def test_a_failed_create_rolls_every_changed_device_back(
    backend: Backend, fail_create: int
) -> None:
    _messy_start(backend)
    before = exact_state(backend)
    proxy = Proxy(backend, fail_create=fail_create)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(proxy, load_plan(EXAMPLES / "mixed-vdcu.yaml"))
    err = ei.value
    assert "injected: create failed" in str(err) and "rolled back" in str(err)
    assert "while creating " in str(err) and err.device in str(err)
    assert err.rollback_failures == {}
    assert err.device.split(" ")[0] in err.rolled_back
    assert exact_state(backend) == before  # same modes, profiles and placements


def test_a_failed_mode_change_rolls_back_too(backend: Backend) -> None:
    _messy_start(backend)
    before = exact_state(backend)
    proxy = Proxy(backend, fail_mode=3)
    with pytest.raises(PlanApplyError, match="MIG mode") as ei:
        apply_plan(proxy, load_plan(EXAMPLES / "all-balanced.yaml"))
    assert len(ei.value.rolled_back) >= 1
    assert exact_state(backend) == before


def test_a_rollback_that_fails_says_so(backend: Backend) -> None:
    class Broken(Proxy):
        def create_partitions(self, node, index, requests):
            if self.creates >= 1:  # the apply's second create and every rollback create
                self.creates += 1
                raise HardwareError("device wedged")
            return super().create_partitions(node, index, requests)

    _messy_start(backend)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(Broken(backend), load_plan(EXAMPLES / "all-1g.yaml"))
    assert ei.value.rollback_failures and "ROLLBACK FAILED" in str(ei.value)
    assert "a100-0:0" in ei.value.rollback_failures


# -- property: apply or refuse, never an impossible layout --------------------------------------

_FLEET = {
    "n-a100-40": ["a100-40gb"],
    "n-a100-80": ["a100-80gb"],
    "n-h100": ["h100"],
    "n-h200": ["h200"],
    "n-v100": ["v100"],
    "n-dcu": ["dcu-z100"],
}
_ALL_PROFILES = sorted(
    {p.name for s in ("a100-40gb", "a100-80gb", "h200") for p in sku(s).mig_profiles}
)


def _mig_entry_for(alias: str) -> st.SearchStrategy[dict]:
    # Mostly the SKU's own profiles and small counts (layouts that may fit); sometimes any
    # profile (unknown on this SKU) or big counts (over a limit).
    own = [p.name for p in sku(alias).mig_profiles] or _ALL_PROFILES
    names = st.one_of(*[st.sampled_from(own)] * 4, st.sampled_from(_ALL_PROFILES))
    counts = st.one_of(*[st.integers(1, 2)] * 4, st.integers(0, 8))
    return st.fixed_dictionaries(
        {
            "device-filter": st.just(alias),
            "devices": st.just("all"),
            "mig-enabled": st.just(True),
            "mig-devices": st.dictionaries(names, counts, min_size=1, max_size=3),
        }
    )


_MIG_ALIASES = ["a100-40gb", "a100-80gb", "h100", "h200"]
_mig_entry = st.one_of(
    *[st.sampled_from(_MIG_ALIASES)] * 4, st.sampled_from(sorted(SKU_ALIASES))
).flatmap(_mig_entry_for)

_vdcu_entry = st.fixed_dictionaries(
    {
        "device-filter": st.sampled_from(["dcu-z100", "a100-40gb"]),
        "devices": st.just("all"),
        "mig-enabled": st.just(True),
        "vdcu-devices": st.lists(
            st.fixed_dictionaries(
                {"compute-units": st.integers(1, 40), "memory-mb": st.integers(256, 20000)}
            ),
            max_size=5,
        ),
    }
)
_off_entry = st.fixed_dictionaries(
    {
        "device-filter": st.sampled_from(sorted(SKU_ALIASES)),
        "devices": st.just("all"),
        "mig-enabled": st.just(False),
    }
)
_plans = st.lists(
    st.one_of(_mig_entry, _mig_entry, _vdcu_entry, _off_entry), min_size=1, max_size=2
)


def _check_device_invariants(backend: Backend) -> None:
    for d in backend.devices():
        parts = backend.partitions(d.node, d.index)
        profiles = {p.name: p for p in backend.partition_profiles(d.node, d.index)}
        if not parts:
            continue
        assert backend.partition_mode(d.node, d.index)
        assert sum(p.memory_mb for p in parts) <= d.memory_total_mb
        mig = [p for p in parts if p.kind == "mig"]
        vdcu = [p for p in parts if p.kind == "vdcu"]
        assert not (mig and vdcu)
        if mig:
            assert sum(profiles[p.profile].compute_slices for p in mig) <= 7
            assert sum(profiles[p.profile].placement_size for p in mig) <= 8
            slices = [
                s
                for p in mig
                for s in range(
                    p.placement_start, p.placement_start + profiles[p.profile].placement_size
                )
            ]
            assert len(slices) == len(set(slices)) and max(slices) < 8
            for p in mig:
                assert p.placement_start in profiles[p.profile].placement_starts
            for name, prof in profiles.items():
                assert sum(p.profile == name for p in mig) <= prof.max_count
        if vdcu:
            budget = profiles["vdcu"]
            assert len(vdcu) <= budget.max_count
            assert sum(p.compute_units or 0 for p in vdcu) <= budget.compute_slices


@pytest.fixture(scope="module")
def twin_per_sku(tmp_path_factory: pytest.TempPathFactory) -> Backend:
    return make_backend(tmp_path_factory.mktemp("twin"), _FLEET)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(entries=_plans)
def test_random_plans_apply_within_limits_or_change_nothing(twin_per_sku: Backend, entries) -> None:
    backend = twin_per_sku
    plan = load_plan({"version": "v1", "mig-configs": {"p": entries}})
    before = exact_state(backend)
    try:
        report = apply_plan(backend, plan, "p")
    except PlanError:
        assert exact_state(backend) == before
        return
    _check_device_invariants(backend)
    assert assert_plan(backend, plan, "p") == []
    for change in report.devices:
        assert isinstance(change.after, DeviceLayout)
        assert change.changed != change.before.same_as(change.after)
