"""Priority preemption: who is evicted, what they free, and that they come back."""

from __future__ import annotations

from gpuflow.tasks.scheduling.model import JobRequest, Placement, Preemption
from gpuflow.tasks.scheduling.preemption import Candidate, choose_victims
from hypothesis import given
from hypothesis import strategies as st

from tests.tasks.scheduling.helpers import A100, V100, make_engine


def _req(job_id: str, **kw) -> JobRequest:
    return JobRequest(job_id=job_id, **kw)


def test_choose_victims_least_work_then_prunes() -> None:
    cands = [
        Candidate("old", ("a", "b"), cost=1000.0, priority=0),
        Candidate("fresh", ("c",), cost=10.0, priority=0),
        Candidate("mid", ("d",), cost=300.0, priority=0),
    ]
    picked = choose_victims(2, cands)
    assert [c.candidate.job_id for c in picked] == ["fresh", "mid"]
    assert choose_victims(5, cands) is None
    assert choose_victims(0, cands) == []
    # The greedy would take the big job that is cheapest per unit; one small job does it.
    cands = [
        Candidate("big", tuple("abcdefgh"), cost=80.0, priority=0),
        Candidate("small", ("z",), cost=20.0, priority=0),
    ]
    assert [c.candidate.job_id for c in choose_victims(1, cands)] == ["small"]
    # A shrinking elastic job gives only what is needed.
    (c,) = choose_victims(1, [Candidate("el", ("x", "y", "z"), 5.0, 0, shrink=True)])
    assert c.release == ("x",)


def test_choose_victims_lowest_priority_first_then_least_work() -> None:
    cands = [
        Candidate("p9", ("a",), cost=1.0, priority=9),
        Candidate("p0", ("b",), cost=500.0, priority=0),
    ]
    assert [c.candidate.job_id for c in choose_victims(1, cands)] == ["p0"]
    # Two units: the priority-0 job goes first even though two priority-5 jobs would lose
    # less work together; the second unit is the cheaper priority-5 job.
    cands = [
        Candidate("p0", ("a",), cost=100.0, priority=0),
        Candidate("p5-cheap", ("b",), cost=1.0, priority=5),
        Candidate("p5-dear", ("c",), cost=2.0, priority=5),
    ]
    assert [c.candidate.job_id for c in choose_victims(2, cands)] == ["p0", "p5-cheap"]
    # A lone victim at the plan's highest priority that loses less replaces the pair.
    cands.append(Candidate("p5-big", ("d", "e"), cost=50.0, priority=5))
    assert [c.candidate.job_id for c in choose_victims(2, cands)] == ["p5-big"]
    # ...but never one of a higher priority than the plan needs.
    cands = [
        Candidate("p0-a", ("a",), cost=100.0, priority=0),
        Candidate("p0-b", ("b",), cost=100.0, priority=0),
        Candidate("p5-big", ("c", "d"), cost=1.0, priority=5),
    ]
    assert sorted(c.candidate.job_id for c in choose_victims(2, cands)) == ["p0-a", "p0-b"]


@given(
    victims=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 3), st.floats(0, 1000)), max_size=8
    ),
    need=st.integers(1, 8),
)
def test_victims_never_reach_above_the_priority_the_need_requires(
    victims: list[tuple[int, int, float]], need: int
) -> None:
    cands = [
        Candidate(f"j{i}", tuple(f"u{i}.{k}" for k in range(n)), cost, prio)
        for i, (prio, n, cost) in enumerate(victims)
    ]
    picked = choose_victims(need, cands)
    if sum(n for _, n, _ in victims) < need:
        assert picked is None
        return
    assert picked and sum(len(c.release) for c in picked) >= need
    # The lowest priority up to which the victims free enough: no plan can stay below it,
    # and the chosen one never goes above it, whatever the work at risk.
    reach = min(p for p, _, _ in victims if sum(n for q, n, _ in victims if q <= p) >= need)
    assert max(c.candidate.priority for c in picked) == reach


