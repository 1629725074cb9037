"""Exporting the current layout as a plan."""

from __future__ import annotations

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.partition import (
    PartitionPlan,
    apply_plan,
    assert_plan,
    dump_yaml,
    export_layout,
    load_plan,
)

from tests.hardware.partition.helpers import EXAMPLES, Proxy, exact_state


def test_export_then_apply_is_a_no_op(backend: Backend) -> None:
    apply_plan(backend, load_plan(EXAMPLES / "mixed-vdcu.yaml"))
    doc = export_layout(backend, with_nodes=True)
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
    assert export_layout(backend, with_nodes=True) == doc

    # And restoring an export after a change brings the layout back.
    apply_plan(backend, load_plan(EXAMPLES / "all-disabled.yaml"))
    assert assert_plan(backend, plan)
    apply_plan(backend, plan)
    assert assert_plan(backend, plan) == []
    assert export_layout(backend, with_nodes=True) == doc


def test_export_of_some_nodes(backend: Backend) -> None:
    doc = export_layout(backend, nodes=["dcu-0"])
    assert [e["devices"] for e in doc["mig-configs"]["current"]] == [[0], [1]]
    assert dump_yaml(PartitionPlan(load_plan(doc).configs)) == dump_yaml(load_plan(doc))
