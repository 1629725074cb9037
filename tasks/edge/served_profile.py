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

Each shard is timed on its node's cores (``pinned``), as ``taskset`` runs its server
there: the timing thread, and the onnxruntime threads its session starts, are held to
them. That also makes "auto" threads (``intra_op_threads=0``) count the node's cores, as
the server does (``cpu_quota_threads`` reads the affinity), not the planner's.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    # False when the rounds ran out with the plans still oscillating: the plan is then the
    # one that measured fastest, and under its own round's costs the DP would have cut
    # otherwise, so it need not beat the equal-op baseline as priced.
    settled: bool = True


@contextmanager
def pinned(cpus: Sequence[int] | None, what: str = "cores") -> Iterator[None]:
    """Hold the calling thread (and threads it starts meanwhile) to ``cpus``; None: as it
    is. ValueError naming ``what`` when the kernel will not run it on every one of them
    (a core this machine lacks, or outside its cpuset), with the affinity left unchanged."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    wanted = set(cpus)
    try:
        os.sched_setaffinity(0, wanted)
        got = os.sched_getaffinity(0)
    except OSError as exc:
        got, error = set(), exc.strerror
    else:
        error = None
    if got != wanted:  # the kernel narrows a mask to the cores it may use, silently
        os.sched_setaffinity(0, before)
        missing = sorted(wanted - got)
        raise ValueError(
            f"{what}: cannot run on core(s) {missing or sorted(wanted)}"
            f"{f' ({error})' if error else ''}; this process may use {sorted(before)}"
        )
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def time_shards(
    model: onnx.ModelProto,
    cuts: GraphCuts,
    plan: Plan,
    inputs: dict[str, np.ndarray],
    *,
    intra_op_threads: int,
    cpus_of: Mapping[str, Sequence[int] | None] | None = None,
    runs: int = 7,
    warmup: int = 2,
) -> list[float]:
    """Median ms of each shard of ``plan``, run as served, on the chain's own activations;
    ``cpus_of`` (node name -> cores) pins each shard's session and runs where its server
    will be pinned."""
    cpus_of = cpus_of or {}
    boundaries = cuts.boundaries
    extractor = onnx.utils.Extractor(model)
    stages: list[tuple[ort.InferenceSession, str, str, Sequence[int] | None, str]] = []
    for shard in plan.shards:
        first, last = boundaries[shard.first_segment].name, boundaries[shard.stop_segment].name
        part = model if len(plan.shards) == 1 else extractor.extract_model([first], [last])
        cpus, what = cpus_of.get(shard.node), f"node {shard.node!r} (cpus)"
        with pinned(cpus, what):  # its thread pool starts here, and keeps these cores
            session = ort.InferenceSession(
                part.SerializeToString(),
                served_session_options(intra_op_threads),
                providers=["CPUExecutionProvider"],
            )
        stages.append((session, first, last, cpus, what))
    # A request at a time through the whole chain, as served: each shard runs after the
    # others have had the caches, not in a warm loop of its own.
    times: list[list[float]] = [[] for _ in stages]
    for i in range(warmup + runs):
        x = next(iter(inputs.values()))
        for j, (session, first, last, cpus, what) in enumerate(stages):
            with pinned(cpus, what):
                started = time.perf_counter()
                x = session.run([last], {first: x})[0]
                elapsed = time.perf_counter() - started
            if i >= warmup:
                times[j].append(elapsed)
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
    cpus_of: Mapping[str, Sequence[int] | None] | None = None,
    rounds: int = 3,
) -> ServedTiming:
    """Plan, time the shards as served, rescale, plan again (see the module docstring).
    Out of rounds, the plan whose measured slowest stage was the smallest is taken, priced
    (``price``: the same cuts and nodes) with the costs its own round measured."""
    costs = list(segment_ms)
    plan = plan_with(costs)
    tried: list[tuple[float, ServedTiming]] = []
    for done in range(1, rounds + 1):
        served = time_shards(
            model, cuts, plan, inputs, intra_op_threads=intra_op_threads, cpus_of=cpus_of
        )
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
            (
                max(measured_stages),
                ServedTiming(price(costs, plan), list(costs), served, done, settled=False),
            )
        )
        plan = again
    # Out of rounds (the plans oscillate between near-equal cuts): the tried plan whose
    # slowest stage measured the smallest, with the costs of its own round.
    return min(tried, key=lambda t: t[0])[1]


def _same(a: Plan, b: Plan) -> bool:
    return a.cuts == b.cuts and [s.node for s in a.shards] == [s.node for s in b.shards]
