"""The placement engine: gangs, policies, partitions, regions, queues, reservations, elastic."""

from __future__ import annotations

import pytest
from gpuflow.tasks.scheduling.model import (
    Growth,
    HoldChange,
    JobRequest,
    Placement,
    QueueFullError,
    SubmissionRefused,
)

from tests.tasks.scheduling.helpers import A100, DCU, V100, make_engine


def _req(job_id: str, **kw) -> JobRequest:
    return JobRequest(job_id=job_id, **kw)


def _place_all(engine, now: float = 0.0) -> list[Placement]:
    return [d for d in engine.schedule(now) if isinstance(d, Placement)]


def test_gang_is_one_sku_and_waits_rather_than_mixing() -> None:
    engine = make_engine([("a0", "r1", A100, 4), ("v0", "r1", V100, 4)], node_local_gangs=False)
    engine.submit(_req("fill-a", count=2, skus=("a100-40gb",)), 0)
    engine.submit(_req("fill-v", count=2, skus=("v100",)), 0)
    _place_all(engine)
    # 2 A100 + 2 V100 are free: 4 devices, but never as one gang.
    engine.submit(_req("gang", count=4), 0)
    assert _place_all(engine) == []
    assert engine.jobs["gang"].state == "queued"
    engine.finish("fill-a", 1)
    (p,) = _place_all(engine, 1)
    assert p.job_id == "gang" and p.sku == A100 and len(p.resource_ids) == 4
    assert {engine.fleet.units[r].dev.sku for r in p.resource_ids} == {A100}
    assert engine.audit() == []


def test_refused_at_submission_with_the_reason() -> None:
    engine = make_engine([("a0", "r1", A100, 4), ("v0", "r2", V100, 2)])
    with pytest.raises(SubmissionRefused, match="no MIG"):
        engine.submit(_req("m", profile="3g.20gb", skus=("v100",)), 0)
    with pytest.raises(SubmissionRefused, match=r"offers no MIG profile 3g\.40gb.*3g\.20gb"):
        engine.submit(_req("m2", profile="3g.40gb", skus=("a100-40gb",)), 0)
    with pytest.raises(SubmissionRefused, match="at most 4"):
        engine.submit(_req("big", count=5, skus=("a100-40gb",)), 0)
    with pytest.raises(SubmissionRefused, match="unknown region 'mars'"):
        engine.submit(_req("r", region="mars"), 0)
    with pytest.raises(SubmissionRefused, match="no Hygon DCU Z100"):
        engine.submit(_req("d", skus=("dcu-z100",)), 0)
    with pytest.raises(SubmissionRefused, match="exceeds a whole"):
        make_engine([("d0", "r1", DCU, 1)]).submit(
            _req("v", profile="vdcu", compute_units=61, memory_mb=1024), 0
        )
    # A gang bigger than one region, even if the fleet as a whole could hold it.
    with pytest.raises(SubmissionRefused, match="at most"):
        make_engine([("a0", "r1", A100, 4), ("a1", "r2", A100, 4)]).submit(
            _req("split", count=6, skus=("a100-40gb",), region="r1", allow_spill=True), 0
        )
    assert engine.jobs == {} and len(engine.queue) == 0


def test_binpack_fills_used_nodes_spread_takes_empty_ones() -> None:
    for policy, expected in (("binpack", "n0"), ("spread", "n1")):
        engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)], policy=policy)
        engine.submit(_req("first", count=2), 0)
        (p,) = _place_all(engine)
        assert p.nodes == ("n0",)  # both nodes empty: the first one either way
        engine.submit(_req("small"), 0)
        (p,) = _place_all(engine)
        assert p.nodes == (expected,), policy


