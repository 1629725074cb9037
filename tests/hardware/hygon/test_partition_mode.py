"""`mig-enabled` on a DCU means what hy-smi reports, on the fake hy-smi and on the twin alike.

hy-smi has no per-DCU partition mode: vDCUs are carved with no mode switch and Hygon's MIG
mode is node-wide. A DCU reads as partitioned exactly while it has partitions, so a plan
asking a DCU for "on, nothing carved" is refused when it names the DCU, and skipped by a
generic (``devices: all``) entry, before anything changes."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.backend import Backend, PartitionRequest
from gpuflow.hardware.hygon import HygonBackend
from gpuflow.hardware.partition import PlanError, apply_plan, assert_plan, load_plan

from tests.hardware.hygon.helpers import NODE, Fake, mutating
from tests.hardware.partition.helpers import Proxy, exact_state, make_backend

TWIN_NODE = "dcu-0"


@pytest.fixture(params=["hy-smi", "twin"])
def dcu(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Backend, str]:
    """(a backend, the node of its DCUs 0 and 1)."""
    if request.param == "hy-smi":
        request.getfixturevalue("fake")
        return request.getfixturevalue("backend"), NODE
    monkeypatch.setenv("GPUFLOW_HOME", str(tmp_path / "twin"))
    return make_backend(tmp_path / "twin"), TWIN_NODE


def _plan(entry: str) -> object:
    return load_plan(f"version: v1\nmig-configs:\n  c:\n{entry}")


NAMED_ON_NOTHING = (
    "    - device-filter: dcu-z100\n      devices: [0]\n      mig-enabled: true\n"
    "      mig-devices: {}\n"
)
GENERIC_ON_NOTHING = "    - devices: all\n      mig-enabled: true\n      mig-devices: {}\n"
NAMED_VDCUS = (
    "    - device-filter: dcu-z100\n      devices: [0]\n      mig-enabled: true\n"
    "      vdcu-devices: [{compute-units: 20, memory-mb: 8192}]\n"
)


def test_mode_is_on_exactly_while_the_dcu_has_vdcus(dcu: tuple[Backend, str]) -> None:
    b, node = dcu
    b.set_partition_mode(node, 0, True)  # no mode to switch: nothing changes
    assert b.partition_mode(node, 0) is False and b.partitions(node, 0) == []
    b.create_partitions(node, 0, [PartitionRequest("vdcu", compute_units=10, memory_mb=1024)])
    assert b.partition_mode(node, 0) is True and b.partition_mode(node, 1) is False
    b.destroy_partitions(node, 0)
    assert b.partition_mode(node, 0) is False
    b.set_partition_mode(node, 0, False)  # already off: fine
    assert b.partition_mode_state(node, 0).current is False


def test_on_with_nothing_carved_is_refused_naming_the_dcu(dcu: tuple[Backend, str]) -> None:
    b, node = dcu
    before = exact_state(b)
    proxy = Proxy(b)
    for run in (apply_plan, assert_plan):
        with pytest.raises(PlanError) as ei:
            run(proxy, _plan(NAMED_ON_NOTHING), "c", nodes=[node])
        err = ei.value
        assert err.rule == "no-partition-mode" and err.device == f"{node}:0 (Hygon DCU Z100)"
        assert "hy-smi reports it partitioned only while it has vDCUs" in str(err)
        assert "vdcu-devices" in str(err) and "mig-enabled: false" in str(err)
    assert proxy.mutations == 0 and exact_state(b) == before


def test_a_generic_entry_leaves_dcus_alone(dcu: tuple[Backend, str]) -> None:
    b, node = dcu
    plan = _plan(GENERIC_ON_NOTHING)
    report = apply_plan(b, plan, "c", nodes=[node])
    assert report.devices == ()  # no DCU taken: nothing it asks can be set up on one
    assert assert_plan(b, plan, "c", nodes=[node]) == []
    assert [b.partition_mode(node, i) for i in (0, 1)] == [False, False]


def test_on_with_vdcus_applies_and_asserts_the_same_on_both(dcu: tuple[Backend, str]) -> None:
    b, node = dcu
    plan = _plan(NAMED_VDCUS)
    (change,) = apply_plan(b, plan, "c", nodes=[node]).devices
    assert change.changed and change.after.mig_enabled
    assert assert_plan(b, plan, "c", nodes=[node]) == []
    b.destroy_partitions(node, 0)
    keys = {m.key for m in assert_plan(b, plan, "c", nodes=[node])}
    assert keys == {"mig-enabled", "vdcu-devices"}  # off again once the vDCU is gone
    off = _plan("    - device-filter: dcu-z100\n      devices: [0]\n      mig-enabled: false\n")
    assert assert_plan(b, off, "c", nodes=[node]) == []


def test_hy_smi_is_not_asked_to_switch_a_mode(fake: Fake, backend: HygonBackend) -> None:
    with pytest.raises(PlanError):
        apply_plan(backend, _plan(NAMED_ON_NOTHING), "c")
    apply_plan(backend, _plan(GENERIC_ON_NOTHING), "c")
    assert not any(mutating(c) for c in fake.calls())
