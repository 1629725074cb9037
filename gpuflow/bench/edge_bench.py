"""`gpuflow bench edge`: the whole model vs a k-shard chain, served over OIP on this machine.

Every configuration is measured side by side in one run, under the same load:

- whole: the unsplit model in one shard server pinned to one core (one edge box);
- k-shard chains (k = 2 and 4), shard i pinned to core i mod cores (one box per shard when
  there are enough cores; on a smaller machine the emulated boxes share cores, which caps
  the pipelined gain at the core count), each run both ways: forwarding (each server calls
  the next) and driver (the client calls every shard in turn).

For each: single-request latency p50/p99 (one request at a time), pipelined throughput
(2k requests in flight, closed loop), per-hop overhead ((chain p50 - whole p50) / (k-1))
and the plan's balance (slowest shard / ideal) for the DP split and the equal-operator
split; each shard's predicted compute against its server's own count, with the chain
serving alone (as a deployment does) and interleaved with the other configurations, and
beside it how well the machine repeats its own timing (``plan_repeat_error``: the forward
and driver chains are planned separately on the same profile, so their stage sums are the
same model timed twice; where they differ by more than the goal's 10 %, the stage check
measures the machine, not the plan). Every
server runs onnxruntime with one intra-op thread. Slicing can raise pipelined throughput
(at most k-fold, bounded by the slowest shard) but adds hops to a single request; the seed
document's claim for ResNet-152 over 4 nodes (78 ms -> 29 ms) is set against what is
measured here (``seed_claim``).
"""

from __future__ import annotations

import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuflow.bench.host_load import CpuTimes, cpu_report, load_report
from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.deploy import Deployment, launch, name_dir, new_version, stop_deployment
from gpuflow.tasks.edge.export import ExportedModel, cached_export
from gpuflow.tasks.edge.package import package_plan
from gpuflow.tasks.edge.planning import PlanResult, plan_shards
from gpuflow.tasks.edge.profile import NodeProfile, profile_nodes
from gpuflow.tasks.edge.verify import check_chain

Report = Callable[[str], None]
SEED_CLAIM = {"model": "resnet152", "nodes": 4, "before_ms": 78.0, "after_ms": 29.0}


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def _nodes(k: int, cores: list[int]) -> list[EdgeNode]:
    return [
        EdgeNode(name=f"bench-{i}", cpus=[cores[i % len(cores)]], intra_op_threads=1)
        for i in range(k)
    ]


@dataclass
class _Config:
    """One served configuration: whole model (k=1) or a k-shard chain in one mode."""

    label: str
    k: int
    mode: str
    plan: PlanResult
    deployment: Deployment
    infer: Callable[[dict], dict]
    close: Callable[[], None]
    latencies_s: list[float] = field(default_factory=list)
    throughputs_rps: list[float] = field(default_factory=list)
    pipelined_p50_s: list[float] = field(default_factory=list)
    max_abs_diff: float = 0.0
    # Each shard's mean compute as its server measured it: with the chain serving alone
    # (as deployed), and during the latency phase, interleaved with the other configurations.
    served_ms: list[float] = field(default_factory=list)
    served_interleaved_ms: list[float] = field(default_factory=list)


def _compute_counters(config: _Config) -> list[tuple[float, float]]:
    from gpuflow.tasks.edge.serving.metrics import scrape_compute

    return [scrape_compute(s.http_address) for s in config.deployment.shards]


