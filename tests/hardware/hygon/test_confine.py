"""Where a Hygon partition's confinement lives (files, not variables) and its Kubernetes names."""

from __future__ import annotations

import pytest
from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.hygon import confine


def test_vdcu_ids_map_to_the_files_hygons_plugin_and_toolkit_mount() -> None:
    assert confine.vdev_number("vdcu-12") == 12
    assert confine.vdcu_conf_path("vdcu-0") == "/etc/vdev/vdev0.conf"
    assert confine.vdcu_runtime_path("vdcu-0") == "/etc/vdev/docker/vdev0.conf"
    for not_hy_smi in ("VDCU-9f2c", "vdcu-", "vdcu-1;rm", "dcu0-mig-gi1"):
        assert confine.vdcu_conf_path(not_hy_smi) is None
    assert confine.mig_conf_path("dcu3-mig-gi7") == "/etc/dmi_mig_config/ci/dev3gi7ci0.conf"
    assert confine.mig_conf_path("dcu3-mig-gi7", compute_instance=2).endswith("dev3gi7ci2.conf")
    assert confine.mig_conf_path("vdcu-1") is None


def test_process_environment_names_the_files_or_nothing() -> None:
    assert confine.process_environment("vdcu", ["vdcu-1", "vdcu-5"]) == {
        "GPUFLOW_VDCU_CONF": "/etc/vdev/vdev1.conf,/etc/vdev/vdev5.conf",
        "GPUFLOW_VDCU_RUNTIME_PATH": "/etc/vdev/docker/vdev1.conf,/etc/vdev/docker/vdev5.conf",
    }
    assert confine.process_environment("mig", ["dcu0-mig-gi1"]) == {
        "GPUFLOW_DCU_MIG_CONF": "/etc/dmi_mig_config/ci/dev0gi1ci0.conf"
    }
    # A list with an id no file can be derived from gives no half list.
    assert confine.process_environment("vdcu", ["vdcu-1", "VDCU-x"]) == {}
    assert confine.process_environment("device", ["DCU-0"]) == {}


def test_kubernetes_names_follow_hygons_plugin() -> None:
    # util/dcu.go: "share-" + CUs + "c-" + round(bytes / GiB) + "g".
    assert confine.share_resource(4, 16384) == "hygon.com/dcu-share-4c-16g"
    assert confine.share_resource(20, 8192) == "hygon.com/dcu-share-20c-8g"
    assert confine.share_resource(5, 1536) == "hygon.com/dcu-share-5c-2g"  # 1.5 rounds up
    assert confine.share_resource(5, 1535) == "hygon.com/dcu-share-5c-1g"
    with pytest.raises(InvalidRequestError, match="compute units and memory"):
        confine.share_resource(0, 1024)
    # GetAllMigDCUs: "MIG " prefix dropped, "." -> "-".
    assert confine.mig_resource("4g.31gb") == "hygon.com/dcu-mig-4g-31gb"
    assert confine.mig_resource("MIG 1g.7gb") == "hygon.com/dcu-mig-1g-7gb"
    with pytest.raises(InvalidRequestError, match="not a Kubernetes resource name"):
        confine.mig_resource("2g 15gb/x")
    assert confine.hami_cores_percent(15, 60) == 25
    assert confine.hami_cores_percent(1, 1000) == 1 and confine.hami_cores_percent(70, 60) == 100
