"""An apply and the inventory: leased devices refused before anything changes, the devices
changed cordoned meanwhile (a second process cannot lease them), the inventory re-synced
after a rollback, and jobs placed on partitions that are gone requeued."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gpuflow.hardware.backend import DeviceBusyError
from gpuflow.hardware.inventory import Inventory, JobState, ResourceUnavailableError
from gpuflow.hardware.partition import PlanApplyError, apply_plan, load_plan
from gpuflow.hardware.partition.guard import InventoryGuard

from tests.hardware.partition.helpers import Proxy

GPUFLOW = str(Path(sys.executable).with_name("gpuflow"))
PLAN_DOC = {
    "version": "v1",
    "mig-configs": {
        "halves": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.20gb": 2}}],
        "sevenths": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"1g.5gb": 7}}],
    },
}
PLAN = load_plan(PLAN_DOC)


@pytest.fixture
def inventory(tmp_path: Path, backend) -> Inventory:
    inv = Inventory(f"sqlite:///{tmp_path / 'inventory.db'}")
    inv.sync(backend)
    yield inv
    inv.close()


def _inventory_uuids(inv: Inventory, node: str, index: int) -> list[str]:
    return sorted(p.uuid for p in inv.partitions(node=node, index=index))


def _uuids(backend, node: str, index: int) -> list[str]:
    return sorted(p.uuid for p in backend.partitions(node, index))


def test_a_leased_partition_refuses_the_apply_before_any_device_changes(
    backend, inventory: Inventory
) -> None:
    apply_plan(backend, PLAN, "halves", nodes=["a100-0"], guard=InventoryGuard(inventory))
    leased = backend.partitions("a100-0", 1)[0].uuid
    inventory.acquire_lease(leased, "job-a", 600)
    seen = len(backend.change_log())
    with pytest.raises(DeviceBusyError) as ei:
        apply_plan(backend, PLAN, "sevenths", nodes=["a100-0"], guard=InventoryGuard(inventory))
    assert ei.value.busy == {"a100-0:1": [f"lease of 'job-a' on {leased}"]}
    assert len(backend.change_log()) == seen  # a100-0:0 was not touched either
    assert inventory.cordons() == []


def test_after_a_rolled_back_apply_the_inventory_holds_the_current_uuids_and_stale_jobs_are_requeued(
    backend, inventory: Inventory
) -> None:
    apply_plan(backend, PLAN, "halves", nodes=["a100-0"], guard=InventoryGuard(inventory))
    old = backend.partitions("a100-0", 0)[0].uuid
    # Placed on it by a scheduler that died before its runner started: no live lease.
    inventory.record_job("job-p", {"gpus": 1}, state=str(JobState.PLACED), resource_ids=[old])
    inventory.cordon("a100-0", 1, reason="health: XID 48")  # someone else's cordon
    proxy = Proxy(backend, fail_create=2)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(proxy, PLAN, "sevenths", nodes=["a100-0"], guard=InventoryGuard(inventory))
    assert ei.value.rolled_back == ["a100-0:0", "a100-0:1"]
    # The rollback recreated the halves under new MIG UUIDs; the inventory has those.
    for index in (0, 1):
        assert _inventory_uuids(inventory, "a100-0", index) == _uuids(backend, "a100-0", index)
    assert old not in _uuids(backend, "a100-0", 0)
    job = inventory.job("job-p")
    assert job.state == JobState.QUEUED and job.resource_ids == ()
    assert old in job.info["detail"] and "no longer exist" in job.info["detail"]
    assert ei.value.settled["jobs_requeued"] == ["job-p"]
    assert [(c.node, c.index, c.reason) for c in inventory.cordons()] == [
        ("a100-0", 1, "health: XID 48")
    ]


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"apply ended early ({proc.returncode}): {out}\n{err}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path} never appeared")
        time.sleep(0.05)


def test_while_one_process_applies_another_cannot_lease_the_devices_it_changes(
    backend, tmp_path: Path
) -> None:
    reached, gate = tmp_path / "reached", tmp_path / "gate"
    wait = (
        "import pathlib, time\n"
        f"pathlib.Path({str(reached)!r}).touch()\n"
        f"gate = pathlib.Path({str(gate)!r})\n"
        "deadline = time.monotonic() + 120\n"
        "while not gate.exists() and time.monotonic() < deadline: time.sleep(0.05)\n"
    )
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN_DOC))
    (tmp_path / "hooks.yaml").write_text(
        yaml.safe_dump(
            {
                "version": "v1",
                "hooks": {"pre-apply-config": [{"command": sys.executable, "args": ["-c", wait]}]},
            }
        )
    )
    env = {**os.environ, "GPUFLOW_HOME": str(tmp_path), "GPUFLOW_BACKEND": "sim"}
    argv = [GPUFLOW, "hw", "partition", "apply", "-f", str(tmp_path / "plan.yaml")]
    argv += ["-c", "halves", "--node", "a100-0", "--hooks-file", str(tmp_path / "hooks.yaml")]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_for(reached, proc)  # the apply holds a100-0:0 and :1, about to partition them
        inv = Inventory()  # GPUFLOW_HOME's, as the CLI's
        changing = inv.device("a100-0", 0).uuid
        with pytest.raises(ResourceUnavailableError, match="cordoned: partition apply"):
            inv.acquire_lease(changing, "job-b", 600)
        other = inv.acquire_lease(inv.device("a100-0", 2).uuid, "job-c", 600)
        assert other.owner == "job-c"  # a device the plan does not change stays leasable
    finally:
        gate.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "2 device(s) changed" in out
    assert inv.cordons() == []
    part = inv.partitions(node="a100-0", index=0)[0]
    assert inv.acquire_lease(part.uuid, "job-b", 600).owner == "job-b"