def test_binpack_keeps_whole_nodes_for_big_gangs() -> None:
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)])
    for i in range(3):
        engine.submit(_req(f"s{i}"), 0)
    _place_all(engine)
    engine.submit(_req("gang", count=4), 0)
    (p,) = _place_all(engine)
    assert p.nodes == ("n1",)  # binpack put the three singles on n0
    spread = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)], policy="spread")
    for i in range(3):
        spread.submit(_req(f"s{i}"), 0)
    _place_all(spread)
    spread.submit(_req("gang", count=4), 0)
    assert _place_all(spread) == []  # 5 free, but no node has 4: the gang waits


def test_node_local_gangs_wait_for_one_node_unless_disabled() -> None:
    for local, placed in ((True, False), (False, True)):
        engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)], node_local_gangs=local)
        engine.submit(_req("a", count=1), 0)
        engine.submit(_req("b", count=1, policy="spread"), 0)
        _place_all(engine)
        engine.submit(_req("gang", count=4), 0)
        assert bool(_place_all(engine)) is placed
    # Bigger than a node: whole nodes first.
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4), ("n2", "r1", A100, 4)])
    engine.submit(_req("one"), 0)
    _place_all(engine)
    engine.submit(_req("eight", count=8), 0)
    (p,) = _place_all(engine)
    assert set(p.nodes) == {"n1", "n2"}


def test_regions_spill_only_when_allowed_and_never_split() -> None:
    engine = make_engine([("e0", "east", A100, 2), ("w0", "west", A100, 2)])
    engine.submit(_req("fill", count=2, region="east"), 0)
    _place_all(engine)
    engine.submit(_req("stay", region="east"), 0)
    engine.submit(_req("spill", region="east", allow_spill=True), 0)
    placed = {p.job_id: p for p in _place_all(engine)}
    assert set(placed) == {"spill"} and placed["spill"].region == "west"
    assert engine.jobs["stay"].state == "queued"


def test_existing_partitions_binpack_onto_busy_devices() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    f = engine.fleet
    for dev in ("n0-0", "n0-1"):
        for k, start in enumerate((0, 4)):
            f.add_partition(dev, f"MIG-{dev}-{k}", "3g.20gb", "mig", 20480, 3, start, 4)
    engine.submit(_req("m1", profile="3g.20gb"), 0)
    (p1,) = _place_all(engine)
    engine.submit(_req("m2", profile="3g.20gb"), 0)
    (p2,) = _place_all(engine)
    dev = lambda p: f.units[p.resource_ids[0]].dev.uuid  # noqa: E731
    assert dev(p1) == dev(p2)  # the second lands beside the first; the other device stays clean
    assert f.devices["n0-1"].busy == 0
    assert engine.audit() == []


def test_proposes_repartitioning_an_idle_device_as_a_plan() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("busy"), 0)
    _place_all(engine)
    engine.submit(_req("m", count=3, profile="2g.10gb"), 0)
    (p,) = _place_all(engine)
    assert not p.ready and len(p.repartition) == 1
    step = p.repartition[0]
    assert (step.node, step.index, step.destroy) == ("n0", 1, ())
    assert [r.profile for r in step.create] == ["2g.10gb"] * 3
    assert sorted(r.placement_start for r in step.create) == [0, 2, 4]
    plan = step.plan_document()
    assert plan["version"] == "v1"
    (entry,) = next(iter(plan["mig-configs"].values()))
    assert entry["mig-devices"] == {"2g.10gb": 3} and entry["devices"] == [1]
    # The plan parses as a partition plan of the foundation.
    from gpuflow.hardware.partition import parse_plan

    parse_plan(plan)
    # Nobody else can take the device while it is being cut.
    engine.submit(_req("other"), 0)
    assert _place_all(engine) == []
    created = [(f"MIG-{k}", r, 10240, None) for k, r in enumerate(step.create)]
    engine.apply_repartition(step, created)
    (p,) = _place_all(engine, 1)
    assert p.job_id == "m" and sorted(p.resource_ids) == ["MIG-0", "MIG-1", "MIG-2"]
    assert engine.audit() == []


