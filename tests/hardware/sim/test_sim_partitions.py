from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from gpuflow.hardware.backend import (
    DeviceLostError,
    HardwareError,
    InvalidRequestError,
    PartitionRequest,
    UnsupportedError,
)
from gpuflow.hardware.placement import LayoutError
from gpuflow.hardware.sim import SimBackend
from gpuflow.hardware.skus import sku
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def test_v100_refuses_mig(quiet: SimBackend) -> None:
    assert quiet.partition_profiles("v100-0", 0) == []
    with pytest.raises(UnsupportedError, match="v100-0:0"):
        quiet.set_partition_mode("v100-0", 0, True)
    with pytest.raises(UnsupportedError):
        quiet.create_partitions("v100-0", 0, [PartitionRequest("1g.5gb")])
    assert quiet.partition_mode("v100-0", 0) is False


def test_mig_needs_mig_mode_first(quiet: SimBackend) -> None:
    with pytest.raises(HardwareError, match="MIG mode is disabled"):
        quiet.create_partitions("a100-0", 0, [PartitionRequest("1g.5gb")])
    assert quiet.partitions("a100-0", 0) == []


def test_all_balanced_layout_needs_the_3g_at_slice_4(quiet: SimBackend) -> None:
    profiles = {p.name: p for p in quiet.partition_profiles("a100-0", 0)}
    assert profiles["3g.20gb"].profile_id == 9 and profiles["1g.5gb"].max_count == 7
    quiet.set_partition_mode("a100-0", 0, True)
    layout = ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"]
    created = quiet.create_partitions("a100-0", 0, [PartitionRequest(p) for p in layout])
    assert [p.profile for p in created] == layout
    assert created[0].placement_start == 4
    assert all(p.uuid.startswith("MIG-") for p in created)
    assert len({p.uuid for p in created}) == 4
    assert quiet.partitions("a100-0", 0) == created
    # The device is full now: one more slice does not fit, and nothing is created.
    with pytest.raises(LayoutError):
        quiet.create_partitions("a100-0", 0, [PartitionRequest("1g.5gb")])
    assert len(quiet.partitions("a100-0", 0)) == 4


def test_a_bad_layout_creates_nothing(quiet: SimBackend) -> None:
    quiet.set_partition_mode("a100-0", 0, True)
    with pytest.raises(LayoutError, match="max-count"):
        quiet.create_partitions(
            "a100-0", 0, [PartitionRequest("1g.5gb")] * 3 + [PartitionRequest("4g.20gb")] * 2
        )
    with pytest.raises(LayoutError, match="unknown-profile"):
        quiet.create_partitions("a100-0", 0, [PartitionRequest("1g.5gb"), PartitionRequest("vdcu")])
    assert quiet.partitions("a100-0", 0) == []


def test_mode_and_destroy_rules(quiet: SimBackend) -> None:
    quiet.set_partition_mode("a100-0", 0, True)
    a, b = quiet.create_partitions(
        "a100-0", 0, [PartitionRequest("4g.20gb"), PartitionRequest("3g.20gb")]
    )
    quiet.set_workload("a100-0", 0, "job", 1.0, partition_uuid=a.uuid)
    with pytest.raises(HardwareError, match="job"):
        quiet.set_partition_mode("a100-0", 0, False)
    with pytest.raises(HardwareError, match="tenants job"):
        quiet.destroy_partitions("a100-0", 0, [a.uuid])
    with pytest.raises(InvalidRequestError, match="MIG-nope"):
        quiet.destroy_partitions("a100-0", 0, ["MIG-nope"])
    quiet.destroy_partitions("a100-0", 0, [b.uuid])
    assert quiet.partitions("a100-0", 0) == [a]
    quiet.clear_workload("job")
    with pytest.raises(HardwareError, match="destroy its partitions first"):
        quiet.set_partition_mode("a100-0", 0, False)
    quiet.destroy_partitions("a100-0", 0)
    quiet.set_partition_mode("a100-0", 0, False)
    assert quiet.partition_mode("a100-0", 0) is False
    quiet.inject_fault("a100-0", 1, "xid79")
    with pytest.raises(DeviceLostError):
        quiet.set_partition_mode("a100-0", 1, True)


def test_vdcu_rules(quiet: SimBackend) -> None:
    (prof,) = quiet.partition_profiles("dcu-0", 0)
    s = sku("dcu-z100")
    assert (prof.name, prof.kind, prof.compute_slices, prof.memory_mb, prof.max_count) == (
        "vdcu",
        "vdcu",
        s.compute_units,
        s.memory_total_mb,
        4,
    )
    sizes = [(5, 4096), (15, 8192), (20, 8192), (20, 8192)]  # HAMi's example
    made = quiet.create_partitions(
        "dcu-0", 0, [PartitionRequest("vdcu", compute_units=c, memory_mb=m) for c, m in sizes[:2]]
    )
    made += quiet.create_partitions(
        "dcu-0", 0, [PartitionRequest("vdcu", compute_units=c, memory_mb=m) for c, m in sizes[2:]]
    )
    assert [(p.compute_units, p.memory_mb, p.kind) for p in made] == [
        (c, m, "vdcu") for c, m in sizes
    ]
    with pytest.raises(LayoutError, match="max-count"):
        quiet.create_partitions(
            "dcu-0", 0, [PartitionRequest("vdcu", compute_units=1, memory_mb=1)]
        )
    quiet.destroy_partitions("dcu-0", 0, [made[0].uuid])
    with pytest.raises(LayoutError, match="compute-units"):
        quiet.create_partitions(
            "dcu-0", 0, [PartitionRequest("vdcu", compute_units=6, memory_mb=1)]
        )
    with pytest.raises(InvalidRequestError, match="placement_start"):
        quiet.create_partitions(
            "dcu-0", 0, [PartitionRequest("vdcu", placement_start=0, compute_units=1, memory_mb=1)]
        )
    assert len(quiet.partitions("dcu-0", 0)) == 3


