from __future__ import annotations

import pytest
from gpuflow.hardware.backend import HardwareError, InvalidRequestError, PartitionRequest
from gpuflow.hardware.sim import SimBackend


def test_unpartitioned_device_fails_every_tenant_like_mps(quiet: SimBackend) -> None:
    quiet.set_workload("a100-0", 0, "a", 0.4, memory_mb=1000)
    quiet.set_workload("a100-0", 0, "b", 0.4, memory_mb=2000)
    quiet.set_workload("a100-0", 1, "c", 0.4)
    t = quiet.telemetry("a100-0", 0)
    assert t.utilization_ratio == pytest.approx(0.8) and t.memory_used_mb == 3000
    assert quiet.tenant_fatal_error("a") == ["a", "b"]
    assert quiet.workload_status("a") == "failed: application fatal error (XID 13)"
    assert quiet.workload_status("b").startswith("failed: fatal error in co-tenant 'a'")
    assert quiet.workload_status("c") == "running"
    t = quiet.telemetry("a100-0", 0)
    assert t.utilization_ratio == 0.0 and t.memory_used_mb == 0 and 13 in t.xids
    assert quiet.tenant_fatal_error("a") == []  # already down
    with pytest.raises(HardwareError, match="has failed: application fatal error"):
        quiet.report_workload("a100-0", 0, "a", 0.4)  # a dead tenant is not revived
    quiet.end_workload("b")
    quiet.report_workload("a100-0", 0, "b", 0.3)  # a restart registers afresh
    assert quiet.workload_status("b") == "running"
    assert quiet.clear_workload("a") and not quiet.clear_workload("a")
    assert quiet.workload_status("a") == "absent"
    with pytest.raises(InvalidRequestError, match="no tenant 'zzz'"):
        quiet.tenant_fatal_error("zzz")


def test_mig_confines_a_fatal_error_to_its_partition(quiet: SimBackend) -> None:
    quiet.set_partition_mode("a100-0", 0, True)
    p3, p2 = quiet.create_partitions(
        "a100-0", 0, [PartitionRequest("3g.20gb"), PartitionRequest("2g.10gb")]
    )
    quiet.set_workload("a100-0", 0, "a", 1.0, memory_mb=5000, partition_uuid=p3.uuid)
    quiet.set_workload("a100-0", 0, "a2", 0.5, memory_mb=5000, partition_uuid=p3.uuid)
    quiet.set_workload("a100-0", 0, "b", 1.0, memory_mb=4000, partition_uuid=p2.uuid)
    t = quiet.telemetry("a100-0", 0)
    assert t.utilization_ratio == pytest.approx(3 / 7 + 2 / 7, abs=1e-3)
    assert t.memory_used_mb == 14000
    assert quiet.tenant_fatal_error("a") == ["a", "a2"]
    assert quiet.workload_status("b") == "running"
    assert quiet.telemetry("a100-0", 0).utilization_ratio == pytest.approx(2 / 7, abs=1e-3)
    # A device failure reaches through the partitions.
    r = quiet.inject_fault("a100-0", 0, "ecc-uncorrectable")
    assert r["failed_tenants"] == ["b"]


def test_vdcu_confines_a_fatal_error_too(quiet: SimBackend) -> None:
    v1, v2 = quiet.create_partitions(
        "dcu-0",
        0,
        [
            PartitionRequest("vdcu", compute_units=30, memory_mb=8192),
            PartitionRequest("vdcu", compute_units=15, memory_mb=4096),
        ],
    )
    assert quiet.partition_mode("dcu-0", 0)
    quiet.set_workload("dcu-0", 0, "x", 1.0, memory_mb=8000, partition_uuid=v1.uuid)
    quiet.set_workload("dcu-0", 0, "y", 1.0, memory_mb=4000, partition_uuid=v2.uuid)
    assert quiet.telemetry("dcu-0", 0).utilization_ratio == pytest.approx(45 / 60, abs=1e-3)
    r = quiet.inject_fault("dcu-0", 0, "app-fatal")
    assert r["failed_tenants"] == ["x"] and r["xids"] == [13]
    assert quiet.workload_status("y") == "running"


def test_workload_validation(quiet: SimBackend) -> None:
    with pytest.raises(InvalidRequestError, match="utilization_ratio"):
        quiet.set_workload("a100-0", 0, "a", 1.5)
    with pytest.raises(InvalidRequestError, match="out of memory"):
        quiet.set_workload("a100-0", 0, "a", 0.5, memory_mb=50_000)
    quiet.set_workload("a100-0", 0, "a", 0.5, memory_mb=30_000)
    with pytest.raises(InvalidRequestError, match="10960 MiB free"):
        quiet.set_workload("a100-0", 0, "b", 0.5, memory_mb=20_000)
    quiet.set_workload("a100-0", 0, "a", 0.5, memory_mb=35_000)  # an update, not a second tenant
    with pytest.raises(InvalidRequestError, match="no partition"):
        quiet.set_workload("a100-0", 1, "c", 0.5, partition_uuid="MIG-nope")
    quiet.set_partition_mode("a100-0", 1, True)
    with pytest.raises(InvalidRequestError, match="run on a partition"):
        quiet.set_workload("a100-0", 1, "c", 0.5)
    with pytest.raises(HardwareError, match="tenants run on it: a"):
        quiet.set_partition_mode("a100-0", 0, True)
    assert quiet.tenants() == {"a": quiet.tenants("a100-0", 0)["a"]}