def test_additive_repartition_keeps_busy_partitions() -> None:
    engine = make_engine([("n0", "r1", A100, 1)])
    engine.fleet.add_partition("n0-0", "MIG-a", "3g.20gb", "mig", 20480, 3, 4, 4)
    engine.submit(_req("holder", profile="3g.20gb"), 0)
    _place_all(engine)
    engine.submit(_req("more", count=2, profile="1g.5gb"), 0)
    (p,) = _place_all(engine)
    (step,) = p.repartition
    assert step.destroy == () and all(r.placement_start < 4 for r in step.create)
    entry = next(iter(step.plan_document()["mig-configs"].values()))[0]
    assert entry["mig-devices"] == {"1g.5gb": 2, "3g.20gb": 1}


def test_idle_cut_devices_merge_back_for_whole_device_work() -> None:
    engine = make_engine([("n0", "r1", A100, 1)])
    engine.fleet.add_partition("n0-0", "MIG-a", "3g.20gb", "mig", 20480, 3, 0, 4)
    engine.submit(_req("whole"), 0)
    (p,) = _place_all(engine)
    (step,) = p.repartition
    assert step.destroy == ("MIG-a",) and step.create == ()
    assert step.desired_layout()["mig-enabled"] is False
    engine.apply_repartition(step, [])
    (p,) = _place_all(engine, 1)
    assert p.resource_ids == ("n0-0",) and p.kind == "device"


def test_vdcu_best_fit_then_new_vdcu() -> None:
    engine = make_engine([("d0", "r1", DCU, 1)])
    f = engine.fleet
    f.add_partition("d0-0", "VDCU-big", "vdcu", "vdcu", 16384, 30)
    f.add_partition("d0-0", "VDCU-small", "vdcu", "vdcu", 8192, 10)
    engine.submit(_req("v1", profile="vdcu", compute_units=8, memory_mb=8000), 0)
    (p,) = _place_all(engine)
    assert p.resource_ids == ("VDCU-small",)
    engine.submit(_req("v2", profile="vdcu", compute_units=8, memory_mb=8000), 0)
    (p,) = _place_all(engine)
    assert p.resource_ids == ("VDCU-big",)
    engine.submit(_req("v3", profile="vdcu", compute_units=15, memory_mb=4096), 0)
    (p,) = _place_all(engine)
    (step,) = p.repartition
    assert [(r.compute_units, r.memory_mb) for r in step.create] == [(15, 4096)]
    assert step.desired_layout()["vdcu-devices"][-1] == {"compute-units": 15, "memory-mb": 4096}
    engine.submit(_req("v4", profile="vdcu", compute_units=30, memory_mb=1024), 0)
    assert _place_all(engine) == []  # 60 CUs in all: 30 + 10 + 15 leaves 5


def test_bounded_queue_refuses_with_depth_and_how_to_raise_it() -> None:
    engine = make_engine([("n0", "r1", A100, 1)], queue_depth=2)
    engine.submit(_req("run"), 0)
    _place_all(engine)
    engine.submit(_req("w1"), 0)
    engine.submit(_req("w2"), 0)
    with pytest.raises(QueueFullError) as err:
        engine.submit(_req("w3"), 0)
    msg = str(err.value)
    assert (
        "queue depth 2" in msg
        and "GPUFLOW_QUEUE_DEPTH" in msg
        and "2 jobs that name no region already wait" in msg
    )
    # Per pool: another region's queue is independent.
    engine2 = make_engine([("n0", "r1", A100, 1), ("n1", "r2", A100, 1)], queue_depths={"r1": 1})
    engine2.submit(_req("a", region="r1"), 0)
    with pytest.raises(QueueFullError, match="pool 'r1'"):
        engine2.submit(_req("b", region="r1"), 0)
    engine2.submit(_req("c", region="r2"), 0)


