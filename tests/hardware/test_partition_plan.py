"""Partition plans (mig-parted format): load, validate, apply, assert, export, roll back."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from gpuflow.hardware.backend import (
    Backend,
    HardwareError,
    Partition,
    PartitionRequest,
)
from gpuflow.hardware.partition_plan import (
    DeviceLayout,
    PartitionPlan,
    PlanApplyError,
    PlanError,
    PlanFormatError,
    apply_plan,
    assert_plan,
    current_layout,
    dump_yaml,
    export_layout,
    load_plan,
    normalize_profile,
    plan_layouts,
)
from gpuflow.hardware.placement import LayoutError
from gpuflow.hardware.skus import SKU_ALIASES, sku
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

PLANS = Path(__file__).parent / "plans"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "partition-plans"
A100_NODES = ["a100-0", "a100-1", "a100-spare-0"]


# -- backends ----------------------------------------------------------------------------


def make_backend(tmp_path: Path, nodes: dict[str, list[str]] | None = None) -> Backend:
    """The digital twin: the default fleet, or one node per entry of ``nodes``."""
    from gpuflow.hardware.sim import SimBackend

    if nodes is None:
        return SimBackend(home=tmp_path)
    import yaml

    spec = {
        "name": "plan-test",
        "seed": 1,
        "faults": {"natural": False},
        "nodes": [
            {
                "name": n,
                "region": "r",
                "role": "active",
                "devices": [{"sku": s, "count": 1} for s in skus],
            }
            for n, skus in nodes.items()
        ],
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(spec))
    return SimBackend(home=tmp_path, spec_path=path)


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path))
    return make_backend(tmp_path)


class Proxy(Backend):
    """Passes everything to ``inner``; counts mutating calls; can fail the Nth of a kind.

    A failing create_partitions first creates half of its requests, so the device is left
    half-way, as a real driver error part-way through a batch would leave it.
    """

    name = "proxy"

    def __init__(
        self, inner: Backend, fail_create: int | None = None, fail_mode: int | None = None
    ):
        self.inner = inner
        self.fail_create = fail_create
        self.fail_mode = fail_mode
        self.creates = 0
        self.modes = 0
        self.destroys = 0
        self.armed = True

    def discover(self):
        return self.inner.discover()

    def telemetry(self, node, index):
        return self.inner.telemetry(node, index)

    def partition_profiles(self, node, index):
        return self.inner.partition_profiles(node, index)

    def partitions(self, node, index):
        return self.inner.partitions(node, index)

    def partition_mode(self, node, index):
        return self.inner.partition_mode(node, index)

    def set_partition_mode(self, node, index, enabled):
        self.modes += 1
        if self.armed and self.modes == self.fail_mode:
            self.armed = False
            raise HardwareError(f"injected: MIG mode change failed on {node}:{index}")
        return self.inner.set_partition_mode(node, index, enabled)

    def create_partitions(
        self, node, index, requests: Sequence[PartitionRequest]
    ) -> list[Partition]:
        self.creates += 1
        if self.armed and self.creates == self.fail_create:
            self.armed = False
            half = list(requests)[: max(1, len(requests) // 2)]
            self.inner.create_partitions(node, index, half)
            raise HardwareError(f"injected: create failed on {node}:{index}")
        return self.inner.create_partitions(node, index, requests)

    def destroy_partitions(self, node, index, uuids=None):
        self.destroys += 1
        return self.inner.destroy_partitions(node, index, uuids)

    def clocks(self, node, index):
        return self.inner.clocks(node, index)

    def set_locked_clocks(self, node, index, min_mhz, max_mhz):
        return self.inner.set_locked_clocks(node, index, min_mhz, max_mhz)

    def reset_locked_clocks(self, node, index):
        return self.inner.reset_locked_clocks(node, index)

    def set_applications_clocks(self, node, index, mem_clock_mhz, sm_clock_mhz):
        return self.inner.set_applications_clocks(node, index, mem_clock_mhz, sm_clock_mhz)

    def power_limits(self, node, index):
        return self.inner.power_limits(node, index)

    def set_power_limit_mw(self, node, index, limit_mw):
        return self.inner.set_power_limit_mw(node, index, limit_mw)

    @property
    def mutations(self) -> int:
        return self.creates + self.modes + self.destroys


def exact_state(backend: Backend) -> dict[str, tuple]:
    """Every device's mode and partitions with placements (uuids aside)."""
    out = {}
    for d in backend.devices():
        lay = current_layout(backend, d)
        out[lay.device_id] = (lay.mig_enabled, sorted(map(repr, lay.partitions)))
    return out


# -- loading and the schema ------------------------------------------------------------------


