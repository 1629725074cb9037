"""Device layouts: how they describe themselves."""

from __future__ import annotations

from gpuflow.hardware.backend import PartitionRequest
from gpuflow.hardware.partition import DeviceLayout


def test_layouts_describe_themselves_briefly() -> None:
    def lay(enabled: bool, *reqs: PartitionRequest) -> DeviceLayout:
        return DeviceLayout("n", 0, "s", enabled, reqs)

    assert lay(False).describe() == "off"
    assert lay(True).describe() == "on (no partitions)"
    mig = lay(
        True,
        PartitionRequest("3g.20gb", placement_start=4),
        PartitionRequest("1g.5gb", placement_start=2),
        PartitionRequest("1g.5gb", placement_start=3),
    )
    assert mig.describe() == "on: 3g.20gb@4, 2x 1g.5gb@2,3"
    vdcu = lay(True, *[PartitionRequest("vdcu", compute_units=20, memory_mb=8192)] * 2)
    assert vdcu.describe() == "on: 2x vdcu 20cu/8192MiB"
