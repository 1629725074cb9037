"""What each rank of a gang may see, and which collective backend it uses."""

from __future__ import annotations

import pytest
import yaml
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.training.distributed.gang import (
    UNIT_ENV,
    GangUnit,
    bind_this_rank,
    choose_backend,
    decode_plan,
    encode_plan,
    rank_environment,
)
from gpuflow.tasks.training.distributed.launch import check_gang

from tests.tasks.remediation.helpers import small_spec

FOUR_GPU_NODE = {
    "name": "four",
    "seed": 3,
    "faults": {"natural": False},
    "nodes": [
        {
            "name": "h0",
            "region": "r1",
            "role": "active",
            "devices": [{"sku": "a100-40gb", "count": 4}],
        }
    ],
}


def _units_1_and_3(home) -> tuple[SimBackend, str, list[GangUnit]]:
    """(the twin, its spec file, a gang's units on devices 1 and 3 of its 4-GPU node)."""
    spec = home / "four.yaml"
    spec.write_text(yaml.safe_dump(FOUR_GPU_NODE))
    backend = SimBackend(spec_path=spec)
    inv = Inventory()
    inv.sync(backend)
    by_index = {d.index: d for d in inv.devices("h0")}
    units = [GangUnit.of(inv.resource(by_index[i].uuid), backend.name) for i in (1, 3)]
    return backend, str(spec), units


def test_a_gang_on_twin_devices_1_and_3_binds_each_rank_to_its_own(gpuflow_home) -> None:
    _, _, units = _units_1_and_3(gpuflow_home)
    assert [(u.node, u.device_index, u.vendor) for u in units] == [
        ("h0", 1, "sim"),
        ("h0", 3, "sim"),
    ]
    plan = decode_plan(encode_plan(units))
    assert plan == units
    for local_rank, unit in enumerate(units):
        environ = {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "0"}
        assert bind_this_rank(plan, local_rank, environ) == unit
        # The twin trains on the CPU: no GPU of this machine is in reach, whatever was set.
        assert environ == {UNIT_ENV: unit.resource_id, "CUDA_VISIBLE_DEVICES": ""}
    assert choose_backend(units) == "gloo"


def test_real_devices_see_exactly_their_leased_unit() -> None:
    gpu1 = GangUnit("GPU-aaa", "h0", 1, "nvidia")
    gpu3 = GangUnit("GPU-bbb", "h0", 3, "nvidia")
    mig = GangUnit("MIG-7f3c", "h0", 2, "nvidia", "mig", "3g.20gb")
    dcu = GangUnit("DCU-1", "d0", 5, "hygon")
    assert rank_environment(gpu1)["CUDA_VISIBLE_DEVICES"] == "1"
    assert rank_environment(gpu3)["CUDA_VISIBLE_DEVICES"] == "3"
    assert rank_environment(mig)["CUDA_VISIBLE_DEVICES"] == "MIG-7f3c"
    assert rank_environment(dcu) == {UNIT_ENV: "DCU-1", "HIP_VISIBLE_DEVICES": "5"}
    assert choose_backend([gpu1, gpu3]) == "nccl" and choose_backend([dcu]) == "nccl"
    assert choose_backend([gpu1, gpu3], override="gloo") == "gloo"
    with pytest.raises(InvalidRequestError, match="one vendor"):
        choose_backend([gpu1, dcu])
    with pytest.raises(InvalidRequestError, match="'mpi' is not one of"):
        choose_backend([gpu1], override="mpi")
    with pytest.raises(InvalidRequestError, match="vendor 'acme'"):
        rank_environment(GangUnit("X", "h", 0, "acme"))


def test_a_hygon_partition_rank_is_pointed_at_its_partition_not_just_the_card() -> None:
    vdcu = GangUnit("vdcu-6", "d0", 1, "hygon", "vdcu", "vdcu")
    mig = GangUnit("dcu2-mig-gi1", "d0", 2, "hygon", "mig", "2g.15gb")
    assert rank_environment(vdcu) == {
        UNIT_ENV: "vdcu-6",
        "HIP_VISIBLE_DEVICES": "1",
        "GPUFLOW_VDCU_ID": "vdcu-6",
        "GPUFLOW_VDCU_CONF": "/etc/vdev/vdev6.conf",
        "GPUFLOW_VDCU_RUNTIME_PATH": "/etc/vdev/docker/vdev6.conf",
    }
    assert rank_environment(mig) == {
        UNIT_ENV: "dcu2-mig-gi1",
        "HIP_VISIBLE_DEVICES": "2",
        "GPUFLOW_DCU_MIG_CONF": "/etc/dmi_mig_config/ci/dev2gi1ci0.conf",
    }
    # A rank rebound from a vDCU to a whole card keeps nothing of the vDCU.
    environ = dict(rank_environment(vdcu))
    bind_this_rank([GangUnit("DCU-9", "d0", 3, "hygon")], 0, environ)
    assert environ == {UNIT_ENV: "DCU-9", "HIP_VISIBLE_DEVICES": "3"}
    # NVIDIA is as before: nothing Hygon-specific.
    assert rank_environment(GangUnit("MIG-7f3c", "h0", 2, "nvidia", "mig", "3g.20gb")) == {
        UNIT_ENV: "MIG-7f3c",
        "CUDA_VISIBLE_DEVICES": "MIG-7f3c",
    }


def test_a_gang_that_cannot_split_its_batch_is_refused_before_it_starts() -> None:
    spec = small_spec("odd")  # batch 2
    three = [GangUnit(f"r{i}", "n", i, "sim") for i in range(3)]
    with pytest.raises(InvalidRequestError, match="global batch 2 does not split into 3"):
        check_gang(spec, three)
    with pytest.raises(InvalidRequestError, match="span nodes"):
        check_gang(spec, [GangUnit("a", "n0", 0, "sim"), GangUnit("b", "n1", 0, "sim")])


def test_each_rank_reports_its_workload_to_its_own_twin_device(gpuflow_home) -> None:
    """What rank_main does with its unit: the twin's device 1 and 3 get busy, one tenant
    per rank, and idle again once each rank ends its workload."""
    from gpuflow.tasks.training.distributed.worker import rank_owner, unit_probe

    backend, spec, units = _units_1_and_3(gpuflow_home)
    probes = [
        unit_probe(("sim", spec), unit, "g", rank, min_interval_s=0.0)
        for rank, unit in enumerate(units)
    ]
    readings = [probe.observe_step(busy_s=0.9, wall_s=1.0) for probe in probes]
    assert all(r is not None and r > 0.5 for r in readings), readings
    util = {i: backend.telemetry("h0", i).utilization_ratio for i in range(4)}
    assert util[1] > 0.5 and util[3] > 0.5 and util[0] == util[2] == 0.0, util
    assert [backend.workload_status(rank_owner("g", r)) for r in (0, 1)] == ["running"] * 2
    for probe in probes:
        probe.close()
    assert [backend.workload_status(rank_owner("g", r)) for r in (0, 1)] == ["absent"] * 2
