"""Prove a deployed chain computes what the whole model computes, and time it.

The reference is the whole exported model run in-process by onnxruntime on the same sample
inputs; the chain passes when the largest absolute difference over every sample is within
``atol`` (1e-4 by default: float32 kernels of the same graph, cut in pieces, may round
differently at most by that much).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np
import onnxruntime as ort
from gpuflow.tasks.edge.deploy import Deployment
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.profile import session_options

DEFAULT_ATOL = 1e-4


@dataclass(frozen=True)
class CheckResult:
    """Outcome of the chain-vs-whole-model check."""

    passed: bool
    max_abs_diff: float
    atol: float
    samples: int
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def reference_outputs(
    exported: ExportedModel, samples: list[dict[str, np.ndarray]]
) -> list[np.ndarray]:
    """The whole model's outputs, computed in-process by onnxruntime.

    Graph optimisation is on, as in the shard servers: the optimised and unoptimised
    kernels of ResNet-152 differ by ~7e-4 on their own, more than the check allows, while
    optimised shards match the optimised whole model to ~1e-5.
    """
    session = ort.InferenceSession(
        str(exported.onnx_path),
        session_options(1, optimize=True),
        providers=["CPUExecutionProvider"],
    )
    return [session.run([exported.output_name], s)[0] for s in samples]


def chain_infer(deployment: Deployment, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """One request through the deployed chain (forwarding head, or a driver over the shards)."""
    from gpuflow.tasks.edge.serving.chain import run_chain_driver, run_chain_forwarding

    if deployment.mode == "forward":
        out = run_chain_forwarding(deployment.addresses[0], deployment.model_names[0], inputs)
    else:
        out = run_chain_driver(deployment.addresses, deployment.model_names, inputs)
    if len(out) != 1:
        raise RuntimeError(f"chain returned {len(out)} outputs, expected 1: {list(out)}")
    return next(iter(out.values()))


def check_chain(
    deployment: Deployment,
    exported: ExportedModel,
    *,
    samples: int = 4,
    batch: int = 1,
    atol: float = DEFAULT_ATOL,
) -> CheckResult:
    """Compare the chain with the whole model on ``samples`` deterministic inputs.

    A chain that fails to answer is a failed check (with the error), not an exception, so
    the caller can roll back.
    """
    inputs = [exported.sample_inputs(batch=batch, seed=1000 + i) for i in range(samples)]
    expected = reference_outputs(exported, inputs)
    worst = 0.0
    try:
        for sample, want in zip(inputs, expected, strict=True):
            got = chain_infer(deployment, sample)
            if got.shape != want.shape:
                return CheckResult(
                    False,
                    float("inf"),
                    atol,
                    samples,
                    f"chain output shape {got.shape} != whole model's {want.shape}",
                )
            worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want))))
    except Exception as exc:  # any failure of the chain fails the check
        return CheckResult(False, float("inf"), atol, samples, f"{type(exc).__name__}: {exc}")
    return CheckResult(worst <= atol, worst, atol, samples)


def _percentile_ms(values_s: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values_s) * 1000.0, q))


def measure_chain(
    deployment: Deployment,
    exported: ExportedModel,
    *,
    requests: int = 30,
    in_flight: int | None = None,
    warmup: int = 3,
) -> dict[str, float]:
    """Single-request latency (p50/p99, one at a time) and pipelined throughput.

    ``in_flight`` requests are kept in flight for the throughput run (default: 2 per shard).
    """
    from gpuflow.tasks.edge.serving.chain import ChainDriver, run_pipelined
    from gpuflow.tasks.edge.serving.client import OipClient
    from gpuflow.tasks.edge.serving.metrics import scrape_compute

    in_flight = in_flight or 2 * len(deployment.shards)
    sample = exported.sample_inputs(batch=1, seed=7)
    if deployment.mode == "forward":
        client = OipClient(deployment.addresses[0])
        head = deployment.model_names[0]

        def infer(x):
            return client.infer(head, x)

        closer = client
    else:
        closer = ChainDriver(deployment.addresses, deployment.model_names)
        infer = closer.infer
    https = [s.http_address for s in deployment.shards]
    try:
        for _ in range(warmup):
            infer(sample)
        before = [scrape_compute(h) for h in https if h]
        latencies = []
        for _ in range(requests):
            started = time.perf_counter()
            infer(sample)
            latencies.append(time.perf_counter() - started)
        after = [scrape_compute(h) for h in https if h]
        run = run_pipelined(infer, [sample] * requests, in_flight)
    finally:
        closer.close()
    # Each shard's own compute per request while requests came one at a time: the stage
    # times as served, to set beside the plan's prediction.
    served = {
        f"served_compute_ms_shard{i}": (c1 - c0) / 1e3 / max(e1 - e0, 1.0)
        for i, ((c0, e0), (c1, e1)) in enumerate(zip(before, after, strict=True))
    }
    return served | {
        "latency_p50_ms": _percentile_ms(latencies, 50),
        "latency_p99_ms": _percentile_ms(latencies, 99),
        "latency_mean_ms": statistics.fmean(latencies) * 1000.0,
        "throughput_rps": run.throughput_rps,
        "pipelined_latency_p50_ms": run.latency_percentile_s(50) * 1000.0,
        "in_flight": float(in_flight),
    }


def local_latency_ms(exported: ExportedModel, *, runs: int = 20, threads: int = 1) -> float:
    """Median in-process latency of the whole model (no serving), for scale."""
    session = ort.InferenceSession(
        str(exported.onnx_path),
        session_options(threads, optimize=True),
        providers=["CPUExecutionProvider"],
    )
    x = exported.sample_inputs(batch=1, seed=7)
    session.run(None, x)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, x)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000.0


# --- Prefect tasks --------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

check_task = task(check_chain, name="edge-check-chain", cache_policy=NONE)
measure_task = task(measure_chain, name="edge-measure-chain", cache_policy=NONE)