def test_reservation_holds_capacity_for_its_start_time() -> None:
    engine = make_engine([("n0", "r1", A100, 2)], reservation_lead_s=600)
    engine.submit(_req("res", count=2, start_at_s=1000), 0)
    assert engine.jobs["res"].state == "reserved"
    assert engine.schedule(100) == []  # too early to hold anything
    engine.submit(_req("early"), 100)
    (p,) = _place_all(engine, 100)
    assert p.job_id == "early"
    holds = engine.schedule(500)
    assert holds == [HoldChange("res", ("n0-1",))]
    engine.finish("early", 600)
    assert engine.schedule(601) == [HoldChange("res", ("n0-0",))]
    engine.submit(_req("late"), 700)
    assert _place_all(engine, 700) == []  # everything is held for the reservation
    decisions = engine.schedule(1000)
    placed = [d for d in decisions if isinstance(d, Placement)]
    assert placed[0].job_id == "res" and set(placed[0].resource_ids) == {"n0-0", "n0-1"}
    assert engine.audit() == []


def test_elastic_job_takes_what_is_free_and_grows_later() -> None:
    engine = make_engine([("n0", "r1", A100, 4)])
    engine.submit(_req("busy", count=2), 0)
    _place_all(engine)
    engine.submit(_req("el", count=1, max_count=4), 0)
    (p,) = _place_all(engine)
    assert len(p.resource_ids) == 2
    engine.finish("busy", 10)
    (g,) = [d for d in engine.schedule(10) if isinstance(d, Growth)]
    assert g.job_id == "el" and len(g.add) == 2
    assert engine.jobs["el"].state == "stopping"  # it restarts through a checkpoint
    engine.stopped("el", 20, "step-000000100")
    (p,) = _place_all(engine, 20)
    assert p.job_id == "el" and len(p.resource_ids) == 4
    assert engine.audit() == []


def test_pinned_request_waits_for_its_resource() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("other", resource_ids=("n0-1",)), 0)
    engine.submit(_req("pin", resource_ids=("n0-1",)), 0)
    (p,) = _place_all(engine)
    assert p.job_id == "other"
    with pytest.raises(SubmissionRefused, match="unknown resource"):
        engine.submit(_req("ghost", resource_ids=("nope",)), 0)


def test_cordoned_and_unhealthy_devices_are_not_placed_on() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.cordon("n0", 0)
    engine.set_health("n0", 1, False)
    engine.submit(_req("j"), 0)
    assert _place_all(engine) == []
    engine.cordon("n0", 0, cordoned=False)
    (p,) = _place_all(engine)
    assert p.resource_ids == ("n0-0",)
    engine.cordon("n0")  # the whole node; running work is left alone
    assert engine.jobs["j"].state == "running"
    assert engine.audit() == []


def test_spare_nodes_are_not_admissible_capacity() -> None:
    # The twin's default north pool: two active nodes of 4 A100s and a spare node of 4.
    engine = make_engine(
        [("a100-0", "cn-north", A100, 4), ("a100-1", "cn-north", A100, 4)],
        spares=[("a100-spare-0", "cn-north", A100, 4)],
    )
    with pytest.raises(SubmissionRefused) as err:
        engine.submit(_req("twelve", count=12), 0)
    msg = str(err.value)
    assert f"needs 12 devices of {A100}" in msg
    assert "the active cn-north pool has 8" in msg
    assert "spare node(s) a100-spare-0" in msg and "promote them first" in msg
    # Even with every spare it would not fit: the size, and what the spares would add.
    with pytest.raises(
        SubmissionRefused, match=r"at most 8 \(12 with its spare nodes a100-spare-0\)"
    ):
        engine.submit(_req("thirteen", count=13), 0)
    assert engine.jobs == {} and len(engine.queue) == 0
    engine.submit(_req("eight", count=8), 0)
    (p,) = _place_all(engine)
    assert p.job_id == "eight" and set(p.nodes) == {"a100-0", "a100-1"}
    assert engine.audit() == []


