"""Stage times as served: a plan's shards timed in the session a shard server runs them in.

The per-node profile (profile.py) runs with graph optimisation off, so that every graph
node shows under its own name and a cut can be costed; a shard server runs with it on
(Conv+BatchNorm+Relu fused, layouts changed), and the two disagree by shard: a balance
predicted at 1.07 served at 1.45-1.70 on ResNet-50. So the planner does not stop at the
profile. It cuts the planned shards out of the model (in memory), times each one with the
serving options (``served_session_options``, the same threads) on the activations the
shard before it produced, rescales the profile's segment costs inside each shard so they
add up to what was measured, and plans again; until the plan stops changing (or after
``rounds``). The plan's stage times are then measured, not inferred.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
from gpuflow.tasks.edge.cuts import GraphCuts
from gpuflow.tasks.edge.partition import Plan
from gpuflow.tasks.edge.serving.shard_model import served_session_options


@dataclass(frozen=True)
class ServedTiming:
    """The plan settled on, the segment costs it was planned with, and what each of its
    shards measured as served (ms on the profiling machine, before node speed)."""

    plan: Plan
    segment_ms: list[float]
    served_ms: list[float]
    rounds: int


def time_shards(
    model: onnx.ModelProto,
    cuts: GraphCuts,
    plan: Plan,
    inputs: dict[str, np.ndarray],
    *,
    intra_op_threads: int,
    runs: int = 7,
    warmup: int = 2,
) -> list[float]:
    """Median ms of each shard of ``plan``, run as served, on the chain's own activations."""
    boundaries = cuts.boundaries
    extractor = onnx.utils.Extractor(model)
    stages: list[tuple[ort.InferenceSession, str, str]] = []
    for shard in plan.shards:
        first, last = boundaries[shard.first_segment].name, boundaries[shard.stop_segment].name
        part = model if len(plan.shards) == 1 else extractor.extract_model([first], [last])
        session = ort.InferenceSession(
            part.SerializeToString(),
            served_session_options(intra_op_threads),
            providers=["CPUExecutionProvider"],
        )
        stages.append((session, first, last))
    # A request at a time through the whole chain, as served: each shard runs after the
    # others have had the caches, not in a warm loop of its own.
    times: list[list[float]] = [[] for _ in stages]
    for i in range(warmup + runs):
        x = next(iter(inputs.values()))
        for j, (session, first, last) in enumerate(stages):
            started = time.perf_counter()
            x = session.run([last], {first: x})[0]
            if i >= warmup:
                times[j].append(time.perf_counter() - started)
    return [statistics.median(t) * 1000.0 for t in times]


def settle_plan(
    model: onnx.ModelProto,
    cuts: GraphCuts,
    segment_ms: list[float],
    plan_with: Callable[[list[float]], Plan],
    inputs: dict[str, np.ndarray],
    *,
    intra_op_threads: int,
    price: Callable[[list[float], Plan], Plan],
    rounds: int = 3,
) -> ServedTiming:
    """Plan, time the shards as served, rescale, plan again (see the module docstring).
    Out of rounds, the plan whose measured slowest stage was the smallest is taken, priced
    (``price``: the same cuts and nodes) with the costs its own round measured."""
    costs = list(segment_ms)
    plan = plan_with(costs)
    tried: list[tuple[float, ServedTiming]] = []
    for done in range(1, rounds + 1):
        served = time_shards(model, cuts, plan, inputs, intra_op_threads=intra_op_threads)
        measured_stages = []
        for shard, measured in zip(plan.shards, served, strict=True):
            a, b = shard.first_segment, shard.stop_segment
            predicted = sum(costs[a:b])
            if predicted > 0:
                costs[a:b] = [c * measured / predicted for c in costs[a:b]]
                # The shard's compute on its node, rescaled by what the profile missed.
                measured_stages.append(shard.compute_ms * measured / predicted + shard.transfer_ms)
            else:  # the profile saw nothing here: spread what was measured evenly
                costs[a:b] = [measured / (b - a)] * (b - a)
                measured_stages.append(shard.stage_ms)
        again = plan_with(costs)
        if _same(again, plan):
            return ServedTiming(again, costs, served, done)
        tried.append(
            (max(measured_stages), ServedTiming(price(costs, plan), list(costs), served, done))
        )
        plan = again
    # Out of rounds (the plans oscillate between near-equal cuts): the tried plan whose
    # slowest stage measured the smallest, with the costs of its own round.
    return min(tried, key=lambda t: t[0])[1]


def _same(a: Plan, b: Plan) -> bool:
    return a.cuts == b.cuts and [s.node for s in a.shards] == [s.node for s in b.shards]
