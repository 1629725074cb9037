"""The synthetic trace keeps its shape; the simulator accounts for every job."""

from __future__ import annotations

from gpuflow.tasks.scheduling.model import SchedulerConfig
from gpuflow.tasks.scheduling.simulate import Simulator
from gpuflow.tasks.scheduling.trace import fleet_gpus, study_fleet, summarize, synthetic_trace

from gpuflow.bench.scheduler_bench import mixed_gang_cost


def test_trace_shape_and_determinism() -> None:
    trace = synthetic_trace(24, 2000, load=0.8, seed=3)
    again = synthetic_trace(24, 2000, load=0.8, seed=3)
    assert trace == again and trace != synthetic_trace(24, 2000, load=0.8, seed=4)
    assert [j.arrival_s for j in trace] == sorted(j.arrival_s for j in trace)
    s = summarize(trace)
    assert 0.6 < s.size_share["1"] < 0.8  # mostly single-GPU jobs
    assert s.size_share[">8"] > 0  # and a tail of big gangs
    assert s.p99_work_s > 10 * s.median_work_s  # heavy-tailed run times
    assert len({j.job_id for j in trace}) == len(trace)
    assert study_fleet() and fleet_gpus(study_fleet()) == 10_000


def test_simulation_accounts_for_every_job_and_binpack_fragments_less() -> None:
    groups = study_fleet(0.03)
    trace = synthetic_trace(8, fleet_gpus(groups), load=1.1, seed=5)
    frag = {}
    for policy in ("binpack", "spread"):
        sim = Simulator(
            groups, trace, SchedulerConfig(policy=policy, queue_depth=10**6), horizon_s=8 * 3600
        )
        result = sim.run()
        engine = sim.engine
        assert engine.audit() == []
        states = [j.state for j in engine.jobs.values()]
        assert len(states) == len(trace)  # every arrival is in the engine, in some state
        assert result.completed == states.count("finished")
        assert 0 < result.utilization <= 1
        frag[policy] = result.fragmentation
    assert frag["binpack"] < frag["spread"]


def test_mixed_gang_runs_at_the_slowest_members_pace() -> None:
    cost = mixed_gang_cost()
    # 4 x A100 (19.5 TF fp32) + 4 x V100 (15.7): 8 x 15.7 of 140.8 possible.
    assert abs(cost["fp32_4a100+4v100_loss"] - (1 - 8 * 15.7 / (4 * 19.5 + 4 * 15.7))) < 1e-4
    assert cost["fp16_4a100+4v100_loss"] > cost["fp32_4a100+4v100_loss"]


def test_bench_sections_at_tiny_scale() -> None:
    from gpuflow.bench.scheduler_bench import VARIANTS, decision_latency, policy_study

    study = policy_study(0.02, 4.0, load=1.0, seed=1, report=lambda _: None)
    assert set(study) == {"trace"} | {v[0] for v in VARIANTS}
    for name, *_ in VARIANTS:
        row = study[name]
        assert row["jobs"] == study["trace"]["jobs"] and 0 <= row["utilization"] <= 1
    assert study["first-fit"]["preemptions"] == 0
    lat = decision_latency(0.02, 20, seed=1, report=lambda _: None)
    assert lat["place_decisions"] == lat["queued_jobs"] > 0 and lat["preempt_decisions"] > 0
    assert lat["place_p99_ms"] >= lat["place_p50_ms"] >= 0
