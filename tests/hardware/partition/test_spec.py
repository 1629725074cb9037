"""Partition plans (mig-parted format): load, parse and validate the document."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.backend import HardwareError
from gpuflow.hardware.partition import PlanError, PlanFormatError, load_plan, normalize_profile
from gpuflow.hardware.placement import LayoutError

from tests.hardware.partition.helpers import EXAMPLES, PLANS


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
    # Attributes as go-nvlib parses them: +a[,b] or -a, letters, digits and dots.
    for name in ("1g.24gb+gfx", "1g.24gb+me.all", "1g.24gb-me", "1c.2g.48gb+me,gfx"):
        assert normalize_profile(name) == name
    for bad in ("1g5gb", "1g.5gb+", "1g.5gb+1me", "1g.5gb+me.", "1g.5gb+me-x", "1g.5gb+m e"):
        with pytest.raises(ValueError, match="not a MIG profile"):
            normalize_profile(bad)
    with pytest.raises(ValueError, match="repeats an attribute"):
        normalize_profile("1g.5gb+me,me")
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
