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


def _dcu(rid: str, kind: str = "device", **kw: object) -> Resource:
    base: dict[str, object] = {"vendor": "Hygon", "sku": "Hygon DCU K100", "memory_mb": 65536}
    if kind == "vdcu":
        base.update(profile="vdcu", memory_mb=16384, compute_units=30)
    base.update(kw)
    return _res(rid, kind=kind, **base)  # type: ignore[arg-type]


def test_hygon_whole_cards_use_hygons_plugin_by_default_and_hamis_on_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUFLOW_HYGON_DEVICE_PLUGIN", raising=False)
    whole = run_environment([_dcu("DCU-0", index=1)], "j", "hygon")
    assert whole.env["HIP_VISIBLE_DEVICES"] == "1" and "CUDA_VISIBLE_DEVICES" not in whole.env
    assert not any(k.startswith("GPUFLOW_VDCU") for k in whole.env)
    assert whole.job_variables["resources"]["limits"] == {"hygon.com/dcu": "1"}
    assert whole.job_variables["pod_annotations"] == {"hygon.com/use-dcutype": "K100"}
    hami = kubernetes_job_variables([_dcu("DCU-0"), _dcu("DCU-1", index=1)], "j", "hami")
    assert hami["resources"]["limits"] == {"hygon.com/dcunum": "2"}
    monkeypatch.setenv("GPUFLOW_HYGON_DEVICE_PLUGIN", "HAMi")
    assert kubernetes_job_variables([_dcu("DCU-0")], "j")["resources"]["limits"] == {
        "hygon.com/dcunum": "1"
    }
    monkeypatch.setenv("GPUFLOW_HYGON_DEVICE_PLUGIN", "volcano")
    with pytest.raises(InvalidRequestError, match="'volcano' is not one of hygon, hami"):
        kubernetes_job_variables([_dcu("DCU-0")], "j")


def test_a_pre_created_vdcu_reaches_the_job_as_that_vdcu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFLOW_HYGON_DEVICE_PLUGIN", raising=False)
    v = run_environment([_dcu("vdcu-3", kind="vdcu", index=2)], "j", "hygon")
    # The card through HIP; the vDCU through its config file, which the launcher must make
    # visible where the DTK/hyhal runtime reads it.
    assert v.env["HIP_VISIBLE_DEVICES"] == "2" and v.env["GPUFLOW_VDCU_ID"] == "vdcu-3"
    assert v.env["GPUFLOW_VDCU_CONF"] == "/etc/vdev/vdev3.conf"
    assert v.env["GPUFLOW_VDCU_RUNTIME_PATH"] == "/etc/vdev/docker/vdev3.conf"
    # Kubernetes: Hygon's plugin's pre-created vDCU resource (CUs, GiB), not HAMi's.
    assert v.job_variables["resources"]["limits"] == {"hygon.com/dcu-share-30c-16g": "1"}
    # HAMi's names only for a vDCU carved at pod start (dynamic).
    dyn = kubernetes_job_variables([_dcu("vdcu-3", kind="vdcu")], "j", "hami")
    assert dyn["resources"]["limits"] == {
        "hygon.com/dcunum": "1",
        "hygon.com/dcumem": "16384",
        "hygon.com/dcucores": "25",  # 30 of a K100's 120 CUs
    }
    # The twin's vDCU ids name no hy-smi device: no file to point at.
    twin = run_environment([_dcu("VDCU-1a2b", kind="vdcu")], "j", "sim")
    assert twin.env["GPUFLOW_VDCU_ID"] == "VDCU-1a2b" and "GPUFLOW_VDCU_CONF" not in twin.env


def test_a_hygon_mig_instance_reaches_the_job_as_that_instance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GPUFLOW_HYGON_DEVICE_PLUGIN", raising=False)
    m = run_environment(
        [_dcu("dcu1-mig-gi2", kind="mig", index=1, profile="2g.15gb", memory_mb=15360)],
        "j",
        "hygon",
    )
    assert m.env["HIP_VISIBLE_DEVICES"] == "1"
    assert m.env["GPUFLOW_DCU_MIG_CONF"] == "/etc/dmi_mig_config/ci/dev1gi2ci0.conf"
    assert "GPUFLOW_VDCU_ID" not in m.env
    # Not a whole card: the MIG resource of Hygon's plugin, whichever mode vDCUs use.
    assert m.job_variables["resources"]["limits"] == {"hygon.com/dcu-mig-2g-15gb": "1"}
    hami = kubernetes_job_variables(
        [_dcu("dcu1-mig-gi2", kind="mig", profile="4g.31gb")], "j", "hami"
    )
    assert hami["resources"]["limits"] == {"hygon.com/dcu-mig-4g-31gb": "1"}


def test_nvidia_placements_get_no_hygon_variables() -> None:
    env = run_environment([_res("MIG-1", kind="mig", profile="3g.20gb")], "job", "nvml", "hami")
    assert not any(k.startswith(("GPUFLOW_VDCU", "GPUFLOW_DCU", "HIP_")) for k in env.env)
    assert env.job_variables["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": "1"}


def test_mixed_placements_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="one kind of unit on one SKU"):
        run_environment([_res("a"), _res("b", sku="Tesla V100-SXM2-32GB")], "j", "nvml")
    with pytest.raises(InvalidRequestError, match="no resources"):
        run_environment([], "j", "nvml")
    assert gpu_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
