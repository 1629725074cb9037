"""A synthetic GPU-cluster job trace and the study fleet, shaped on public traces.

What is taken from the literature is the *shape*, not the numbers (docs/scheduling.md
gives the sources and which figure each knob follows):

- sizes: most jobs use one GPU, with a long tail of 2-4, 5-8 and >8 GPU gangs - the
  buckets of Philly's runtime analysis (Jeon et al., ATC'19, Fig. 2);
- durations: heavy-tailed, seconds to days, bigger gangs running longer (Philly Fig. 2;
  Helios, Hu et al., SC'21): a lognormal per size bucket, capped;
- arrivals: a diurnal cycle with bursts of near-simultaneous submissions (hyper-parameter
  sweeps) on top of a Poisson base (Helios; PAI, Weng et al., NSDI'22);
- heterogeneity: jobs that run on any GPU, jobs picky about high-end GPUs, and fractional
  requests (PAI's plan_gpu is a percentage of a GPU) which here become MIG slices and vDCUs.

The knob values below are this project's assumptions; every one is a field of
TraceSettings so a study can vary it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from gpuflow.hardware.skus import SKUS, sku

A100_40 = "NVIDIA A100-SXM4-40GB"
A100_80 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
V100 = "Tesla V100-SXM2-32GB"
K100 = "Hygon DCU K100"
NVIDIA_ALL = (H100, A100_80, A100_40, V100)
REFERENCE_SKU = A100_40


@dataclass(frozen=True)
class NodeGroup:
    region: str
    sku: str
    nodes: int
    per_node: int = 8


def study_fleet(scale: float = 1.0) -> tuple[NodeGroup, ...]:
    """The 10,000-GPU, two-region, five-SKU fleet of the study (``scale`` shrinks it)."""
    groups = (
        NodeGroup("cn-north", H100, 250),
        NodeGroup("cn-north", A100_80, 250),
        NodeGroup("cn-north", A100_40, 125),
        NodeGroup("cn-east", A100_40, 187),
        NodeGroup("cn-east", V100, 250),
        NodeGroup("cn-east", K100, 188),
    )
    if scale == 1.0:
        return groups
    return tuple(
        NodeGroup(g.region, g.sku, max(1, round(g.nodes * scale)), g.per_node) for g in groups
    )


def fleet_gpus(groups: tuple[NodeGroup, ...]) -> int:
    return sum(g.nodes * g.per_node for g in groups)


def speed(sku_name: str) -> float:
    """Training speed relative to the reference SKU, from the twin's tables: dense
    reduced-precision tensor throughput (what mixed-precision training runs on)."""
    return sku(sku_name).reduced_tflops / SKUS[REFERENCE_SKU].reduced_tflops


@dataclass(frozen=True)
class TraceJob:
    job_id: str
    arrival_s: float
    count: int
    work_s: float  # run time on `count` reference GPUs (A100-40GB)
    skus: tuple[str, ...]
    profile: str | None = None
    compute_units: int | None = None
    memory_mb: int | None = None
    region: str | None = None
    allow_spill: bool = False
    priority: int = 0
    max_count: int | None = None
    checkpoint_every_s: float = 1800.0


@dataclass(frozen=True)
class TraceSettings:
    # Size buckets (GPUs, probability): 1 | 2-4 | 5-8 | >8, Philly's buckets.
    sizes: tuple[tuple[int, float], ...] = (
        (1, 0.70),
        (2, 0.08),
        (4, 0.09),
        (8, 0.09),
        (16, 0.025),
        (32, 0.01),
        (64, 0.005),
    )
    # Lognormal run time per size: (median seconds, sigma); capped at max_duration_s.
    durations: tuple[tuple[int, float, float], ...] = (
        (1, 1200.0, 1.6),
        (4, 2400.0, 1.6),
        (8, 3600.0, 1.5),
        (64, 7200.0, 1.4),
    )
    max_duration_s: float = 3 * 86400.0
    # What a job accepts: (share, SKUs).
    sku_mix: tuple[tuple[float, tuple[str, ...]], ...] = (
        (0.40, NVIDIA_ALL),
        (0.30, (A100_80, A100_40)),
        (0.15, (H100,)),  # picky for high-end GPUs (PAI)
        (0.05, (V100,)),
        (0.10, (K100,)),
    )
    fractional_share: float = 0.10  # 1-GPU jobs asking a slice (PAI's fractional plan_gpu)
    mig_profiles: tuple[str, ...] = ("1g.5gb", "2g.10gb", "3g.20gb")  # on A100-40GB
    high_priority_share: float = 0.10
    high_priority: int = 10
    region_share: float = 0.6  # jobs naming a region (the rest take any)
    spill_share: float = 0.5  # of those, allowing spill
    elastic_share: float = 0.05  # of multi-GPU jobs: min half, max the full size
    diurnal_amplitude: float = 0.5
    burst_rate_per_h: float = 0.5
    burst_size: tuple[int, int] = (10, 60)
    regions: tuple[str, ...] = ("cn-north", "cn-east")
    checkpoint_every_s: float = 1800.0


def _size(rng: random.Random, s: TraceSettings) -> int:
    r = rng.random()
    acc = 0.0
    for n, p in s.sizes:
        acc += p
        if r <= acc:
            return n
    return s.sizes[-1][0]


def _duration(rng: random.Random, n: int, s: TraceSettings) -> float:
    median, sigma = s.durations[-1][1:]
    for limit, m, sg in s.durations:
        if n <= limit:
            median, sigma = m, sg
            break
    return min(s.max_duration_s, max(30.0, rng.lognormvariate(math.log(median), sigma)))


def _mean_gpu_s(s: TraceSettings) -> float:
    """Expected GPU-seconds per job (for sizing the arrival rate to a target load)."""
    total = 0.0
    for n, p in s.sizes:
        median, sigma = s.durations[-1][1:]
        for limit, m, sg in s.durations:
            if n <= limit:
                median, sigma = m, sg
                break
        total += p * n * min(s.max_duration_s, median * math.exp(sigma * sigma / 2))
    return total


def synthetic_trace(
    hours: float,
    fleet_gpus: int,
    load: float = 0.9,
    seed: int = 0,
    settings: TraceSettings | None = None,
) -> list[TraceJob]:
    """Jobs arriving over ``hours``, at a rate that offers ``load`` x the fleet on average."""
    s = settings or TraceSettings()
    rng = random.Random(seed)
    rate = load * fleet_gpus / _mean_gpu_s(s)  # jobs per second
    horizon = hours * 3600.0
    peak = rate * (1 + s.diurnal_amplitude)
    arrivals: list[float] = []
    t = 0.0
    while True:  # thinning: a Poisson process with a diurnal rate
        t += rng.expovariate(peak)
        if t >= horizon:
            break
        day = 1 + s.diurnal_amplitude * math.sin(2 * math.pi * (t / 86400.0 - 0.25))
        if rng.random() * (1 + s.diurnal_amplitude) <= day:
            arrivals.append(t)
    # Bursts: sweeps of similar jobs within a few minutes; they replace base arrivals so the
    # offered load stays what was asked.
    bursts: list[tuple[float, int]] = []
    t = 0.0
    while s.burst_rate_per_h > 0:
        t += rng.expovariate(s.burst_rate_per_h / 3600.0)
        if t >= horizon:
            break
        bursts.append((t, rng.randint(*s.burst_size)))
    burst_jobs = sum(k for _, k in bursts)
    if burst_jobs and len(arrivals) > burst_jobs:
        drop = set(rng.sample(range(len(arrivals)), burst_jobs))
        arrivals = [a for i, a in enumerate(arrivals) if i not in drop]
    jobs: list[TraceJob] = []
    for a in arrivals:
        jobs.append(_job(rng, s, a, None))
    for start, k in bursts:
        template = _job(rng, s, start, None)
        for _ in range(k):
            jobs.append(_job(rng, s, start + rng.uniform(0, 300.0), template))
    jobs.sort(key=lambda j: j.arrival_s)
    return [TraceJob(**{**vars(j), "job_id": f"t{i:06d}"}) for i, j in enumerate(jobs)]


def _job(rng: random.Random, s: TraceSettings, arrival: float, like: TraceJob | None) -> TraceJob:
    if like is not None:
        # A sweep: same shape and constraints, its own run time.
        n = like.count
        return TraceJob(**{**vars(like), "arrival_s": arrival, "work_s": _duration(rng, n, s)})
    n = _size(rng, s)
    r = rng.random()
    acc = 0.0
    skus: tuple[str, ...] = s.sku_mix[-1][1]
    for share, names in s.sku_mix:
        acc += share
        if r <= acc:
            skus = names
            break
    profile = compute_units = memory_mb = None
    if n == 1 and rng.random() < s.fractional_share:
        if skus == (K100,):
            profile, compute_units, memory_mb = (
                "vdcu",
                rng.choice((30, 60)),
                rng.choice((16384, 32768)),
            )
        else:
            skus, profile = (A100_40,), rng.choice(s.mig_profiles)
    region = rng.choice(s.regions) if rng.random() < s.region_share else None
    if region is not None and not any(_in_region(k, region) for k in skus):
        region = None
    max_count = None
    count = n
    if n > 1 and profile is None and rng.random() < s.elastic_share:
        count, max_count = max(1, n // 2), n
    return TraceJob(
        job_id="",
        arrival_s=arrival,
        count=count,
        work_s=_duration(rng, n, s),
        skus=skus,
        profile=profile,
        compute_units=compute_units,
        memory_mb=memory_mb,
        region=region,
        allow_spill=region is not None and rng.random() < s.spill_share,
        priority=s.high_priority if rng.random() < s.high_priority_share else 0,
        max_count=max_count,
        checkpoint_every_s=s.checkpoint_every_s,
    )


def _in_region(sku_name: str, region: str) -> bool:
    return any(g.sku == sku_name and g.region == region for g in study_fleet())


@dataclass
class TraceSummary:
    jobs: int
    size_share: dict[str, float] = field(default_factory=dict)
    gpu_hours: float = 0.0
    median_work_s: float = 0.0
    p99_work_s: float = 0.0


def summarize(trace: list[TraceJob]) -> TraceSummary:
    """The shares by Philly's size buckets and the run-time spread, to check the shape."""
    buckets = {"1": 0, "2-4": 0, "5-8": 0, ">8": 0}
    for j in trace:
        n = j.max_count or j.count
        key = "1" if n == 1 else "2-4" if n <= 4 else "5-8" if n <= 8 else ">8"
        buckets[key] += 1
    works = sorted(j.work_s for j in trace)
    total = len(trace) or 1
    return TraceSummary(
        jobs=len(trace),
        size_share={k: v / total for k, v in buckets.items()},
        gpu_hours=sum((j.max_count or j.count) * j.work_s for j in trace) / 3600.0,
        median_work_s=works[len(works) // 2] if works else 0.0,
        p99_work_s=works[min(len(works) - 1, int(0.99 * len(works)))] if works else 0.0,
    )
