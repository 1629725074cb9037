"""`gpuflow bench scheduler`: the policy study, decision latency, and the cost of mixed gangs.

(a) Policies: one synthetic trace (tasks/scheduling/trace.py) replayed through the real
    engine on a 10,000-GPU fleet of five SKUs in two regions: FIFO first-fit (the
    baseline), binpack and spread, each without and (binpack, spread) with priority
    preemption. Utilization, queueing delay p50/p99, job completion time, fragmentation.
(b) Decision latency at 10,000 GPUs with 1,000 queued jobs: every placement decision of
    a pass over the full queue, and preemption decisions for high-priority arrivals on a
    full fleet. Goals: p99 <= 1 ms per placement (issue 11 tightened it from 5 ms),
    <= 10 ms per preemption; reported as the ratio p99 / goal measured in this run (<= 1
    meets it).
(c) The full service pass (gpuflow/bench/service_pass.py): SchedulerService.schedule_once
    over the inventory - read, reap, decide, write leases and job rows, renew - on the same
    10,000 GPUs with 1,000 jobs queued, p50/p99 over repeated passes with jobs finishing
    and arriving between them, on SQLite and (GPUFLOW_BENCH_POSTGRES_URL) PostgreSQL.
    Goal (issue 11): p99 <= 100 ms per pass on SQLite.
(d) Mixed gangs: a synchronous gang advances at its slowest member's pace, so A100+V100
    delivers (members) x (the V100's rate); the loss against the members' summed
    throughput, from the twin's per-SKU tables (hardware/skus.py), fp32 and fp16 (V100 has
    no bf16). The seed document claims 37 %.

The run is also recorded in MLflow (experiment gpuflow-schedule) with a figure.
"""

from __future__ import annotations

import gc
import os
import random
import time
from collections.abc import Callable
from typing import Any

from gpuflow.bench.service_pass import PASS_GOAL_MS, is_feasible, service_pass
from gpuflow.hardware.skus import SKUS
from gpuflow.tasks.scheduling.model import JobRequest, SchedulerConfig, SubmissionRefused
from gpuflow.tasks.scheduling.simulate import build_engine, percentile, simulate, to_request
from gpuflow.tasks.scheduling.trace import (
    A100_40,
    V100,
    fleet_gpus,
    study_fleet,
    summarize,
    synthetic_trace,
)

Report = Callable[[str], None]
EXPERIMENT = "gpuflow-schedule"
PLACE_GOAL_MS = 1.0  # issue 11 (was 5 ms)
PREEMPT_GOAL_MS = 10.0
SEED_MIXED_LOSS = 0.37
# (name, policy, FIFO order, preemption). first-fit is FIFO by definition; binpack-fifo
# separates what placement does from what priority ordering does.
VARIANTS = (
    ("first-fit", "first-fit", True, False),
    ("binpack-fifo", "binpack", True, False),
    ("binpack", "binpack", False, False),
    ("spread", "spread", False, False),
    ("binpack+preemption", "binpack", False, True),
    ("spread+preemption", "spread", False, True),
)


def mixed_gang_cost() -> dict[str, Any]:
    """Throughput lost by A100-40GB + V100 gangs against what their members could do."""
    a, v = SKUS[A100_40], SKUS[V100]
    out: dict[str, Any] = {}
    for precision, ta, tv in (
        ("fp32", a.fp32_tflops, v.fp32_tflops),
        ("fp16", a.reduced_tflops, v.reduced_tflops),
    ):
        for na, nv in ((4, 4), (6, 2), (7, 1), (2, 6)):
            gang = (na + nv) * min(ta, tv)  # every step waits for the slowest member
            members = na * ta + nv * tv
            out[f"{precision}_{na}a100+{nv}v100_loss"] = round(1 - gang / members, 4)
            out[f"{precision}_{na}a100+{nv}v100_vs_all_a100"] = round(gang / ((na + nv) * ta), 4)
    out["seed_claim_loss"] = SEED_MIXED_LOSS
    out["a100_fp32_tflops"], out["v100_fp32_tflops"] = a.fp32_tflops, v.fp32_tflops
    out["a100_fp16_tflops"], out["v100_fp16_tflops"] = a.reduced_tflops, v.reduced_tflops
    return out


