"""A replay of the real InfiniteHBD fault sequence (issue 15, item 5): reactive restart vs
failover to spares vs predicted checkpoint-and-migrate, on the trace's own fault times and
repair durations.

The trace (tasks.health.trace_calibration reads it): 400 GPU servers, 348 days, every
fault's start and end per node; 231 nodes had faults, the other 169 none. Faults of one
node that overlap are one incident (start of the first to end of the last). Fault sets,
replayed separately: ``gpu`` (the GPU class, 158 faults) and ``other`` (every other class:
parameter-plane links, NICs, power, fans, software, the trace's "Other Failure" level with
its stress-test failures; all of them take the node out, as the trace records them).

The fleet: the trace's 400 nodes of 8 GPUs run gang jobs of ``nodes_per_job`` nodes
(default 16: 128-GPU jobs, an assumption: the trace's pre-training jobs are not
described), around the clock for the trace's span. A node's faults hit the job in its slot
(a node that replaces it inherits the slot's later faults: the trace is per slot). Spares
are extra nodes, healthy while idle; a repaired node returns to the pool. Strategies:

* ``reactive`` - Young/Daly checkpoints; a fault costs the work since the last one, the
  job waits for its node's repair (the trace's duration, or at most ``reschedule_s`` when
  set), then restarts (R);
* ``spares`` - as reactive, but the job restarts on a spare after R when one is free (else
  it waits for the first spare back or its own node, whichever is sooner);
* ``predicted:<name>`` - spares, and a fault foreseen (with the per-class recall a health
  model reached on the twin's held-out histories, or a stated bound) costs C + M instead:
  the job checkpoints and moves to a spare before the node fails; false alarms at the
  model's measured rate per 1000 device-days cost C + M each. The trace has no telemetry:
  which faults are foreseeable is the trace_calibration split (GPU faults of the kinds
  that vanish or hang, ``NO_PRECURSOR_DESCS``, take the model's recall on the twin's
  abrupt classes; other GPU faults its recall on the classes with precursors; non-GPU
  faults are never foreseen: the health model watches GPUs).

Intervals: bootstrap over nodes (the 400 node histories drawn with replacement into the
slots, and the foreseen/missed draws and false alarms drawn again), every strategy on the
same draw (paired). Young/Daly T comes from the fault set's rate in the trace.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
from gpuflow.hardware.sim.hazard import DAY_S
from gpuflow.tasks.health.decision import (
    DEFAULT_CHECKPOINT_SAVE_S,
    DEFAULT_RELAUNCH_S,
    DEFAULT_RESTART_S,
)
from gpuflow.tasks.health.trace_calibration import (
    GPUS_PER_NODE,
    NO_PRECURSOR_DESCS,
    TRACE_NODES,
    TraceFault,
    load_faults,
    trace_days,
)
from gpuflow.tasks.remediation.downtime_sim import DowntimeCosts, fleet_figures, summarize

FAULT_SETS = ("gpu", "other")
PRECURSOR, ABRUPT, UNWATCHED = "precursor", "abrupt", "unwatched"


@dataclass(frozen=True)
class Incident:
    start_s: float
    end_s: float
    kind: str  # PRECURSOR / ABRUPT (GPU faults) or UNWATCHED

    @property
    def repair_s(self) -> float:
        return self.end_s - self.start_s


def _kind(f: TraceFault) -> str:
    if f.cls != "GPU":
        return UNWATCHED
    return ABRUPT if f.desc in NO_PRECURSOR_DESCS else PRECURSOR


def node_incidents(faults: Sequence[TraceFault], fault_set: str) -> dict[str, list[Incident]]:
    """Per node, its faults of the set as incidents in time order (overlaps merged; the
    merged incident keeps its first fault's kind)."""
    if fault_set not in FAULT_SETS:
        raise ValueError(f"fault_set must be one of {FAULT_SETS}, got {fault_set!r}")
    by_node: dict[str, list[TraceFault]] = defaultdict(list)
    for f in faults:
        if (f.cls == "GPU") == (fault_set == "gpu"):
            by_node[f.node].append(f)
    out: dict[str, list[Incident]] = {}
    for node, fs in by_node.items():
        merged: list[Incident] = []
        for f in sorted(fs, key=lambda x: x.start_d):
            a, b = f.start_d * DAY_S, f.end_d * DAY_S
            if merged and a <= merged[-1].end_s:
                last = merged[-1]
                merged[-1] = replace(last, end_s=max(last.end_s, b))
            else:
                merged.append(Incident(a, b, _kind(f)))
        out[node] = merged
    return out


@dataclass(frozen=True)
class Predictor:
    """What foresees faults in the replay: recall per incident kind (UNWATCHED: never),
    false alarms per 1000 device-days, and where the figures come from."""

    name: str
    recall: dict[str, float]
    false_alarms_per_1000_dd: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        for k, v in self.recall.items():
            if k not in (PRECURSOR, ABRUPT) or not 0.0 <= v <= 1.0:
                raise ValueError(
                    f"{self.name}: recall[{k!r}] = {v} (kinds precursor/abrupt, [0, 1])"
                )
        if not self.false_alarms_per_1000_dd >= 0:
            raise ValueError(f"{self.name}: false alarm rate must be >= 0")


PRECURSOR_BOUND = Predictor(
    "precursor-bound",
    {PRECURSOR: 1.0},
    0.0,
    "every GPU fault of a kind with precursors, no false alarm",
)


@dataclass(frozen=True)
class ReplayConfig:
    """The fleet the trace is mapped onto and its costs (defaults: tasks.health.decision)."""

    nodes: int = TRACE_NODES
    gpus_per_node: int = GPUS_PER_NODE
    nodes_per_job: int = 16
    spares: int = 8
    reschedule_s: float | None = None  # reactive waits for the repair, or at most this
    checkpoint_s: float = DEFAULT_CHECKPOINT_SAVE_S
    restart_s: float = DEFAULT_RESTART_S
    migrate_s: float = DEFAULT_RELAUNCH_S

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus_per_node", "nodes_per_job"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.nodes % self.nodes_per_job:
            raise ValueError(
                f"nodes ({self.nodes}) must be a multiple of nodes_per_job ({self.nodes_per_job})"
            )
        if self.spares < 0:
            raise ValueError(f"spares must be >= 0, got {self.spares}")
        if self.reschedule_s is not None and not self.reschedule_s >= 0:
            raise ValueError(f"reschedule_s must be >= 0 or None, got {self.reschedule_s}")
        self.costs()  # the cost fields' own checks

    def costs(self) -> DowntimeCosts:
        return DowntimeCosts(
            self.nodes_per_job * self.gpus_per_node,
            self.checkpoint_s,
            self.restart_s,
            self.migrate_s,
        )


@dataclass(frozen=True)
class Strategy:
    name: str
    spares: int
    predictor: Predictor | None = None


def strategies(cfg: ReplayConfig, predictors: Sequence[Predictor]) -> list[Strategy]:
    return [
        Strategy("reactive", 0),
        Strategy("spares", cfg.spares),
        *(Strategy(f"predicted:{p.name}", cfg.spares, p) for p in predictors),
    ]


@dataclass
class ReplayOutcome:
    unplanned_gpu_s: float = 0.0
    planned_gpu_s: float = 0.0
    wait_gpu_s: float = 0.0  # of the unplanned: waiting for a node
    foreseen: int = 0
    missed: int = 0
    false_alarms: int = 0


def replay(
    slots: Sequence[Sequence[Incident]],
    cfg: ReplayConfig,
    strategy: Strategy,
    every_s: float,
    draws: Sequence[Sequence[float]] | None = None,
    false_alarms: Sequence[int] | None = None,
) -> ReplayOutcome:
    """One pass over the fleet's incidents in time order. ``slots``: per node slot its
    incidents; ``draws``: a uniform number per incident (foreseen when below the recall),
    ``false_alarms``: a count per slot (both only read with a predictor)."""
    if len(slots) != cfg.nodes:
        raise ValueError(f"{len(slots)} slots for a fleet of {cfg.nodes} nodes")
    costs = cfg.costs()
    g = costs.gang_gpus
    p = strategy.predictor
    events = sorted(
        (inc.start_s, s, i) for s, incs in enumerate(slots) for i, inc in enumerate(incs)
    )
    resume = [0.0] * (cfg.nodes // cfg.nodes_per_job)
    pool = [0.0] * strategy.spares  # when each spare is free
    out = ReplayOutcome()
    for t, s, i in events:
        inc = slots[s][i]
        job = s // cfg.nodes_per_job
        own = inc.repair_s if cfg.reschedule_s is None else min(inc.repair_s, cfg.reschedule_s)
        wait = own
        if pool:
            free_at = heapq.heappop(pool)
            if free_at - t < own:  # a spare is sooner than the node's own repair
                wait = max(free_at - t, 0.0)
                heapq.heappush(pool, t + inc.repair_s)  # the repaired node is the new spare
            else:
                heapq.heappush(pool, free_at)
        foreseen = p is not None and draws is not None and draws[s][i] < p.recall.get(inc.kind, 0.0)
        running = t >= resume[job]
        if running and foreseen:
            out.foreseen += 1
            out.planned_gpu_s += costs.planned_gpu_s()  # checkpoint and move ahead of it
            out.unplanned_gpu_s += g * wait  # no spare: the saved job waits for a node
            out.wait_gpu_s += g * wait
            resume[job] = t + wait + cfg.migrate_s
        elif running:
            out.missed += 1
            out.unplanned_gpu_s += costs.unplanned_gpu_s(every_s, wait)
            out.wait_gpu_s += g * wait
            resume[job] = t + wait + cfg.restart_s
        else:  # the job was already down: this node may hold it down longer
            later = t + wait + cfg.restart_s
            extra = max(later - resume[job], 0.0)
            out.unplanned_gpu_s += g * extra
            out.wait_gpu_s += g * extra
            resume[job] = max(resume[job], later)
    if p is not None and false_alarms is not None:
        n = int(sum(false_alarms))
        out.false_alarms = n
        out.planned_gpu_s += n * costs.planned_gpu_s()
    return out


@dataclass
class ReplayStudy:
    fault_set: str
    table: dict[str, dict[str, float]]
    incidents: int
    incidents_by_kind: dict[str, int]
    days: float
    checkpoint_every_s: float
    resamples: int
    config: ReplayConfig
    predictors: dict[str, str] = field(default_factory=dict)


def _outcome_figures(
    o: ReplayOutcome, device_days: float, share: float, days: float
) -> dict[str, float]:
    figs = {
        k: float(v)
        for k, v in fleet_figures(o.unplanned_gpu_s, o.planned_gpu_s, device_days, share).items()
    }
    figs["unplanned_gpu_h_per_year"] = o.unplanned_gpu_s / 3600.0 / days * 365.0
    figs["wait_share_of_unplanned"] = o.wait_gpu_s / o.unplanned_gpu_s if o.unplanned_gpu_s else 0.0
    figs["foreseen"] = float(o.foreseen)
    figs["false_alarms"] = float(o.false_alarms)
    return figs


def study(
    fault_set: str = "gpu",
    predictors: Sequence[Predictor] = (PRECURSOR_BOUND,),
    cfg: ReplayConfig | None = None,
    resamples: int = 1000,
    seed: int = 0,
    faults: Sequence[TraceFault] | None = None,
) -> ReplayStudy:
    """Every strategy on the trace (point) and on ``resamples`` bootstrap fleets."""
    cfg = cfg or ReplayConfig()
    faults = list(faults) if faults is not None else load_faults()
    days = trace_days(faults)
    per_node = node_incidents(faults, fault_set)
    if len(per_node) > cfg.nodes:
        raise ValueError(f"{len(per_node)} nodes with faults for a fleet of {cfg.nodes}")
    histories: list[list[Incident]] = [per_node[n] for n in sorted(per_node)]
    histories += [[] for _ in range(cfg.nodes - len(histories))]  # the fault-free nodes
    n_inc = sum(len(h) for h in histories)
    device_days = cfg.nodes * cfg.gpus_per_node * days
    costs = cfg.costs()
    every = costs.checkpoint_every_s(n_inc / device_days)
    share = costs.checkpoint_share(every)
    strats = strategies(cfg, predictors)
    fa_mean = {
        st.name: st.predictor.false_alarms_per_1000_dd / 1000.0 * cfg.gpus_per_node * days
        for st in strats
        if st.predictor is not None
    }
    rng = np.random.default_rng(seed)

    def one(
        slots: list[list[Incident]], draw_rng: np.random.Generator
    ) -> dict[str, dict[str, float]]:
        draws = [draw_rng.random(len(h)).tolist() for h in slots]
        res = {}
        for st in strats:
            fa = draw_rng.poisson(fa_mean[st.name], cfg.nodes) if st.name in fa_mean else None
            o = replay(slots, cfg, st, every, draws, fa)
            res[st.name] = _outcome_figures(o, device_days, share, days)
        return res

    order = rng.permutation(cfg.nodes)
    point = one([histories[k] for k in order], np.random.default_rng(seed + 1))
    boots = [
        one([histories[k] for k in rng.integers(0, cfg.nodes, cfg.nodes)], rng)
        for _ in range(resamples)
    ]
    samples = {n: {k: np.array([b[n][k] for b in boots]) for k in point[n]} for n in point}
    table = summarize(point, samples)
    # Prediction alone: each predicted strategy against spares (both have the spare pool).
    predicted = [n for n in point if n.startswith("predicted:")]
    alone = summarize({n: point[n] for n in ("spares", *predicted)}, samples, baseline="spares")
    for n in predicted:
        for k in ("", "_lo", "_hi"):
            table[n][f"reduction_vs_spares{k}"] = alone[n][f"reduction{k}"]
    kinds: dict[str, int] = defaultdict(int)
    for h in histories:
        for inc in h:
            kinds[inc.kind] += 1
    return ReplayStudy(
        fault_set=fault_set,
        table=table,
        incidents=n_inc,
        incidents_by_kind=dict(kinds),
        days=days,
        checkpoint_every_s=every,
        resamples=resamples,
        config=cfg,
        predictors={p.name: p.source for p in predictors},
    )