def test_evicts_the_lower_priority_job_even_with_more_work_at_risk() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("p0", priority=0), 0)
    engine.submit(_req("p9", priority=9), 0)
    engine.schedule(0)
    engine.report_checkpoint("p0", 10)  # 90 device-seconds at risk at t=100
    engine.report_checkpoint("p9", 99)  # 1 device-second at risk
    engine.submit(_req("urgent", priority=10), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    assert [(e.job_id, e.priority, e.work_at_risk_s) for e in plan.evictions] == [("p0", 0, 90.0)]
    assert engine.jobs["p9"].state == "running" and engine.jobs["p0"].state == "stopping"
    engine.stopped("p0", 101)
    (p,) = [d for d in engine.schedule(101) if isinstance(d, Placement)]
    assert p.job_id == "urgent" and p.resource_ids == plan.evictions[0].release
    assert engine.jobs["p9"].state == "running"
    assert engine.audit() == []


def test_node_local_gang_evicts_the_lower_priority_node() -> None:
    engine = make_engine([("n0", "r1", A100, 2), ("n1", "r1", A100, 2)])
    engine.submit(_req("p0", count=2, priority=0), 0)
    engine.submit(_req("p9", count=2, priority=9), 0)
    engine.schedule(0)
    node_of = {j: next(iter(engine.jobs[j].allocation.values())).node for j in ("p0", "p9")}
    assert node_of["p0"] != node_of["p9"]
    engine.report_checkpoint("p0", 10)
    engine.report_checkpoint("p9", 99)
    engine.submit(_req("gang", count=2, priority=10), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    assert plan.node == node_of["p0"] and [e.job_id for e in plan.evictions] == ["p0"]
    assert engine.jobs["p9"].state == "running"


def test_preempts_the_victim_with_least_work_at_risk() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("old"), 0)
    engine.submit(_req("fresh"), 0)
    engine.schedule(0)
    engine.report_checkpoint("old", 10, "step-000000010")
    engine.report_checkpoint("fresh", 95, "step-000000095")
    engine.submit(_req("urgent", priority=5), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    (e,) = plan.evictions
    assert (e.job_id, e.action) == ("fresh", "preempt") and e.work_at_risk_s == 5.0
    assert engine.jobs["fresh"].state == "stopping" and engine.jobs["old"].state == "running"
    # Nothing is placed until the victim has stopped; then its device goes to the preemptor.
    assert not [d for d in engine.schedule(101) if isinstance(d, Placement)]
    engine.stopped("fresh", 102, "step-000000102")
    assert engine.jobs["urgent"].holds  # earmarked capacity is held for it
    (p,) = [d for d in engine.schedule(103) if isinstance(d, Placement)]
    assert p.job_id == "urgent" and p.resource_ids == (e.release[0],)
    victim = engine.jobs["fresh"]
    assert victim.state == "queued" and victim.last_checkpoint_id == "step-000000102"
    assert victim.preemptions == 1
    engine.finish("urgent", 200)
    (p,) = [d for d in engine.schedule(200) if isinstance(d, Placement)]
    assert p.job_id == "fresh"  # it resumes when room returns
    assert engine.audit() == []


def test_never_evicts_equal_priority_or_non_preemptible() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("peer", priority=5), 0)
    engine.submit(_req("pinned-down", preemptible=False), 0)
    engine.schedule(0)
    engine.submit(_req("urgent", priority=5), 1)
    assert engine.schedule(1) == []
    assert {j.state for j in engine.jobs.values()} == {"running", "queued"}


def test_victims_come_from_the_right_pool_only() -> None:
    engine = make_engine([("a0", "r1", A100, 1), ("v0", "r1", V100, 1)])
    engine.submit(_req("on-a100", skus=("a100-40gb",)), 0)
    engine.submit(_req("on-v100", skus=("v100",)), 0)
    engine.schedule(0)
    engine.submit(_req("wants-a100", skus=("a100-40gb",), priority=9), 1)
    (plan,) = [d for d in engine.schedule(1) if isinstance(d, Preemption)]
    assert [e.job_id for e in plan.evictions] == ["on-a100"] and plan.sku == A100


def test_node_local_gang_evicts_on_the_cheapest_node() -> None:
    engine = make_engine([("n0", "r1", A100, 4), ("n1", "r1", A100, 4)])
    for j in "abcd":
        engine.submit(_req(j, count=2), 0)
    engine.schedule(0)
    node_of = {j: next(iter(job.allocation.values())).node for j, job in engine.jobs.items()}
    assert sorted(node_of.values()) == ["n0", "n0", "n1", "n1"]
    # The jobs on n1 checkpointed recently: evicting there loses less.
    for j, node in node_of.items():
        engine.report_checkpoint(j, 90 if node == "n1" else 10)
    engine.submit(_req("gang", count=4, priority=3), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    assert plan.node == "n1"
    assert sorted(e.job_id for e in plan.evictions) == sorted(
        j for j, n in node_of.items() if n == "n1"
    )
    for e in plan.evictions:
        engine.stopped(e.job_id, 110)
    (p,) = [d for d in engine.schedule(110) if isinstance(d, Placement)]
    assert p.job_id == "gang" and p.nodes == ("n1",) and len(p.resource_ids) == 4
    assert engine.audit() == []


def test_elastic_job_shrinks_instead_of_being_evicted() -> None:
    engine = make_engine([("n0", "r1", A100, 4)], node_local_gangs=False)
    engine.submit(_req("el", count=2, max_count=4), 0)
    engine.schedule(0)
    assert len(engine.jobs["el"].allocation) == 4
    engine.submit(_req("urgent", count=2, priority=5), 10)
    (plan,) = [d for d in engine.schedule(10) if isinstance(d, Preemption)]
    (e,) = plan.evictions
    assert e.action == "shrink" and len(e.release) == 2
    engine.stopped("el", 20, "step-000000020")
    decisions = [d for d in engine.schedule(20) if isinstance(d, Placement)]
    assert {p.job_id: len(p.resource_ids) for p in decisions} == {"urgent": 2, "el": 2}
    assert engine.audit() == []


def test_failure_requeues_from_checkpoint_and_frees_for_the_preemptor() -> None:
    engine = make_engine([("n0", "r1", A100, 1)])
    engine.submit(_req("low"), 0)
    engine.schedule(0)
    engine.submit(_req("high", priority=1), 5)
    engine.schedule(5)
    # The victim crashes instead of acknowledging: it goes back to the queue all the same,
    # and what it held still reaches the job it was stopping for.
    engine.fail("low", 6, requeue=True)
    assert engine.jobs["low"].state == "queued"
    (p,) = [d for d in engine.schedule(7) if isinstance(d, Placement)]
    assert p.job_id == "high"
    assert engine.audit() == []


def test_pinned_job_evicts_whoever_runs_on_its_resource() -> None:
    engine = make_engine([("n0", "r1", A100, 2)])
    engine.submit(_req("a", resource_ids=("n0-0",)), 0)
    engine.submit(_req("b", resource_ids=("n0-1",)), 0)
    engine.schedule(0)
    engine.report_checkpoint("a", 99)  # a is cheaper to evict, but b sits on the pinned device
    engine.submit(_req("want-1", resource_ids=("n0-1",), priority=4), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    assert [(e.job_id, e.release) for e in plan.evictions] == [("b", ("n0-1",))]
    engine.stopped("b", 101)
    (p,) = [d for d in engine.schedule(101) if isinstance(d, Placement)]
    assert (p.job_id, p.resource_ids) == ("want-1", ("n0-1",))
    assert engine.audit() == []


def test_a_gang_that_names_its_nodes_evicts_on_its_cheapest_nodes_each_victim_once() -> None:
    engine = make_engine([(f"n{i}", "r1", A100, 2) for i in range(3)])
    # "wide" runs one unit on each of n0 and n1; "c" fills n2; one unit of n0 and of n1
    # stay free. The checkpoints make n2 the dearest node to evict on.
    engine.submit(_req("wide", count=2, resource_ids=("n0-0", "n1-0")), 0)
    engine.submit(_req("c", count=2, resource_ids=("n2-0", "n2-1")), 0)
    engine.schedule(0)
    engine.report_checkpoint("wide", 90)
    engine.report_checkpoint("c", 10)
    engine.submit(_req("gang", count=4, nodes=2, priority=5), 100)
    (plan,) = [d for d in engine.schedule(100) if isinstance(d, Preemption)]
    (e,) = plan.evictions  # needed on n0 and on n1: one eviction, both units released
    assert e.job_id == "wide" and e.action == "preempt" and sorted(e.release) == ["n0-0", "n1-0"]
    engine.stopped("wide", 110)
    (p,) = [d for d in engine.schedule(110) if isinstance(d, Placement)]
    assert p.job_id == "gang" and set(p.nodes) == {"n0", "n1"} and len(p.resource_ids) == 4
    assert engine.audit() == []
