"""Split a chain of segments into k shards that minimise the slowest shard.

Cost model (PipeEdge-style, DESIGN.md section 8). Shard j runs on node j of the chain:

    stage_ms(j) = compute_ms(segments of j) / speed(j)
                  + bytes(output boundary of j) / link(j -> j+1)      (not for the last shard)

where ``speed`` is a node's speed factor relative to the machine that was profiled (2.0 =
twice as fast) and the link of a hop is the slower of the two nodes' links (MB/s, 1 MB =
10**6 bytes; None = free, which only a caller can ask for: a fleet's nodes default to
1 GbE). A node with ``memory_mb`` set cannot take a shard whose memory exceeds it: the
server's own footprint (SERVER_FOOTPRINT_MB, measured), the shard's weights and its peak
activations (the largest working set of one operator in it, times the batch). In a
pipeline the slowest stage bounds throughput, so the DP minimises ``max_j stage_ms(j)``
over every choice of k-1 cut points; ``balance`` is that bottleneck over the ideal (the
whole model's compute spread over the nodes' total speed, no links): 1.0 is a perfect split.

``optimal_split`` keeps the nodes in the order given and uses them all. ``best_placement``
also chooses which nodes serve and in which order (a DP over subsets), and with
``shards=None`` how many: one node alone when no split is faster.

``equal_op_split`` is the naive baseline: k shards with about the same number of graph
nodes each, snapped to the nearest cut points.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

# Resident memory of an idle shard server (python -m gpuflow.tasks.edge.serving.server with
# a one-operator model, onnxruntime 1 thread): VmRSS 102 MB, 63 MB of it shared libraries.
# Measured on this project's CI-class VM; a node's memory_mb must hold it besides the shard.
SERVER_FOOTPRINT_MB = 100.0
MAX_PLACEMENT_NODES = 8  # best_placement's subset DP grows as 2^n


class PartitionError(ValueError):
    """The chain cannot be split as asked."""


@dataclass(frozen=True)
class NodeCapacity:
    """What the partitioner knows about one edge node of the chain."""

    name: str
    speed: float = 1.0
    link_mb_s: float | None = None
    memory_mb: float | None = None

    def __post_init__(self) -> None:
        if not self.speed > 0 or not math.isfinite(self.speed):
            raise PartitionError(f"node {self.name!r}: speed must be > 0, got {self.speed!r}")
        if self.link_mb_s is not None and not self.link_mb_s > 0:
            raise PartitionError(
                f"node {self.name!r}: link_mb_s must be > 0 or None, got {self.link_mb_s!r}"
            )
        if self.memory_mb is not None and not self.memory_mb > 0:
            raise PartitionError(
                f"node {self.name!r}: memory_mb must be > 0 or None, got {self.memory_mb!r}"
            )


@dataclass(frozen=True)
class ChainCosts:
    """Per-segment compute cost and weights, and the bytes crossing each boundary.

    ``boundary_bytes`` has len(segment_ms) + 1 entries: the input, the m-1 cuts, the output.
    """

    segment_ms: list[float]
    boundary_bytes: list[int]
    weight_bytes: list[int] = field(default_factory=list)
    activation_bytes: list[int] = field(default_factory=list)  # per segment, per batch item

    def __post_init__(self) -> None:
        m = len(self.segment_ms)
        if m < 1:
            raise PartitionError("a chain needs at least one segment")
        if len(self.boundary_bytes) != m + 1:
            raise PartitionError(
                f"boundary_bytes needs {m + 1} entries for {m} segments, "
                f"got {len(self.boundary_bytes)}"
            )
        if self.weight_bytes and len(self.weight_bytes) != m:
            raise PartitionError(f"weight_bytes needs {m} entries, got {len(self.weight_bytes)}")
        if self.activation_bytes and len(self.activation_bytes) != m:
            raise PartitionError(
                f"activation_bytes needs {m} entries, got {len(self.activation_bytes)}"
            )
        if any(c < 0 or not math.isfinite(c) for c in self.segment_ms):
            raise PartitionError("segment costs must be finite and >= 0")


@dataclass(frozen=True)
class Shard:
    """Segments [first, stop) of the chain on one node, and what that costs."""

    index: int
    node: str
    first_segment: int
    stop_segment: int
    compute_ms: float
    transfer_ms: float
    weight_bytes: int
    memory_bytes: int = 0  # footprint + weights + peak activations

    @property
    def stage_ms(self) -> float:
        return self.compute_ms + self.transfer_ms


@dataclass(frozen=True)
class Plan:
    """k shards over the chain; ``cuts`` are the chosen boundaries (segment indices 1..m-1)."""

    method: str
    shards: list[Shard]
    cuts: list[int]
    ideal_ms: float

    @property
    def bottleneck_ms(self) -> float:
        return max(s.stage_ms for s in self.shards)

    @property
    def balance(self) -> float:
        """Slowest shard over the ideal (>= 1; 1.0 = perfect)."""
        return self.bottleneck_ms / self.ideal_ms if self.ideal_ms > 0 else 1.0

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "cuts": list(self.cuts),
            "ideal_ms": self.ideal_ms,
            "bottleneck_ms": self.bottleneck_ms,
            "balance": self.balance,
            "shards": [asdict(s) | {"stage_ms": s.stage_ms} for s in self.shards],
        }


def _check(costs: ChainCosts, nodes: list[NodeCapacity]) -> None:
    k = len(nodes)
    m = len(costs.segment_ms)
    if k < 1:
        raise PartitionError("need at least one node (k >= 1)")
    if k > m:
        raise PartitionError(
            f"k={k} shards need {k - 1} single-tensor cut points but the model has only "
            f"{m - 1}; use k <= {m}"
        )


class _Cost:
    """stage_ms of segments [a, b) on node j, from prefix sums."""

    def __init__(self, costs: ChainCosts, nodes: list[NodeCapacity], batch: int) -> None:
        self.costs = costs
        self.nodes = nodes
        self.batch = batch
        self.prefix = [0.0]
        for c in costs.segment_ms:
            self.prefix.append(self.prefix[-1] + c)
        weights = costs.weight_bytes or [0] * len(costs.segment_ms)
        self.wprefix = [0]
        for w in weights:
            self.wprefix.append(self.wprefix[-1] + w)
        self.activations = costs.activation_bytes or [0] * len(costs.segment_ms)

    def compute(self, a: int, b: int, j: int) -> float:
        return (self.prefix[b] - self.prefix[a]) / self.nodes[j].speed

    def hop(self, b: int, j: int, nxt: int | None) -> float:
        """ms to send boundary ``b`` from node j to node ``nxt`` (None: j is the last)."""
        if nxt is None:
            return 0.0
        links = [x for x in (self.nodes[j].link_mb_s, self.nodes[nxt].link_mb_s) if x]
        if not links:
            return 0.0
        return self.costs.boundary_bytes[b] * self.batch / (min(links) * 1e6) * 1000.0

    def transfer(self, b: int, j: int) -> float:
        return self.hop(b, j, j + 1 if j < len(self.nodes) - 1 else None)

    def weights(self, a: int, b: int) -> int:
        return self.wprefix[b] - self.wprefix[a]

    def memory(self, a: int, b: int) -> int:
        """Bytes a shard of segments [a, b) needs on its node (see the module docstring)."""
        peak = max(self.activations[a:b], default=0)
        return int(SERVER_FOOTPRINT_MB * 1e6) + self.weights(a, b) + peak * self.batch

    def fits(self, a: int, b: int, j: int) -> bool:
        memory = self.nodes[j].memory_mb
        return memory is None or self.memory(a, b) <= memory * 1e6

    def stage(self, a: int, b: int, j: int) -> float:
        if not self.fits(a, b, j):
            return math.inf
        return self.compute(a, b, j) + self.transfer(b, j)

    def shards(self, bounds: list[int], method: str) -> Plan:
        shards = [
            Shard(
                index=j,
                node=self.nodes[j].name,
                first_segment=a,
                stop_segment=b,
                compute_ms=self.compute(a, b, j),
                transfer_ms=self.transfer(b, j),
                weight_bytes=self.weights(a, b),
                memory_bytes=self.memory(a, b),
            )
            for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
        ]
        ideal = self.prefix[-1] / sum(n.speed for n in self.nodes)
        return Plan(method=method, shards=shards, cuts=bounds[1:-1], ideal_ms=ideal)


def optimal_split(costs: ChainCosts, nodes: list[NodeCapacity], *, batch: int = 1) -> Plan:
    """The k-shard split (k = len(nodes)) with the smallest slowest stage: DP, O(k m^2)."""
    _check(costs, nodes)
    model = _Cost(costs, nodes, batch)
    k, m = len(nodes), len(costs.segment_ms)
    inf = math.inf
    # best[j][e]: smallest bottleneck of segments [0, e) on nodes 0..j-1, each non-empty.
    best = [[inf] * (m + 1) for _ in range(k + 1)]
    choice = [[-1] * (m + 1) for _ in range(k + 1)]
    best[0][0] = 0.0
    for j in range(1, k + 1):
        for e in range(j, m - (k - j) + 1):
            for s in range(j - 1, e):
                if best[j - 1][s] == inf:
                    continue
                value = max(best[j - 1][s], model.stage(s, e, j - 1))
                if value < best[j][e]:
                    best[j][e], choice[j][e] = value, s
    if best[k][m] == inf:
        raise PartitionError(_no_fit(model, k))
    bounds = [m]
    for j in range(k, 0, -1):
        bounds.append(choice[j][bounds[-1]])
    return model.shards(bounds[::-1], "dp")


def _no_fit(model: _Cost, k: int) -> str:
    m = len(model.costs.segment_ms)
    return (
        f"no split of the model over {k} nodes fits their memory_mb limits (weights total "
        f"{model.weights(0, m) / 1e6:.1f} MB, and each shard server needs "
        f"{SERVER_FOOTPRINT_MB:.0f} MB of its own plus its activations)"
    )


def best_placement(
    costs: ChainCosts,
    nodes: list[NodeCapacity],
    *,
    shards: int | None = None,
    batch: int = 1,
) -> Plan:
    """The fastest chain over ``nodes``: which of them serve, in which order, and where the
    cuts fall, minimising the slowest stage; ``shards`` fixes how many nodes serve (None:
    any number, one node alone included; on a tie, fewer shards: fewer hops per request).

    A DP over subsets, from the chain's tail: ``best[mask][f][s]`` is the smallest slowest
    stage of serving segments [s, m) on the nodes of ``mask``, node ``f`` first. A node
    put before ``f`` pays its compute and the hop to ``f``. O(2^n n^2 m^2) for n nodes: of
    a fleet larger than MAX_PLACEMENT_NODES only that many of the fastest are considered.
    """
    if not nodes:
        raise PartitionError("need at least one node")
    if shards is not None:
        _check(costs, nodes[:shards])
        if shards > len(nodes):
            raise PartitionError(f"{shards} shards need {shards} nodes but there are {len(nodes)}")
        if shards > MAX_PLACEMENT_NODES:
            raise PartitionError(
                f"{shards} shards: the planner places at most {MAX_PLACEMENT_NODES}"
            )
    if len(nodes) > MAX_PLACEMENT_NODES:
        # The subset search grows as 2^n: a larger fleet offers its fastest nodes.
        nodes = sorted(nodes, key=lambda c: (-c.speed, -(c.link_mb_s or math.inf)))
        nodes = nodes[:MAX_PLACEMENT_NODES]
    n, m = len(nodes), len(costs.segment_ms)
    limit = min(n, m) if shards is None else shards
    model = _Cost(costs, nodes, batch)
    # best[(mask, f, s)] = (slowest stage, nodes from f to the tail, the cuts after s).
    # Ties go to the smaller node tuple: the fleet's own order where nothing else decides.
    State = tuple[float, tuple[int, ...], tuple[int, ...]]
    best: dict[tuple[int, int, int], State] = {}
    for f in range(n):
        for s in range(m):
            if model.fits(s, m, f):
                best[(1 << f, f, s)] = (model.compute(s, m, f), (f,), ())
    for size in range(1, limit):
        layer = [(key, v) for key, v in best.items() if key[0].bit_count() == size]
        for (mask, f, s), (value, path, cuts) in layer:
            for p in range(n):
                if mask >> p & 1:
                    continue
                hop = model.hop(s, p, f)
                for a in range(s):
                    if not model.fits(a, s, p):
                        continue
                    cand = (max(value, model.compute(a, s, p) + hop), (p, *path), (s, *cuts))
                    key = (mask | 1 << p, p, a)
                    if key not in best or cand[:2] < best[key][:2]:
                        best[key] = cand
    finals = [
        (v[0], key[0].bit_count(), v[1], v[2])
        for key, v in best.items()
        if key[2] == 0 and (shards is None or key[0].bit_count() == shards)
    ]
    if not finals:
        raise PartitionError(_no_fit(model, limit))
    # Ties: fewer shards (fewer hops per request), then the fleet's order.
    _, _, order, cuts = min(finals)
    bounds = [0, *cuts, m]
    chosen = [nodes[i] for i in order]
    return _Cost(costs, chosen, batch).shards(bounds, "placement")


def equal_op_split(
    costs: ChainCosts,
    nodes: list[NodeCapacity],
    segment_sizes: list[int],
    *,
    batch: int = 1,
) -> Plan:
    """k shards with about the same number of graph nodes each, snapped to cut points."""
    _check(costs, nodes)
    if len(segment_sizes) != len(costs.segment_ms):
        raise PartitionError("segment_sizes needs one entry per segment")
    k, m = len(nodes), len(segment_sizes)
    total = sum(segment_sizes)
    prefix = [0]
    for size in segment_sizes:
        prefix.append(prefix[-1] + size)
    bounds = [0]
    for j in range(1, k):
        target = total * j / k
        # Leave at least one segment for each shard still to come.
        candidates = range(bounds[-1] + 1, m - (k - j) + 1)
        bounds.append(min(candidates, key=lambda b: (abs(prefix[b] - target), b)))
    bounds.append(m)
    return _Cost(costs, nodes, batch).shards(bounds, "equal-ops")


def evaluate_split(
    costs: ChainCosts, nodes: list[NodeCapacity], cuts: list[int], *, batch: int = 1
) -> Plan:
    """The plan for given cut boundaries (segment indices), e.g. from a brute-force search."""
    _check(costs, nodes)
    m = len(costs.segment_ms)
    bounds = [0, *cuts, m]
    if len(cuts) != len(nodes) - 1 or any(
        a >= b for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ):
        raise PartitionError(f"cuts must be {len(nodes) - 1} increasing indices in 1..{m - 1}")
    return _Cost(costs, nodes, batch).shards(bounds, "given")


class PlanRefusedError(PartitionError):
    """A split predicted to serve slower than the whole model on one node."""


def single_node(
    costs: ChainCosts, nodes: list[NodeCapacity], *, batch: int = 1
) -> tuple[str, float] | None:
    """(the fastest node that holds the whole model, its ms per request); None if none can."""
    model = _Cost(costs, nodes, batch)
    m = len(costs.segment_ms)
    fits = [j for j in range(len(nodes)) if model.fits(0, m, j)]
    if not fits:
        return None
    best = max(fits, key=lambda j: nodes[j].speed)
    return nodes[best].name, model.compute(0, m, best)


def check_split_pays(
    plan: Plan, costs: ChainCosts, nodes: list[NodeCapacity], *, batch: int = 1
) -> None:
    """Refuse a split whose slowest stage is no faster than one node running everything:
    its throughput would be lower and every request slower (the hops add to latency)."""
    if len(plan.shards) < 2:
        return
    alone = single_node(costs, nodes, batch=batch)
    if alone is None:
        return  # no node holds the model whole: splitting is the only way to serve it
    name, alone_ms = alone
    if plan.bottleneck_ms >= alone_ms:
        hop_ms = max(s.transfer_ms for s in plan.shards)
        raise PlanRefusedError(
            f"the {len(plan.shards)}-shard plan's slowest stage takes {plan.bottleneck_ms:.1f} "
            f"ms (hops up to {hop_ms:.1f} ms) but the whole model on node {name!r} alone takes "
            f"{alone_ms:.1f} ms: the split would serve slower than that single node. Deploy "
            f"it on {name!r} alone (shards=1), or give the nodes faster links (link_mb_s)"
        )