def test_nvidia_example_config_parses_as_is() -> None:
    plan = load_plan(PLANS / "nvidia_config.yaml")
    assert set(plan.configs) == {
        "all-disabled",
        "all-enabled",
        "all-1g.5gb",
        "all-2g.10gb",
        "all-3g.20gb",
        "all-balanced",
        "custom-config",
    }
    (e,) = plan.configs["all-balanced"]
    assert e.devices == "all" and e.mig_enabled and not e.device_filter
    assert e.mig_devices == {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}
    (e,) = plan.configs["all-enabled"]
    assert e.mig_enabled and e.mig_devices == {}
    custom = plan.configs["custom-config"]
    assert [c.devices for c in custom] == [(0, 1), (2,), (3,)]
    # Text, a path string and an already parsed document give the same plan.
    text = (PLANS / "nvidia_config.yaml").read_text()
    assert load_plan(text).configs == plan.configs
    assert load_plan(str(PLANS / "nvidia_config.yaml")).configs == plan.configs
    assert load_plan(plan.to_dict()).configs == plan.configs


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_user_examples_parse(path: Path) -> None:
    plan = load_plan(path)
    assert len(plan.configs) == 1


def test_profile_names_normalize_like_mig_parted() -> None:
    assert normalize_profile("1c.1g.5gb") == "1g.5gb"
    assert normalize_profile("1g.5gb+me") == "1g.5gb+me"
    assert normalize_profile("1c.2g.10gb") == "1c.2g.10gb"
    with pytest.raises(ValueError, match="unknown MIG profile attribute"):
        normalize_profile("1g.5gb+gfx")
    with pytest.raises(ValueError, match="not a MIG profile"):
        normalize_profile("1g5gb")
    plan = load_plan(
        'version: v1\nmig-configs:\n  c:\n    - {devices: all, mig-enabled: true, mig-devices: {"1c.1g.5gb": 2, "1g.5gb": 1}}\n'
    )
    assert plan.configs["c"][0].mig_devices == {"1g.5gb": 3}


def test_unquoted_pci_id_is_taken_back_as_an_id() -> None:
    plan = load_plan(
        "version: v1\nmig-configs:\n  c:\n    - {device-filter: 0x20B010DE, devices: all, mig-enabled: false}\n"
    )
    assert plan.configs["c"][0].device_filter == ("0x20B010DE",)


def test_a_vdcu_entry_implies_mig_enabled() -> None:
    plan = load_plan(
        "version: v1\nmig-configs:\n  c:\n"
        "    - {devices: all, vdcu-devices: [{compute-units: 5, memory-mb: 1024}]}\n"
    )
    (e,) = plan.configs["c"]
    assert e.mig_enabled and len(e.vdcu_devices) == 1


def test_layouts_describe_themselves_briefly() -> None:
    def lay(enabled: bool, *reqs: PartitionRequest) -> DeviceLayout:
        return DeviceLayout("n", 0, "s", enabled, reqs)

    assert lay(False).describe() == "off"
    assert lay(True).describe() == "on (no partitions)"
    mig = lay(
        True,
        PartitionRequest("3g.20gb", placement_start=4),
        PartitionRequest("1g.5gb", placement_start=2),
        PartitionRequest("1g.5gb", placement_start=3),
    )
    assert mig.describe() == "on: 3g.20gb@4, 2x 1g.5gb@2,3"
    vdcu = lay(True, *[PartitionRequest("vdcu", compute_units=20, memory_mb=8192)] * 2)
    assert vdcu.describe() == "on: 2x vdcu 20cu/8192MiB"


_E = "{devices: all, mig-enabled: true, mig-devices: {}}"


@pytest.mark.parametrize(
    ("text", "config", "entry", "key", "words"),
    [
        ("mig-configs: {c: [" + _E + "]}", None, None, "version", "missing"),
        ("version: v2\nmig-configs: {c: [" + _E + "]}", None, None, "version", "unknown version"),
        (
            "version: v1\nmig-configs: {c: [" + _E + "]}\nextra: 1",
            None,
            None,
            "extra",
            "unexpected",
        ),
        ("version: v1\nmig-configs: {}", None, None, "mig-configs", "at least one"),
        ("version: v1\nmig-configs: {c: []}", "c", None, None, "non-empty"),
        ("version: v1\nmig-configs: {c: [{mig-enabled: false}]}", "c", 0, "devices", "missing"),
        ("version: v1\nmig-configs: {c: [{devices: all}]}", "c", 0, "mig-enabled", "missing"),
        (
            "version: v1\nmig-configs: {c: ["
            + _E
            + ", {devices: all, mig-enabled: false, colour: red}]}",
            "c",
            1,
            "colour",
            "unexpected",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: some, mig-enabled: false}]}",
            "c",
            0,
            "devices",
            "'all'",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: [-1], mig-enabled: false}]}",
            "c",
            0,
            "devices",
            ">= 0",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: yes please}]}",
            "c",
            0,
            "mig-enabled",
            "true or false",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true}]}",
            "c",
            0,
            "mig-devices",
            "required",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: false, mig-devices: {1g.5gb: 1}}]}",
            "c",
            0,
            "mig-devices",
            "false",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: -1}}]}",
            "c",
            0,
            "mig-devices",
            ">= 0",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, mig-devices: {1g.5gb: two}}]}",
            "c",
            0,
            "mig-devices",
            "integer",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, mig-devices: {big: 1}}]}",
            "c",
            0,
            "mig-devices",
            "not a MIG profile",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, mig-devices: [1g.5gb]}]}",
            "c",
            0,
            "mig-devices",
            "mapping",
        ),
        (
            "version: v1\nmig-configs: {c: [{device-filter: {a: 1}, devices: all, mig-enabled: false}]}",
            "c",
            0,
            "device-filter",
            "PCI",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: false, nodes: []}]}",
            "c",
            0,
            "nodes",
            "non-empty",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, vdcu-devices: [{compute-units: 5}]}]}",
            "c",
            0,
            "vdcu-devices[0]",
            "memory-mb",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: true, vdcu-devices: [{compute-units: 0, memory-mb: 5}]}]}",
            "c",
            0,
            "vdcu-devices[0]",
            ">= 1",
        ),
        (
            "version: v1\nmig-configs: {c: [{devices: all, mig-enabled: false, vdcu-devices: [{compute-units: 5, memory-mb: 5}]}]}",
            "c",
            0,
            "vdcu-devices",
            "false",
        ),
        ("version: v1\nmig-configs: [1, 2", None, None, None, "YAML"),
    ],
)
def test_schema_errors_name_config_entry_and_key(text, config, entry, key, words) -> None:
    with pytest.raises(PlanFormatError) as ei:
        load_plan(text)
    err = ei.value
    assert (err.config, err.entry, err.key) == (config, entry, key)
    assert words in str(err)
    if config is not None:
        assert f"mig-configs.{config}" in str(err)
    if key is not None:
        assert key in str(err)
    assert isinstance(err, PlanError) and isinstance(err, LayoutError)


