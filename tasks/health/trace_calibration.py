"""What a real fault trace fixes in the twin's fault model, computed from the trace itself.

The trace: InfiniteHBD (SIGCOMM'25, Apache-2.0; a copy and its source in
data/infinitehbd/): 400 GPU servers over 349 days of LLM pre-training, every fault's start
and end per anonymised node, with a class hierarchy (Level / Class / Desc). It holds no
telemetry, so it fixes rates by class, how faults concentrate on repeat offenders, the
time between repeats on a node, and repair durations; not what precedes a failure.

Figures (``summary()``; tests check them and that the twin's defaults match):

* GPU-class faults: 158 in 400 x 349 node-days, 1.13e-3 per node-day;
* 43.0 % of them on the 5 % of nodes with the most (``top_node_share``);
* median 18.3 days between consecutive GPU faults of one node (``repeat_gaps_days``);
* repair (fault start to end) deciles of GPU faults (``repair_deciles_s``): median 17 h,
  a quarter back within 20 minutes, a tenth 18 days or more;
* 35 % of GPU faults are of kinds no telemetry foretells (device unknown error, lost, not
  found, nvidia-smi timeout): ``no_precursor_share``.

``simulate_repeats`` runs the twin's own hazard model (hardware.sim.hazard) on a fleet the
trace's size at the trace's GPU-fault rate and reports the same two repeat-offender
figures: hardware.sim.hazard's lemon and repeat defaults were chosen so they match.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from gpuflow.hardware.sim.hazard import DAY_S, HazardModel, fleet_schedule

TRACE_PATH = Path(__file__).resolve().parent / "data" / "infinitehbd" / "fault_trace.json"
TRACE_NODES = 400  # the paper's and the data README's fleet; faults touched 231 of them
GPUS_PER_NODE = 8
# GPU faults of kinds that telemetry does not foretell: the device vanishes or hangs.
NO_PRECURSOR_DESCS = frozenset(
    {"GPU device unknow error", "GPU Lost", "GPU device not found", "nvidia-smi Timeout"}
)


@dataclass(frozen=True)
class TraceFault:
    node: str
    level: str
    cls: str
    desc: str
    start_d: float  # days since the trace's first event
    end_d: float


def load_faults(path: Path | None = None) -> list[TraceFault]:
    """Every fault of the trace, its start paired with the next end of the same node and
    fault type (the trace has no unpaired event)."""
    events = json.loads(Path(path or TRACE_PATH).read_text())
    events.sort(key=lambda e: (e["event_time"], e["event_type"] != "fault_start"))
    open_: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    out = []
    for e in events:
        ft = e["fault_type"]
        key = (e["node_id"], ft["Level"], ft["Class"], ft["Desc"])
        if e["event_type"] == "fault_start":
            open_[key].append(float(e["event_time"]))
        elif open_[key]:
            out.append(TraceFault(*key, open_[key].pop(0), float(e["event_time"])))
    return sorted(out, key=lambda f: f.start_d)


def trace_days(faults: list[TraceFault]) -> float:
    return max(f.end_d for f in faults)


def rates_per_node_day(faults: list[TraceFault], nodes: int = TRACE_NODES) -> dict[str, float]:
    """Faults per node-day by class (and "GPU:<desc>" for the GPU class's kinds)."""
    exposure = nodes * trace_days(faults)
    counts = Counter(f.cls for f in faults)
    counts.update(f"GPU:{f.desc}" for f in faults if f.cls == "GPU")
    return {k: v / exposure for k, v in sorted(counts.items())}


def top_node_share(
    faults: list[TraceFault], cls: str = "GPU", top: float = 0.05, nodes: int = TRACE_NODES
) -> float:
    """Share of the class's faults on the ``top`` share of nodes that have the most."""
    counts = sorted(Counter(f.node for f in faults if f.cls == cls).values(), reverse=True)
    return _top_share(counts, top, nodes)


def _top_share(counts: list[int] | np.ndarray, top: float, nodes: int) -> float:
    total = float(np.sum(counts))
    k = max(1, round(top * nodes))
    return float(np.sum(sorted(counts, reverse=True)[:k])) / total if total else 0.0


def repeat_gaps_days(faults: list[TraceFault], cls: str = "GPU") -> list[float]:
    """Days between consecutive faults of the class on the same node (start to start)."""
    by_node: dict[str, list[float]] = defaultdict(list)
    for f in faults:
        if f.cls == cls:
            by_node[f.node].append(f.start_d)
    return _gaps(by_node.values())


def _gaps(per_node: Any) -> list[float]:
    out: list[float] = []
    for starts in per_node:
        s = sorted(starts)
        out += [b - a for a, b in zip(s, s[1:], strict=False)]
    return out


def repair_deciles_s(faults: list[TraceFault], cls: str = "GPU") -> tuple[float, ...]:
    """min, p10, ..., p90, max of the class's fault durations (start to end), seconds,
    rounded to the second."""
    d = np.array([f.end_d - f.start_d for f in faults if f.cls == cls]) * DAY_S
    return tuple(float(round(x)) for x in np.quantile(d, np.linspace(0.0, 1.0, 11)))


def no_precursor_share(faults: list[TraceFault]) -> float:
    gpu = [f for f in faults if f.cls == "GPU"]
    return sum(f.desc in NO_PRECURSOR_DESCS for f in gpu) / len(gpu)


def summary(path: Path | None = None) -> dict[str, Any]:
    """The trace's headline figures (what docs/health.md quotes)."""
    faults = load_faults(path)
    gaps = repeat_gaps_days(faults)
    gpu = [f for f in faults if f.cls == "GPU"]
    return {
        "faults": len(faults),
        "nodes_with_faults": len({f.node for f in faults}),
        "days": round(trace_days(faults), 2),
        "gpu_faults": len(gpu),
        "gpu_per_node_day": len(gpu) / (TRACE_NODES * trace_days(faults)),
        "rates_per_node_day": rates_per_node_day(faults),
        "gpu_top5pct_node_share": top_node_share(faults),
        "gpu_repeat_gap_median_days": statistics.median(gaps),
        "gpu_repeat_gaps": len(gaps),
        "gpu_repair_deciles_s": repair_deciles_s(faults),
        "gpu_no_precursor_share": no_precursor_share(faults),
    }


def simulate_repeats(
    model: HazardModel | None = None,
    reps: int = 30,
    seed: int = 0,
    nodes: int = TRACE_NODES,
    days: float = 349.0,
    gpu_per_node_day: float = 158 / (TRACE_NODES * 349.0),
    rounds: int = 4,
) -> dict[str, float]:
    """The twin's hazard model (its lemons and repeat factor) on a fleet the trace's size
    that realizes the trace's GPU-fault rate: the mean over ``reps`` fleets of the
    top-5 %-node share, the median repeat gap (days, all fleets' gaps pooled), the GPU
    faults per node-day realized and the fresh-fleet rate that gave it (repeats add to it:
    each run measures by how much, the next starts that much lower; ``rounds`` runs)."""
    base = replace(model or HazardModel(), device_share=1.0, gpus_per_node=GPUS_PER_NODE)
    fresh = gpu_per_node_day
    for _ in range(rounds):
        m = replace(base, rate_per_node_day=fresh)
        out = _repeat_figures(m, reps, seed, nodes, days)
        fresh *= gpu_per_node_day / out["per_node_day"]
    return out | {"fresh_per_node_day": m.rate_per_node_day}


def _repeat_figures(
    m: HazardModel, reps: int, seed: int, nodes: int, days: float
) -> dict[str, float]:
    shares, gaps, total = [], [], 0
    for r in range(reps):
        _, sched = fleet_schedule(seed + r, nodes * GPUS_PER_NODE, m, days * DAY_S)
        per_node: list[list[float]] = [[] for _ in range(nodes)]
        for ordinal, draws in sched.items():
            per_node[ordinal // GPUS_PER_NODE] += [d.onset_s / DAY_S for d in draws]
        counts = [len(v) for v in per_node]
        total += sum(counts)
        shares.append(_top_share(counts, 0.05, nodes))
        gaps += _gaps(per_node)
    return {
        "top5pct_node_share": float(np.mean(shares)),
        "repeat_gap_median_days": float(np.median(gaps)) if gaps else float("inf"),
        "per_node_day": total / (reps * nodes * days),
    }
