"""GPU_I_ID on NVML: each partition's GPU instance id as the driver numbered it."""

from __future__ import annotations

from gpuflow.hardware.dcgm_mapping import instance_ids

from tests.hardware.nvml.helpers import NODE, FakeNvml, R, backend, mig_on


def test_each_partition_carries_the_gi_id_nvml_gave_it():
    fake = FakeNvml(["a100-40gb", "a100-40gb"])
    mig_on(fake, 0)
    b = backend(fake)
    first = b.create_partitions(NODE, 0, [R("3g.20gb"), R("1g.5gb")])
    # Destroying and creating again: the driver's ids, not positions or placements, count.
    b.destroy_partitions(NODE, 0, [first[1].uuid])
    b.create_partitions(NODE, 0, [R("2g.10gb"), R("1g.5gb")])
    parts = b.partitions(NODE, 0)
    by_start = {gi.start: gi.id for gi in fake.device(0).gpu_instances.values()}
    want = {p.uuid: by_start[p.placement_start] for p in parts}
    assert len(want) == 3 and b.gpu_instance_ids(NODE, 0) == want
    # ...and what the exporter labels them with (the driver's, never a derived one).
    assert instance_ids(b, b.device(NODE, 0), parts) == want
    assert b.gpu_instance_ids(NODE, 1) == {}  # no partitions, nothing to number
