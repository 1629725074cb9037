"""A placement as the job sees it: visible devices, torch device, Kubernetes job variables."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Resource
from gpuflow.tasks.scheduling.env import gpu_product, kubernetes_job_variables, run_environment


def _res(
    rid: str,
    node: str = "n0",
    index: int = 0,
    kind: str = "device",
    profile: str | None = None,
    vendor: str = "NVIDIA",
    sku: str = "NVIDIA A100-SXM4-40GB",
    memory_mb: int = 40960,
    compute_units: int | None = None,
) -> Resource:
    return Resource(
        resource_id=rid,
        kind=kind,
        node=node,
        device_index=index,
        device_uuid=f"GPU-{node}-{index}",
        vendor=vendor,
        sku=sku,
        region="r1",
        memory_mb=memory_mb,
        compute_units=compute_units,
        profile=profile,
        placement_start=None,
        cordoned=False,
    )


def test_whole_devices_on_one_node() -> None:
    env = run_environment([_res("GPU-a", index=0), _res("GPU-b", index=1)], "job", "nvml")
    assert env.env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env.torch_device == "cuda:0" and env.env["GPUFLOW_TORCH_DEVICE"] == "cuda:0"
    k8s = env.job_variables
    assert k8s["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert k8s["node_selector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "kubernetes.io/hostname": "n0",
    }
    assert run_environment([_res("GPU-a")], "job", "sim").torch_device == "cpu"


def test_mig_partitions_by_uuid() -> None:
    env = run_environment([_res("MIG-1", kind="mig", profile="3g.20gb")], "job", "nvml")
    assert env.env["CUDA_VISIBLE_DEVICES"] == "MIG-1"
    assert env.job_variables["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": "1"}


def test_multi_node_gang_gets_one_env_per_node_and_no_hostname_pin() -> None:
    rs = [
        _res("GPU-a", "n0", 0),
        _res("GPU-b", "n0", 1),
        _res("GPU-c", "n1", 0),
        _res("GPU-d", "n1", 1),
    ]
    env = run_environment(rs, "job", "nvml")
    assert env.env_by_node == {
        "n0": {**env.env_by_node["n0"], "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"},
        "n1": {**env.env_by_node["n1"], "CUDA_VISIBLE_DEVICES": "GPU-c,GPU-d"},
    }
    with pytest.raises(InvalidRequestError, match="spans 2 nodes"):
        _ = env.env
    k8s = kubernetes_job_variables(rs, "job")
    assert k8s["pods"] == 2 and k8s["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert "kubernetes.io/hostname" not in k8s["node_selector"]


def test_hygon_whole_and_vdcu() -> None:
    whole = run_environment(
        [_res("DCU-0", index=1, vendor="Hygon", sku="Hygon DCU K100")], "j", "hygon"
    )
    assert whole.env["HIP_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES" not in whole.env
    assert whole.job_variables["resources"]["limits"] == {"hygon.com/dcunum": "1"}
    assert whole.job_variables["pod_annotations"] == {"hygon.com/use-dcutype": "K100"}
    v = run_environment(
        [
            _res(
                "VDCU-1",
                kind="vdcu",
                profile="vdcu",
                vendor="Hygon",
                sku="Hygon DCU K100",
                memory_mb=16384,
                compute_units=30,
            )
        ],
        "j",
        "hygon",
    )
    assert v.env["GPUFLOW_VDCU_ID"] == "VDCU-1"
    assert v.job_variables["resources"]["limits"] == {
        "hygon.com/dcunum": "1",
        "hygon.com/dcumem": "16384",
        "hygon.com/dcucores": "25",
    }


def test_mixed_placements_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="one kind of unit on one SKU"):
        run_environment([_res("a"), _res("b", sku="Tesla V100-SXM2-32GB")], "j", "nvml")
    with pytest.raises(InvalidRequestError, match="no resources"):
        run_environment([], "j", "nvml")
    assert gpu_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