def test_missing_plan_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(HardwareError, match="cannot read partition plan"):
        load_plan(tmp_path / "nope.yaml")


# -- planning: validation against each device ------------------------------------------------


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


# -- apply / assert ----------------------------------------------------------------------------


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


def test_assert_reports_each_difference(backend: Backend) -> None:
    plan = load_plan(EXAMPLES / "mixed-vdcu.yaml")
    mismatches = assert_plan(backend, plan)
    keys = {(m.node, m.key) for m in mismatches}
    assert ("a100-0", "mig-enabled") in keys and ("a100-0", "mig-devices") in keys
    assert ("dcu-0", "vdcu-devices") in keys
    assert not any(m.node in ("v100-0", "a100-spare-0") for m in mismatches)  # already disabled
    m = next(m for m in mismatches if m.node == "a100-0" and m.key == "mig-devices")
    assert m.expected == {"1g.5gb": 7} and m.actual == {}
    assert "a100-0" in str(m) and "1g.5gb" in str(m)
    apply_plan(backend, plan)
    assert assert_plan(backend, plan) == []
    backend.destroy_partitions("dcu-0", 1)
    (m,) = assert_plan(backend, plan)
    assert (m.node, m.index, m.key, m.actual) == ("dcu-0", 1, "vdcu-devices", [])


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


# -- export -----------------------------------------------------------------------------------


def test_export_then_apply_is_a_no_op(backend: Backend) -> None:
    apply_plan(backend, load_plan(EXAMPLES / "mixed-vdcu.yaml"))
    doc = export_layout(backend)
    assert list(doc) == ["version", "mig-configs"] and list(doc["mig-configs"]) == ["current"]
    entries = doc["mig-configs"]["current"]
    assert len(entries) == len(backend.devices())
    a100 = next(e for e in entries if e["nodes"] == ["a100-0"] and e["devices"] == [0])
    assert a100 == {
        "device-filter": "0x20B010DE",
        "devices": [0],
        "nodes": ["a100-0"],
        "mig-enabled": True,
        "mig-devices": {"1g.5gb": 7},
    }
    dcu = next(e for e in entries if e["nodes"] == ["dcu-0"])
    assert dcu["device-filter"] == "Hygon DCU Z100" and len(dcu["vdcu-devices"]) == 4
    v100 = next(e for e in entries if e["nodes"] == ["v100-0"])
    assert v100["mig-enabled"] is False and v100["mig-devices"] == {}

    text = dump_yaml(doc)
    assert "'0x20B010DE'" in text  # quoted: unquoted it would read back as an int
    plan = load_plan(text)
    before = exact_state(backend)
    proxy = Proxy(backend)
    report = apply_plan(proxy, plan)
    assert report.changed == [] and proxy.mutations == 0
    assert exact_state(backend) == before
    assert export_layout(backend) == doc

    # And restoring an export after a change brings the layout back.
    apply_plan(backend, load_plan(EXAMPLES / "all-disabled.yaml"))
    assert assert_plan(backend, plan)
    apply_plan(backend, plan)
    assert assert_plan(backend, plan) == []
    assert export_layout(backend) == doc


def test_export_of_some_nodes(backend: Backend) -> None:
    doc = export_layout(backend, nodes=["dcu-0"])
    assert [e["devices"] for e in doc["mig-configs"]["current"]] == [[0], [1]]
    assert dump_yaml(PartitionPlan(load_plan(doc).configs)) == dump_yaml(load_plan(doc))


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
