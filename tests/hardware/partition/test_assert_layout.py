"""Asserting plans: every difference between the devices and the plan."""

from __future__ import annotations

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.partition import apply_plan, assert_plan, load_plan

from tests.hardware.partition.helpers import EXAMPLES


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
    # A DCU with no vDCU left reads as off, as hy-smi reports it: both keys differ.
    got = {(m.node, m.index, m.key, str(m.actual)) for m in assert_plan(backend, plan)}
    assert got == {("dcu-0", 1, "vdcu-devices", "[]"), ("dcu-0", 1, "mig-enabled", "False")}
