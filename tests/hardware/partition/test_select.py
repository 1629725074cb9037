"""Selecting devices and validating the layout a plan asks of each."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import Backend
from gpuflow.hardware.partition import PlanError, apply_plan, load_plan, plan_layouts

from tests.hardware.partition.helpers import A100_NODES, PLANS


def test_all_balanced_fits_an_a100_only_with_the_3g_at_slice_4(backend: Backend) -> None:
    plan = load_plan(PLANS / "nvidia_config.yaml")
    layouts = plan_layouts(backend, plan, "all-balanced", nodes=["a100-0"])
    assert [lay.index for lay in layouts] == [0, 1, 2, 3]
    for lay in layouts:
        assert lay.mig_enabled and lay.mig_counts() == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
        starts = {r.profile: r.placement_start for r in lay.partitions}
        assert starts["3g.20gb"] == 4
        size = {p.name: p.placement_size for p in backend.partition_profiles("a100-0", lay.index)}
        slices = [r.placement_start + k for r in lay.partitions for k in range(size[r.profile])]
        assert len(slices) == len(set(slices)) == 8


def test_every_problem_is_reported(backend: Backend) -> None:
    with pytest.raises(PlanError) as ei:
        plan_layouts(backend, load_plan(PLANS / "impossible.yaml"), "too-many-1g")
    assert len(ei.value.problems) == 12  # every A100 of the default fleet
    assert "and 11 more" in str(ei.value)


def test_unknown_config_node_and_missing_config_name(backend: Backend) -> None:
    plan = load_plan(PLANS / "nvidia_config.yaml")
    with pytest.raises(PlanError, match="no config 'all-7g'") as ei:
        plan_layouts(backend, plan, "all-7g")
    assert ei.value.rule == "unknown-config"
    with pytest.raises(PlanError, match="name one") as ei:
        apply_plan(backend, plan)
    assert ei.value.rule == "config-required"
    with pytest.raises(PlanError, match="a100-9") as ei:
        apply_plan(backend, plan, "all-disabled", nodes=["a100-9"])
    assert ei.value.rule == "unknown-node"


def test_compute_instance_profiles_are_refused_with_a_reason(backend: Backend) -> None:
    plan = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - {device-filter: a100-40gb, devices: all, mig-enabled: true, mig-devices: {1c.2g.10gb: 1}}\n"
    )
    with pytest.raises(PlanError, match="compute-instance profiles") as ei:
        plan_layouts(backend, plan, "c")
    assert ei.value.rule == "unknown-profile"


def test_generic_entries_skip_devices_that_cannot_do_it(backend: Backend) -> None:
    # mig-parted skips non MIG-capable GPUs under "devices: all": V100s and DCUs here.
    plan = load_plan(PLANS / "nvidia_config.yaml")
    layouts = plan_layouts(backend, plan, "all-1g.5gb")
    assert {lay.node for lay in layouts} == set(A100_NODES)
    # "all-disabled" does reach every device (DCUs lose their vDCUs; V100s are already so).
    assert len(plan_layouts(backend, plan, "all-disabled")) == len(backend.devices())
    # Named explicitly, a V100 cannot take MIG: refused, not skipped.
    explicit = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - {nodes: [v100-0], devices: [0], mig-enabled: true, mig-devices: {}}\n"
    )
    with pytest.raises(PlanError) as ei:
        plan_layouts(backend, explicit, "c")
    assert ei.value.rule == "no-mig" and ei.value.device.startswith("v100-0:0")


@pytest.mark.parametrize(
    "flt",
    [
        "0x20B010DE",
        "0x20b010de",
        "a100-40gb",
        "A100-40GB",
        "NVIDIA A100-SXM4-40GB",
        "[0x1DB510DE, a100-40gb]",
    ],
)
def test_device_filters_by_pci_id_or_sku(backend: Backend, flt: str) -> None:
    plan = load_plan(
        f"version: v1\nmig-configs:\n  c:\n    - {{device-filter: {flt}, devices: all, mig-enabled: false}}\n"
    )
    layouts = plan_layouts(backend, plan, "c")
    skus = {lay.sku for lay in layouts}
    assert "NVIDIA A100-SXM4-40GB" in skus and "Hygon DCU Z100" not in skus
    assert ("Tesla V100-SXM2-32GB" in skus) == ("0x1DB510DE" in flt)


def test_filters_matching_nothing_leave_everything_alone(backend: Backend) -> None:
    plan = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - {device-filter: [h100, '0x233510DE'], devices: all, mig-enabled: false}\n"
    )
    assert plan_layouts(backend, plan, "c") == []
    report = apply_plan(backend, plan, "c")
    assert report.devices == ()


def test_nodes_and_indexes_select_devices_and_the_last_entry_wins(backend: Backend) -> None:
    text = """
version: v1
mig-configs:
  c:
    - {devices: all, nodes: [a100-0, a100-1], mig-enabled: true, mig-devices: {"3g.20gb": 2}}
    - {devices: [1, 3], nodes: [a100-1], mig-enabled: true, mig-devices: {"7g.40gb": 1}}
"""
    layouts = {lay.device_id: lay for lay in plan_layouts(backend, load_plan(text), "c")}
    assert set(layouts) == {f"a100-{n}:{i}" for n in (0, 1) for i in range(4)}
    assert layouts["a100-1:1"].mig_counts() == {"7g.40gb": 1} and layouts["a100-1:1"].entry == 1
    assert layouts["a100-1:2"].mig_counts() == {"3g.20gb": 2}
    assert layouts["a100-0:3"].mig_counts() == {"3g.20gb": 2}
    only = plan_layouts(backend, load_plan(text), "c", nodes=["a100-1"])
    assert {lay.node for lay in only} == {"a100-1"}
