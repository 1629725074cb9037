"""GPU_I_ID on hy-smi: a MIG instance's GPU instance id, a vDCU's virtual device number."""

from __future__ import annotations

from gpuflow.hardware.backend import PartitionRequest
from gpuflow.hardware.hygon import HygonBackend

from tests.hardware.hygon.helpers import HAMI, NODE, Fake
from tests.hardware.hygon.test_mig import _mig_state


def test_vdcus_carry_their_host_wide_numbers(fake: Fake, backend: HygonBackend) -> None:
    backend.create_partitions(NODE, 0, HAMI)
    created = backend.create_partitions(NODE, 1, HAMI[:2])
    numbers = {
        (v["compute_units"], v["memory_mib"]): v["index"]
        for v in fake.state()["vdevices"]
        if v["device"] == 1
    }
    want = {p.uuid: numbers[(p.compute_units, p.memory_mb)] for p in created}
    assert backend.gpu_instance_ids(NODE, 1) == want
    assert sorted(want.values()) == [4, 5]  # numbered after DCU 0's four


def test_mig_instances_carry_hy_smis_gpu_instance_ids(fake: Fake, backend: HygonBackend) -> None:
    fake.edit(_mig_state)
    created = backend.create_partitions(
        NODE, 0, [PartitionRequest("2g.15gb"), PartitionRequest("4g.31gb")]
    )
    gis = {g["start"]: g["gi"] for g in fake.state()["gpu_instances"] if g["device"] == 0}
    want = {p.uuid: gis[p.placement_start] for p in created}
    assert backend.gpu_instance_ids(NODE, 0) == want