def test_partition_uuids_are_deterministic(write_spec, tmp_path: Path) -> None:
    spec = write_spec(
        {
            "name": "d",
            "seed": 5,
            "nodes": [
                {
                    "name": "n",
                    "region": "r",
                    "role": "active",
                    "devices": [{"sku": "h200", "count": 1}],
                }
            ],
        }
    )
    uuids = []
    for home in ("a", "b"):
        t = SimBackend(home=tmp_path / home, spec_path=spec)
        t.set_partition_mode("n", 0, True)
        uuids.append(
            [p.uuid for p in t.create_partitions("n", 0, [PartitionRequest("1g.18gb")] * 2)]
        )
    assert uuids[0] == uuids[1]


MIG_NAMES = ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
SPEC = """
name: hyp
seed: 1
faults: {natural: false}
nodes:
  - {name: a, region: r, role: active, devices: [{sku: a100-40gb, count: 1}]}
  - {name: d, region: r, role: active, devices: [{sku: dcu-k100, count: 1}]}
"""

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("mig"), st.lists(st.sampled_from(MIG_NAMES), min_size=1, max_size=4)),
        st.tuples(
            st.just("vdcu"),
            st.lists(st.tuples(st.integers(1, 80), st.integers(1, 40_000)), min_size=1, max_size=3),
        ),
        st.tuples(st.just("destroy"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=ACTIONS)
def test_no_applied_layout_exceeds_slices_or_memory(actions: list[tuple]) -> None:
    with tempfile.TemporaryDirectory() as d:
        spec = Path(d) / "spec.yaml"
        spec.write_text(SPEC, encoding="utf-8")
        twin = SimBackend(home=Path(d), spec_path=spec)
        twin.set_partition_mode("a", 0, True)
        a100, k100 = sku("a100-40gb"), sku("dcu-k100")
        for action, arg in actions:
            try:
                if action == "mig":
                    twin.create_partitions("a", 0, [PartitionRequest(n) for n in arg])
                elif action == "vdcu":
                    twin.create_partitions(
                        "d",
                        0,
                        [PartitionRequest("vdcu", compute_units=c, memory_mb=m) for c, m in arg],
                    )
                else:
                    for node in ("a", "d"):
                        parts = twin.partitions(node, 0)
                        if parts:
                            twin.destroy_partitions(node, 0, [parts[arg % len(parts)].uuid])
            except LayoutError:
                pass
            mig = twin.partitions("a", 0)
            profiles = {p.name: p for p in a100.mig_profiles}
            assert sum(profiles[p.profile].compute_slices for p in mig) <= 7
            used: set[int] = set()
            for p in mig:
                span = set(range(p.placement_start, p.placement_start + p.placement_size))
                assert not (span & used) and max(span) < 8
                assert p.placement_start in profiles[p.profile].placement_starts
                used |= span
            assert sum(p.memory_mb for p in mig) <= a100.memory_total_mb
            vd = twin.partitions("d", 0)
            assert len(vd) <= 4
            assert sum(p.compute_units for p in vd) <= k100.compute_units
            assert sum(p.memory_mb for p in vd) <= k100.memory_total_mb


def test_a_dcu_is_partitioned_exactly_while_it_has_vdcus(quiet: SimBackend) -> None:
    """The twin's Hygon mode reads as hy-smi reports it (no per-DCU switch)."""
    quiet.set_partition_mode("dcu-0", 0, True)  # nothing to switch on: a no-op
    assert quiet.partition_mode("dcu-0", 0) is False
    assert quiet.partition_mode_state("dcu-0", 0).current is False
    (v,) = quiet.create_partitions(
        "dcu-0", 0, [PartitionRequest("vdcu", compute_units=20, memory_mb=4096)]
    )
    assert quiet.partition_mode("dcu-0", 0) is True
    with pytest.raises(HardwareError, match="destroy its partitions first"):
        quiet.set_partition_mode("dcu-0", 0, False)
    quiet.destroy_partitions("dcu-0", 0, [v.uuid])
    assert quiet.partition_mode("dcu-0", 0) is False  # no flag left behind
    quiet.set_partition_mode("dcu-0", 0, False)
    # NVIDIA keeps its mode: on with nothing carved is a state there.
    quiet.set_partition_mode("a100-0", 0, True)
    assert quiet.partition_mode("a100-0", 0) is True and quiet.partitions("a100-0", 0) == []