def test_spare_partitions_and_node_size_do_not_count() -> None:
    engine = make_engine([("a0", "r1", A100, 1)], spares=[("s0", "r1", A100, 2)])
    # One active A100 holds at most 7 x 1g.5gb; the spare's two would make 21.
    with pytest.raises(SubmissionRefused, match=r"needs 8 1g\.5gb instances .* has 7.* s0"):
        engine.submit(_req("m", count=8, profile="1g.5gb"), 0)
    # A gang sized for the spare node alone is not node-local on active nodes of 2: it
    # spans them instead of waiting for a node that is never placed on.
    engine = make_engine(
        [("a0", "r1", A100, 2), ("a1", "r1", A100, 2)], spares=[("s0", "r1", A100, 4)]
    )
    engine.submit(_req("three", count=3), 0)
    (p,) = _place_all(engine)
    assert len(p.resource_ids) == 3 and set(p.nodes) == {"a0", "a1"}


def test_a_gang_that_names_its_nodes_gets_the_same_count_on_each() -> None:
    for policy, expected in (("binpack", {"n1", "n2"}), ("spread", {"n0", "n3"})):
        # Free before the gang: n0 4, n1 2, n2 3, n3 4.
        engine = make_engine([(f"n{i}", "r1", A100, 4) for i in range(4)], policy=policy)
        engine.submit(_req("two-on-n1", count=2, resource_ids=("n1-0", "n1-1")), 0)
        engine.submit(_req("one-on-n2", resource_ids=("n2-0",)), 0)
        _place_all(engine)
        engine.submit(_req("gang", count=4, nodes=2), 0)
        (p,) = _place_all(engine)
        on = {n: [r for r in p.resource_ids if engine.fleet.units[r].node == n] for n in p.nodes}
        assert set(p.nodes) == expected, policy
        assert sorted(len(rids) for rids in on.values()) == [2, 2]
        assert engine.audit() == []
    # It fits on one node, but asks for two: one on each, never two on one.
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)])
    engine.submit(_req("pair", count=2, nodes=2), 0)
    (p,) = _place_all(engine)
    assert set(p.nodes) == {"n0", "n1"} and len(p.resource_ids) == 2
    # One node: on one node even where node-local gangs are off.
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)], node_local_gangs=False)
    engine.submit(_req("a", resource_ids=("n0-0",)), 0)
    engine.submit(_req("b", resource_ids=("n1-0",)), 0)
    _place_all(engine)
    engine.submit(_req("local", count=4, nodes=1), 0)
    assert _place_all(engine) == []  # 6 free, 3 per node: it waits
    engine.finish("a", 1)
    (p,) = _place_all(engine, 1)
    assert p.nodes == ("n0",) and len(p.resource_ids) == 4


def test_a_gang_waits_for_enough_nodes_with_room_and_is_refused_if_none_could_ever() -> None:
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4), ("n2", "r1", A100, 2)])
    engine.submit(_req("hog", count=3, resource_ids=("n1-0", "n1-1", "n1-2")), 0)
    _place_all(engine)
    engine.submit(_req("gang", count=6, nodes=2), 0)  # 3 per node; n1 has 1 free, n2 2
    assert _place_all(engine) == [] and engine.jobs["gang"].state == "queued"
    engine.finish("hog", 1)
    (p,) = _place_all(engine, 1)
    assert set(p.nodes) == {"n0", "n1"}
    with pytest.raises(SubmissionRefused, match=r"1 node\(s\) with 4 or more devices.*not 2"):
        make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 3), ("n2", "r1", A100, 3)]).submit(
            _req("wide", count=8, nodes=2), 0
        )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"count": 5, "nodes": 2}, "does not split evenly"),
        ({"count": 2, "max_count": 4, "nodes": 2}, "max_count"),
        ({"count": 2, "nodes": 2, "profile": "3g.20gb"}, "profile"),
        ({"count": 1, "nodes": 1, "resource_ids": ("n0-0",)}, "resource_ids"),
        ({"count": 2, "nodes": 2, "start_at_s": 10.0}, "start_at_s"),
    ],
)
def test_nodes_that_cannot_shape_the_gang_are_refused_naming_why(fields, message) -> None:
    with pytest.raises(ValueError, match=message):
        _req("bad", **fields)
