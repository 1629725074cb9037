"""NVIDIA's own mig-parted files (tests/hardware/plans/mig-parted/, verbatim) on the twin:
they load as they are, every config of config-default.yaml meant for the twin's A100-40GB
applies and asserts, one asking it for a profile it lacks is refused naming both, and an
export is plain mig-parted v1 that a loader as strict as mig-parted's accepts."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from gpuflow.hardware.backend import Backend, InvalidRequestError
from gpuflow.hardware.partition import (
    PlanError,
    apply_plan,
    assert_plan,
    dump_yaml,
    export_layout,
    load_plan,
)

from tests.hardware.partition.helpers import PLANS, Proxy, exact_state

MIG_PARTED = PLANS / "mig-parted"
# config-default.yaml's configs for the A100-40GB (its comments name the cards).
A100_40GB_CONFIGS = (
    "all-disabled",
    "all-enabled",
    "all-1g.5gb",
    "all-1g.5gb.me",
    "all-2g.10gb",
    "all-3g.20gb",
    "all-4g.20gb",
    "all-7g.40gb",
    "all-1g.10gb",
    "all-balanced",
)


def test_nvidias_default_and_example_configs_load_as_they_are() -> None:
    plan = load_plan(MIG_PARTED / "config-default.yaml")
    assert set(A100_40GB_CONFIGS) <= set(plan.configs) and len(plan.configs) > 60
    (gfx,) = plan.configs["all-1g.24gb.gfx"]
    assert gfx.mig_devices == {"1g.24gb+gfx": 4}
    assert plan.configs["all-1g.24gb.me.all"][0].mig_devices == {"1g.24gb+me.all": 1}
    assert plan.configs["all-1g.24gb-me"][0].mig_devices == {"1g.24gb-me": 4}
    # Written back and read again: the same plan (names kept as NVIDIA spells them).
    assert load_plan(dump_yaml(plan.to_dict())).configs == plan.configs
    examples = load_plan(MIG_PARTED / "examples-config.yaml")
    assert {"all-balanced", "custom-config"} <= set(examples.configs)


@pytest.mark.parametrize("config", A100_40GB_CONFIGS)
def test_every_config_for_the_a100_applies_and_asserts_on_the_twin(
    backend: Backend, config: str
) -> None:
    plan = load_plan(MIG_PARTED / "config-default.yaml")
    report = apply_plan(backend, plan, config)
    assert report.devices, "the config selected no device"
    assert assert_plan(backend, plan, config) == []


def test_a_profile_the_a100_lacks_is_refused_naming_the_device_and_the_profile(
    backend: Backend,
) -> None:
    plan = load_plan(MIG_PARTED / "config-default.yaml")
    before = exact_state(backend)
    proxy = Proxy(backend)
    with pytest.raises(PlanError) as refused:
        apply_plan(proxy, plan, "all-1g.24gb.gfx")
    err = refused.value
    assert err.rule == "unknown-profile" and "A100-SXM4-40GB" in err.device
    assert "'1g.24gb+gfx' is not offered" in str(err) and "1g.5gb" in str(err)
    assert proxy.mutations == 0 and exact_state(backend) == before


def test_counts_are_bounded_before_anything_is_built(backend: Backend) -> None:
    doc = {
        "version": "v1",
        "mig-configs": {
            "huge": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 3_000_000}}]
        },
    }
    with pytest.raises(PlanError, match=r"3000000 x 1g\.5gb requested, at most 7"):
        apply_plan(backend, load_plan(doc), "huge")
    doc["mig-configs"]["huge"][0]["mig-devices"] = {"1g.5gb": 5, "1g.10gb": 4}
    with pytest.raises(PlanError, match="9 MIG instances requested, at most 7 fit one device"):
        apply_plan(backend, load_plan(doc), "huge")


# The fields mig-parted's spec v1 knows (api/spec/v1); its loader rejects any other.
_MIG_PARTED_FIELDS = {
    "top": {"version", "mig-configs"},
    "entry": {"device-filter", "devices", "mig-enabled", "mig-devices"},
}


def _strict_mig_parted_load(text: str) -> dict[str, Any]:
    doc = yaml.safe_load(text)
    assert set(doc) <= _MIG_PARTED_FIELDS["top"], f"unexpected field(s) {set(doc)}"
    assert doc["version"] == "v1"
    for entries in doc["mig-configs"].values():
        for entry in entries:
            extra = set(entry) - _MIG_PARTED_FIELDS["entry"]
            assert not extra, f"unexpected field(s) {extra}"
    return doc


def test_an_export_is_plain_mig_parted_v1_of_one_node_and_reapplies(backend: Backend) -> None:
    apply_plan(backend, load_plan(MIG_PARTED / "config-default.yaml"), "all-balanced")
    text = dump_yaml(export_layout(backend, nodes=["a100-1"]))
    doc = _strict_mig_parted_load(text)
    (entries,) = doc["mig-configs"].values()
    assert [e["devices"] for e in entries] == [[i] for i in range(len(entries))]
    # Re-applied to that node after a change: the same layout.
    before = exact_state(backend)
    apply_plan(backend, load_plan(MIG_PARTED / "config-default.yaml"), "all-disabled")
    apply_plan(backend, load_plan(text), nodes=["a100-1"])
    after = exact_state(backend)
    assert {k: v for k, v in after.items() if "a100-1" in str(k)} == {
        k: v for k, v in before.items() if "a100-1" in str(k)
    }
    # A plain export of several nodes cannot say which node is which: refused, naming them.
    with pytest.raises(InvalidRequestError, match="--with-nodes"):
        export_layout(backend)
    assert "nodes" in export_layout(backend, with_nodes=True)["mig-configs"]["current"][0]
