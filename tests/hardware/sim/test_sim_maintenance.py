"""The twin's holders, pending MIG modes, resets and change log (maintenance_api.py)."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import (
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    PartitionModeState,
    PartitionRequest,
)
from gpuflow.hardware.sim import SimBackend

A0 = ("a100-0", 0)


@pytest.fixture
def twin(tmp_path) -> SimBackend:
    return SimBackend(home=tmp_path)


def test_a_held_gpu_keeps_its_mode_change_pending_until_a_reset_it_blocks(twin) -> None:
    twin.hold_device(*A0, "nv-hostengine")
    twin.set_partition_mode(*A0, True)
    assert twin.partition_mode_state(*A0) == PartitionModeState(False, True)
    assert twin.partition_mode(*A0) is False
    with pytest.raises(HardwareError, match="MIG mode is disabled"):
        twin.create_partitions(*A0, [PartitionRequest("1g.5gb")])  # not active yet
    with pytest.raises(HardwareError, match=r"a100-0:0 .* is in use by nv-hostengine"):
        twin.reset_devices([A0])
    assert twin.partition_mode_state(*A0).reset_pending  # a refused reset changes nothing
    assert twin.release_device(*A0, "nv-hostengine") is True
    assert twin.release_device(*A0, "nv-hostengine") is False
    twin.reset_devices([A0])
    assert twin.partition_mode_state(*A0) == PartitionModeState(True, True)


def test_asking_for_the_current_mode_cancels_a_pending_change(twin) -> None:
    twin.set_passthrough(*A0)
    twin.set_partition_mode(*A0, True)
    assert twin.partition_mode_state(*A0).reset_pending
    twin.set_partition_mode(*A0, False)
    assert twin.partition_mode_state(*A0) == PartitionModeState(False, False)


def test_a_reset_is_all_or_nothing_and_clears_instances_and_clocks(twin) -> None:
    twin.set_partition_mode(*A0, True)
    twin.create_partitions(*A0, [PartitionRequest("3g.20gb")])
    twin.set_workload("a100-0", 1, "job-1", 0.5)
    with pytest.raises(HardwareError, match="a100-0:1 .* in use by tenant job-1"):
        twin.reset_devices([A0, ("a100-0", 1)])
    assert len(twin.partitions(*A0)) == 1  # a100-0:0 was not reset either
    twin.reset_devices([A0])
    assert twin.partitions(*A0) == [] and twin.partition_mode(*A0) is True
    assert [c["call"] for c in twin.change_log()] == [
        "set_partition_mode",
        "create_partitions",
        "reset",
    ]
    with pytest.raises(InvalidRequestError, match="no GPU reset"):
        twin.reset_devices([("dcu-0", 0)])


def test_bad_holders_and_lost_devices_are_refused(twin) -> None:
    with pytest.raises(InvalidRequestError, match="holder"):
        twin.hold_device(*A0, " ")
    twin.inject_fault("a100-0", 2, "xid79")
    with pytest.raises(DeviceLostError):
        twin.hold_device("a100-0", 2, "dcgm")
    with pytest.raises(InvalidRequestError, match="passthrough"):
        twin.set_passthrough(*A0, "yes")  # type: ignore[arg-type]