def decision_latency(
    scale: float, queued: int, seed: int, report: Report, policy: str = "binpack"
) -> dict[str, Any]:
    """Load the fleet to ~full with running jobs (placed by ``policy``: spread leaves every
    node partly used, the hard case for node-local preemption), queue ``queued`` more, then
    time every placement decision of a pass over the queue and preemption decisions for
    high-priority arrivals."""
    groups = study_fleet(scale)
    gpus = fleet_gpus(groups)
    engine = build_engine(
        groups, SchedulerConfig(policy=policy, preemption=True, queue_depth=100_000)
    )
    rng = random.Random(seed)
    trace = synthetic_trace(96, gpus, load=1.0, seed=seed)
    now = 0.0
    # Fill: place jobs until the fleet is nearly full (some pools run out first).
    for j in trace:
        if sum(p.whole_free for p in engine.fleet.pools.values()) < 0.03 * gpus:
            break
        try:
            job = engine.submit(to_request(j), now, enforce_depth=False, checkpoint_every_s=1800.0)
        except SubmissionRefused:
            continue  # bigger than any pool of a scaled-down fleet
        placement = engine.place(job.job_id, now)
        if placement is None:
            engine.cancel(job.job_id, now)
        elif placement.repartition:
            engine.cancel(job.job_id, now)
        else:
            engine.jobs[job.job_id].checkpoint_at_s = now - rng.uniform(0, 1800)
    # A long-running scheduler loads its fleet once: freezing those objects out of the cyclic
    # GC keeps a gen-2 collection (tens of ms over a 10,000-device index) out of decisions.
    gc.collect()
    gc.freeze()
    running = sum(1 for j in engine.jobs.values() if j.state == "running")
    busy = 1 - sum(p.whole_free for p in engine.fleet.pools.values()) / gpus
    report(f"latency: {running} jobs running, {busy:.1%} of devices busy; queueing {queued}")
    rest = [j for j in trace if j.job_id not in engine.jobs]
    rest = [j for j in rest if is_feasible(engine, j)]
    for j in rest[:queued]:
        engine.submit(to_request(j), now + 1, enforce_depth=False)
    # Wall time, and the decision's own CPU time (thread_time): on a shared machine the
    # difference is time the OS gave to other processes mid-decision.
    place_ms: list[float] = []
    place_cpu_ms: list[float] = []
    for job_id in list(engine.queue):
        c0, t0 = time.thread_time(), time.perf_counter()
        engine.place(job_id, now + 2)
        place_ms.append((time.perf_counter() - t0) * 1000)
        place_cpu_ms.append((time.thread_time() - c0) * 1000)
    # Preemption: high-priority gangs of the trace's shapes arriving on the full fleet.
    preempt_ms: list[float] = []
    preempt_cpu_ms: list[float] = []
    made = 0
    shapes = [j for j in rest[queued:] if j.profile is None][: max(50, queued)]
    for k, j in enumerate(shapes):
        req = to_request(j).model_copy(update={"job_id": f"hp{k}", "priority": 100})
        engine.submit(JobRequest.model_validate(req.model_dump()), now + 3, enforce_depth=False)
        c0, t0 = time.thread_time(), time.perf_counter()
        plan = engine.preempt(f"hp{k}", now + 3)
        preempt_ms.append((time.perf_counter() - t0) * 1000)
        preempt_cpu_ms.append((time.thread_time() - c0) * 1000)
        made += plan is not None
    gc.unfreeze()
    return {
        "fleet_gpus": gpus,
        "gc_frozen": True,
        "running_jobs": running,
        "busy_share": round(busy, 4),
        "queued_jobs": len(place_ms),
        "place_decisions": len(place_ms),
        "place_p50_ms": round(percentile(place_ms, 50), 4),
        "place_p99_ms": round(percentile(place_ms, 99), 4),
        "place_max_ms": round(max(place_ms), 4) if place_ms else float("nan"),
        "place_cpu_p99_ms": round(percentile(place_cpu_ms, 99), 4),
        "place_p99_over_goal": round(percentile(place_ms, 99) / PLACE_GOAL_MS, 4),
        "preempt_decisions": len(preempt_ms),
        "preemptions_found": made,
        "preempt_p50_ms": round(percentile(preempt_ms, 50), 4),
        "preempt_p99_ms": round(percentile(preempt_ms, 99), 4),
        "preempt_max_ms": round(max(preempt_ms), 4) if preempt_ms else float("nan"),
        "preempt_cpu_p99_ms": round(percentile(preempt_cpu_ms, 99), 4),
        "preempt_p99_over_goal": round(percentile(preempt_ms, 99) / PREEMPT_GOAL_MS, 4),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def policy_study(
    scale: float, hours: float, load: float, seed: int, report: Report
) -> dict[str, dict[str, Any]]:
    groups = study_fleet(scale)
    gpus = fleet_gpus(groups)
    trace = synthetic_trace(hours, gpus, load=load, seed=seed)
    s = summarize(trace)
    out: dict[str, dict[str, Any]] = {
        "trace": {
            "fleet_gpus": gpus,
            "hours": hours,
            "offered_load": load,
            "jobs": s.jobs,
            "share_1_gpu": round(s.size_share["1"], 4),
            "share_2_4": round(s.size_share["2-4"], 4),
            "share_5_8": round(s.size_share["5-8"], 4),
            "share_gt_8": round(s.size_share[">8"], 4),
            "median_run_s": round(s.median_work_s, 1),
            "p99_run_s": round(s.p99_work_s, 1),
            "reference_gpu_hours": round(s.gpu_hours, 1),
        }
    }
    warmup = min(6.0, hours / 4) * 3600
    for name, policy, fifo, preemption in VARIANTS:
        report(f"simulating {name} on {gpus} GPUs, {len(trace)} jobs")
        config = SchedulerConfig(
            policy=policy, fifo=fifo, preemption=preemption, queue_depth=1_000_000
        )
        r = simulate(
            groups,
            trace,
            config,
            warmup_s=warmup,
            horizon_s=hours * 3600,
            progress=lambda t, name=name: report(f"{name}: {t / 3600:.0f} h simulated"),
        )
        d = r.to_dict()
        out[name] = {
            k: (round(v, 4) if isinstance(v, float) else v)
            for k, v in d.items()
            if k not in ("policy", "preemption")
        }
    return out


def _record(result: dict[str, Any]) -> str | None:
    """The study as an MLflow run with a figure; None when MLflow is unavailable."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import mlflow

        from gpuflow.tasks.tracking import tracking_uri, use_experiment

        experiment_id = use_experiment(EXPERIMENT)
        client = mlflow.MlflowClient(tracking_uri())
        run = client.create_run(experiment_id, run_name="bench-scheduler")
        for section, values in result.items():
            if not isinstance(values, dict):
                continue
            for key, value in values.items():
                if (
                    isinstance(value, int | float)
                    and not isinstance(value, bool)
                    and value == value
                ):
                    client.log_metric(
                        run.info.run_id, f"{section}.{key}".replace("+", "_"), float(value)
                    )
        names = [v[0] for v in VARIANTS if v[0] in result]
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        for ax, key, label in zip(
            axes,
            ("utilization", "queue_delay_p99_s", "fragmentation"),
            ("utilization", "queueing delay p99 (s)", "fragmentation"),
            strict=True,
        ):
            ax.bar(range(len(names)), [result[n][key] for n in names], color="#4c72b0")
            ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
            ax.set_title(label)
        fig.tight_layout()
        client.log_figure(run.info.run_id, fig, "policies.png")
        plt.close(fig)
        client.set_terminated(run.info.run_id, "FINISHED")
        return run.info.run_id
    except Exception:  # the numbers are the result; a missing store must not lose them
        return None


def run(quick: bool = False, report: Report = print) -> dict[str, Any]:
    started = time.perf_counter()
    if quick:
        scale, hours, queued = 0.05, 12.0, 200
    else:
        scale, hours, queued = 1.0, 48.0, 1000
    result: dict[str, Any] = {}
    # Latency first, in a fresh heap; then the policy study.
    report("timing decisions")
    latency = decision_latency(scale, queued, seed=7, report=report)
    fragmented = decision_latency(scale, queued, seed=7, report=report, policy="spread")
    report("timing service passes")
    result.update(service_pass(quick, report))
    result.update(policy_study(scale, hours, load=1.0, seed=20261130, report=report))
    result["latency"] = latency
    result["latency_fragmented"] = fragmented
    result["mixed_gang"] = mixed_gang_cost()
    sections = ("latency", "latency_fragmented")
    place_p99 = max(result[k]["place_p99_ms"] for k in sections)
    preempt_p99 = max(result[k]["preempt_p99_ms"] for k in sections)
    result["goals"] = {
        # Judged on wall time (what a caller waits); CPU time shows what the decision itself
        # costs when the machine is shared (load_avg_1m in the latency sections).
        "place_p99_ms": place_p99,
        "place_cpu_p99_ms": max(result[k]["place_cpu_p99_ms"] for k in sections),
        "place_goal_ms": PLACE_GOAL_MS,
        "place_goal_met": place_p99 <= PLACE_GOAL_MS,
        "preempt_p99_ms": preempt_p99,
        "preempt_cpu_p99_ms": max(result[k]["preempt_cpu_p99_ms"] for k in sections),
        "preempt_goal_ms": PREEMPT_GOAL_MS,
        "preempt_goal_met": preempt_p99 <= PREEMPT_GOAL_MS,
        "pass_p99_ms_sqlite": result["service_pass_sqlite"]["pass_p99_ms"],
        "pass_p99_ms_postgres": result["service_pass_postgres"].get("pass_p99_ms", "not measured"),
        "pass_goal_ms": PASS_GOAL_MS,
        "pass_goal_met_sqlite": result["service_pass_sqlite"]["pass_p99_ms"] <= PASS_GOAL_MS,
        "mixed_4+4_fp16_loss": result["mixed_gang"]["fp16_4a100+4v100_loss"],
        "mixed_4+4_fp32_loss": result["mixed_gang"]["fp32_4a100+4v100_loss"],
        "seed_claim_loss": SEED_MIXED_LOSS,
        "quick": quick,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    run_id = _record(result)
    if run_id:
        result["goals"]["mlflow_run_id"] = run_id
    return result
