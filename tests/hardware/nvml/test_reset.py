"""Pending MIG modes on real NVML semantics (the fake): the reset phase runs
``nvidia-smi -r``, a blocked reset leaves no pending mode behind and says what held the
GPU, a GPU with compute processes is refused before anything changes."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import DeviceBusyError, PartitionModeState, UnsupportedError
from gpuflow.hardware.nvml import NvmlBackend
from gpuflow.hardware.nvml.reset import run_command
from gpuflow.hardware.partition import PlanApplyError, apply_plan, assert_plan, load_plan

from tests.hardware.nvml.helpers import NODE, FakeNvml
from tests.hardware.partition.helpers import PLANS

DEFAULT = load_plan(PLANS / "mig-parted" / "config-default.yaml")


def _backend(fake: FakeNvml) -> NvmlBackend:
    return NvmlBackend(node_name=NODE, nvml=fake, run_command=fake.nvidia_smi)


def test_a_mode_change_left_pending_is_applied_by_one_reset_then_partitioned() -> None:
    fake = FakeNvml(["a800-80gb", "a800-80gb"])
    for d in fake.devices:
        d.mig_needs_reset = True  # passed through to a VM: every change waits for a reset
    b = _backend(fake)
    report = apply_plan(b, DEFAULT, "all-balanced")
    assert report.reset == (f"{NODE}:0", f"{NODE}:1")
    assert "nvidia-smi -r -i 00000000:10:00.0,00000000:11:00.0" in fake.calls
    assert assert_plan(b, DEFAULT, "all-balanced") == []
    assert b.partition_mode_state(NODE, 0) == PartitionModeState(True, True)


def test_a_blocked_reset_leaves_no_pending_mode_behind_and_says_what_held_the_gpu() -> None:
    fake = FakeNvml(["a800-80gb"])
    fake.device(0).mig_needs_reset = True
    fake.device(0).holders.append("nv-hostengine")  # DCGM: NVML does not list it
    b = _backend(fake)
    with pytest.raises(PlanApplyError) as ei:
        apply_plan(b, DEFAULT, "all-balanced")
    text = str(ei.value)
    assert "GPU reset refused" in text and "is currently in use by another process" in text
    assert "a client such as DCGM holds it" in text
    assert ei.value.rolled_back == [f"{NODE}:0"]
    assert b.partition_mode_state(NODE, 0) == PartitionModeState(False, False)
    assert b.partitions(NODE, 0) == []


def test_a_gpu_with_compute_processes_is_refused_before_any_mode_changes() -> None:
    fake = FakeNvml(["a800-80gb", "a800-80gb"])
    fake.device(1).processes[4242] = "python"
    b = _backend(fake)
    with pytest.raises(DeviceBusyError) as ei:
        apply_plan(b, DEFAULT, "all-balanced")
    assert ei.value.busy == {f"{NODE}:1": ["pid 4242 (python)"]}
    assert "nvmlDeviceSetMigMode" not in fake.calls  # GPU 0 was not touched either
    assert not any(c.startswith("nvidia-smi") for c in fake.calls)


def test_a_reset_refused_while_a_process_runs_names_the_process() -> None:
    fake = FakeNvml(["a800-80gb"])
    b = _backend(fake)
    fake.device(0).processes[77] = "trainer"
    with pytest.raises(Exception, match=r"compute processes: gpu-node-1:0: pid 77 \(trainer\)"):
        b.reset_devices([(NODE, 0)])


def test_without_nvidia_smi_a_reset_says_how_to_finish(monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(UnsupportedError, match="nvidia-smi is not on PATH"):
        run_command(["nvidia-smi", "-r", "-i", "00000000:10:00.0"])