def _served_ms(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> list[float]:
    """Each shard's mean compute per request between two scrapes of its /metrics."""
    return [
        (c1 - c0) / 1e3 / max(e1 - e0, 1.0)
        for (c0, e0), (c1, e1) in zip(before, after, strict=True)
    ]


def _stage_check(config: _Config) -> dict[str, Any]:
    """The plan's predicted compute per stage against what the servers measured: with the
    chain serving alone (the goal's figure: what a deployment's own measure step sees) and
    interleaved with the bench's other configurations (their weights pass through the
    shared caches between two requests of this one)."""
    predicted = [s.compute_ms for s in config.plan.dp.shards]
    out: dict[str, Any] = {"stage_ms_predicted": predicted}
    for suffix, served in (("", config.served_ms), ("_interleaved", config.served_interleaved_ms)):
        errors = [b / a - 1 for a, b in zip(predicted, served, strict=True) if a > 0]
        out[f"stage_ms_served{suffix}"] = served
        out[f"stage_error_max{suffix}"] = max(errors, key=abs) if errors else 0.0
        out[f"slowest_stage_error{suffix}"] = max(served) / max(predicted) - 1
    out["planning_rounds"] = config.plan.rounds
    return out


def plan_repeat_error(first_ms: list[float], second_ms: list[float]) -> float:
    """How far two plans' timings of one model disagree: the second's stage sum over the
    first's, minus 1 (each sum is the whole model as the planner timed it as served)."""
    first, second = sum(first_ms), sum(second_ms)
    if not (first > 0 and second > 0):
        raise ValueError(f"stage sums must be > 0 ms, got {first} and {second}")
    return second / first - 1


def _start(
    exported: ExportedModel, profile: NodeProfile, k: int, mode: str, cores: list[int], tag: str
) -> _Config:
    """Plan, package and launch one configuration, and check it against the whole model."""
    from gpuflow.tasks.edge.serving.chain import ChainDriver
    from gpuflow.tasks.edge.serving.client import OipClient

    nodes = _nodes(k, cores)
    result = plan_shards(exported, profile, nodes, k)
    name = f"bench-{tag}"
    version = new_version(name)
    packaged = package_plan(
        exported.onnx_path,
        result.cuts,
        result.dp,
        name_dir(name) / version / "shards",
        source_model=exported.model_name,
        opset=exported.opset,
        version=version,
        segment_ms=result.segment_ms,
    )
    deployment = Deployment(name, version, exported.model_name, mode, "new")  # type: ignore[arg-type]
    launch(deployment, [p.directory for p in packaged], nodes, ready_timeout_s=120.0)
    try:
        if mode == "forward":
            client = OipClient(deployment.addresses[0], timeout_s=120.0)
            head = deployment.model_names[0]

            def infer(x: dict) -> dict:
                return client.infer(head, x)

            close = client.close
        else:
            driver = ChainDriver(deployment.addresses, deployment.model_names, timeout_s=120.0)
            infer, close = driver.infer, driver.close
        check = check_chain(deployment, exported, samples=2)
        if not check.passed:
            raise RuntimeError(f"{tag}: chain output differs from the model: {check}")
    except BaseException:
        stop_deployment(deployment)
        raise
    label = "whole" if k == 1 else f"{k} shards {mode}"
    config = _Config(label, k, mode, result, deployment, infer, close)
    config.max_abs_diff = check.max_abs_diff
    return config


def _bench_model(
    model: str, ks: list[int], requests: int, cores: list[int], work: Path, report: Report
) -> dict[str, dict[str, Any]]:
    """All configurations of one model served at once and measured interleaved.

    Latency: request r goes to every configuration in turn before request r+1, so load
    from anything else on the machine falls on all of them alike. Throughput: three
    rounds, each running every configuration's pipelined batch in turn; the median round.
    """
    from gpuflow.tasks.edge.serving.chain import run_pipelined

    report(f"{model}: export")
    started = time.perf_counter()
    exported = cached_export(model, work / model)
    export_s = time.perf_counter() - started
    report(f"{model}: profile")
    profile = profile_nodes(
        exported.onnx_path, exported.sample_inputs(), runs=7, warmup=2, intra_op_threads=1
    )
    configs: list[_Config] = []
    try:
        report(f"{model}: start the whole model and the chains")
        configs.append(_start(exported, profile, 1, "forward", cores, f"{model}-k1"))
        for k in ks:
            for mode in ("forward", "driver"):
                configs.append(_start(exported, profile, k, mode, cores, f"{model}-k{k}-{mode}"))
        sample = exported.sample_inputs(batch=1, seed=7)
        for config in configs:  # warm-up
            for _ in range(2):
                config.infer(sample)
        report(f"{model}: latency, {requests} interleaved requests")
        before = [_compute_counters(c) for c in configs]
        for _ in range(requests):
            for config in configs:
                t0 = time.perf_counter()
                config.infer(sample)
                config.latencies_s.append(time.perf_counter() - t0)
        for config, start in zip(configs, before, strict=True):
            config.served_interleaved_ms = _served_ms(start, _compute_counters(config))
        report(f"{model}: stage times, each configuration alone, {requests} requests")
        for config in configs:
            start = _compute_counters(config)
            for _ in range(requests):
                config.infer(sample)
            config.served_ms = _served_ms(start, _compute_counters(config))
        for round_ in range(3):
            report(f"{model}: pipelined throughput, round {round_ + 1}/3")
            for config in configs:
                in_flight = max(2, 2 * config.k)
                run = run_pipelined(
                    config.infer, [sample] * max(requests, 2 * in_flight), in_flight
                )
                config.throughputs_rps.append(run.throughput_rps)
                config.pipelined_p50_s.append(run.latency_percentile_s(50))
    finally:
        for config in configs:
            config.close()
            stop_deployment(config.deployment)

    def p(config: _Config, q: float) -> float:
        return float(np.percentile(np.asarray(config.latencies_s) * 1000.0, q))

    whole = configs[0]
    whole_rps = statistics.median(whole.throughputs_rps)
    sections: dict[str, dict[str, Any]] = {
        f"{model} whole": {
            "export_s": export_s,
            "profiled_ms": sum(whole.plan.segment_ms),
            "cut_points": len(whole.plan.cuts.cuts),
            "latency_p50_ms": p(whole, 50),
            "latency_p99_ms": p(whole, 99),
            "throughput_rps": whole_rps,
            "in_flight": 2,
        }
    }
    for k in ks:
        row: dict[str, Any] = {}
        for config in (c for c in configs if c.k == k):
            plan = config.plan
            if not row:
                row.update(
                    {
                        "cut_tensors": ",".join(plan.cut_tensors()),
                        "balance_dp": plan.dp.balance,
                        "balance_equal_ops": plan.equal_ops.balance,
                        "bottleneck_ms": plan.dp.bottleneck_ms,
                        "bottleneck_equal_ops_ms": plan.equal_ops.bottleneck_ms,
                        "ideal_speedup": sum(plan.segment_ms) / plan.dp.bottleneck_ms,
                    }
                )
            short = "fwd" if config.mode == "forward" else "drv"
            rps = statistics.median(config.throughputs_rps)
            row[f"{short}_latency_p50_ms"] = p(config, 50)
            row[f"{short}_latency_p99_ms"] = p(config, 99)
            row[f"{short}_throughput_rps"] = rps
            row[f"{short}_latency_vs_whole"] = p(config, 50) / p(whole, 50)
            row[f"{short}_throughput_vs_whole"] = rps / whole_rps
            row[f"{short}_per_hop_overhead_ms"] = (p(config, 50) - p(whole, 50)) / (k - 1)
            row[f"{short}_max_abs_diff"] = config.max_abs_diff
            for key, value in _stage_check(config).items():
                row[f"{short}_{key}"] = value
        if "fwd_stage_ms_predicted" in row and "drv_stage_ms_predicted" in row:
            row["plan_repeat_error"] = plan_repeat_error(
                row["fwd_stage_ms_predicted"], row["drv_stage_ms_predicted"]
            )
        row["in_flight"] = 2 * k
        row["emulated_nodes_share_cores"] = k > len(cores)
        sections[f"{model} {k} shards"] = row
    return sections


def _seed_claim(sections: dict[str, dict[str, Any]], model: str, k: int) -> dict[str, Any]:
    whole = sections.get(f"{model} whole")
    chain = sections.get(f"{model} {k} shards")
    if not whole or not chain:
        return {"measured": f"not measured ({model}, {k} shards not in this run)"}
    best_rps = max(chain["fwd_throughput_rps"], chain["drv_throughput_rps"])
    claimed = SEED_CLAIM["before_ms"] / SEED_CLAIM["after_ms"]
    return {
        "claim": f"ResNet-152 over 4 edge nodes: 78 ms -> 29 ms ({claimed:.2f}x)",
        "measured_on": f"{model}, {k} shards, {chain['in_flight']} in flight",
        "whole_latency_ms": whole["latency_p50_ms"],
        "chain_latency_ms": chain["fwd_latency_p50_ms"],
        "single_request_speedup": whole["latency_p50_ms"] / chain["fwd_latency_p50_ms"],
        "whole_interval_ms": 1000.0 / whole["throughput_rps"],
        "chain_interval_ms": 1000.0 / best_rps,
        "pipelined_speedup": best_rps / whole["throughput_rps"],
        "claimed_speedup": claimed,
        "dp_bound_speedup": chain["ideal_speedup"],
    }


def run(quick: bool = False, report: Report = print) -> dict:
    """Whole model vs k-shard chains; ``quick`` uses a small ResNet and few requests."""
    cores = _cores()
    if quick:
        plan = [("resnet18-digits", [2], 8)]
    else:
        plan = [("resnet50", [2, 4], 20), ("resnet152", [4], 12)]
    from gpuflow.bench import edge_hop_bench

    result: dict[str, Any] = {
        "setup": {
            "cpu": platform.processor() or platform.machine(),
            "cores": len(cores),
            "onnxruntime_threads_per_server": 1,
            "quick": quick,
            "models": ",".join(m for m, _, _ in plan),
            "load_avg_1m_before": os.getloadavg()[0],
            **cpu_report(),
        }
    }
    times_before = CpuTimes.now()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"gpuflow-edge-bench-{os.getpid()}"
    bench_names: list[str] = []
    # Per-hop overhead at 1.6 MB: two shards (one core each where there are two), then four.
    for k in (2,) if quick else (2, 4):
        result[f"hop {k} shards"] = edge_hop_bench.run(
            k=k, requests=30 if quick else 200, rounds=3 if quick else 8, report=report
        )
    try:
        for model, ks, requests in plan:
            sections = _bench_model(model, ks, requests, cores, work, report)
            result.update(sections)
            bench_names += [f"bench-{model}-k1"] + [
                f"bench-{model}-k{k}-{m}" for k in ks for m in ("forward", "driver")
            ]
        model, k = ("resnet152", 4) if not quick else ("resnet18-digits", 2)
        result["seed_claim"] = _seed_claim(result, model, k)
        # Steal over the whole run, on the cores the servers were pinned to (4 at most).
        result["setup"].update(load_report(times_before, CpuTimes.now(), cores[:4]))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for name in bench_names:  # the servers are stopped; their folders were scratch
            shutil.rmtree(name_dir(name), ignore_errors=True)
    return result
