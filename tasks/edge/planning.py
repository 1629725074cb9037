"""From an exported model and its profile to a k-shard plan (and the naive one beside it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.cuts import CutError, GraphCuts, bytes_per_item, find_cuts
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.manifest import file_sha256
from gpuflow.tasks.edge.nodes import node_capacity
from gpuflow.tasks.edge.partition import (
    ChainCosts,
    NodeCapacity,
    PartitionError,
    Plan,
    best_placement,
    check_split_pays,
    equal_op_split,
    evaluate_split,
)
from gpuflow.tasks.edge.profile import NodeProfile, segment_costs_ms
from gpuflow.tasks.edge.served_profile import settle_plan


@dataclass
class PlanResult:
    """The cut analysis, the per-segment costs, the DP plan and the equal-op baseline."""

    cuts: GraphCuts
    segment_ms: list[float]
    dp: Plan
    equal_ops: Plan
    batch: int
    # Each shard of ``dp`` timed as served (ms before node speed), and the planning rounds
    # it took (served_profile.py); None when planned from the profile alone.
    served_ms: list[float] | None = None
    rounds: int = 0
    # False when settling ran out of rounds (served_profile.ServedTiming.settled).
    settled: bool = True

    def cut_tensors(self, plan: Plan | None = None) -> list[str]:
        plan = plan or self.dp
        return [self.cuts.cuts[b - 1].tensor for b in plan.cuts]

    def summary(self) -> dict:
        """JSON-friendly: the plan, the baseline and both balances."""
        return {
            "num_nodes": len(self.cuts.order),
            "num_cut_points": len(self.cuts.cuts),
            "total_ms": sum(self.segment_ms),
            "batch": self.batch,
            "served_ms": self.served_ms,
            "planning_rounds": self.rounds,
            "planning_settled": self.settled,
            "dp": self.dp.to_dict() | {"cut_tensors": self.cut_tensors(self.dp)},
            "equal_ops": self.equal_ops.to_dict()
            | {"cut_tensors": self.cut_tensors(self.equal_ops)},
        }


def chain_costs(cuts: GraphCuts, segment_ms: list[float]) -> ChainCosts:
    """The partitioner's view of a cut graph: segment costs, boundary bytes, weights."""
    boundaries = [
        bytes_per_item(cuts.input_spec),
        *(c.bytes_per_item for c in cuts.cuts),
        bytes_per_item(cuts.output_spec),
    ]
    return ChainCosts(segment_ms, boundaries, cuts.weight_bytes, cuts.activation_bytes)


def plan_shards(
    exported: ExportedModel,
    profile: NodeProfile,
    nodes: list[EdgeNode],
    k: int | None = None,
    *,
    as_served: bool = True,
    stored: dict[str, Any] | None = None,
) -> PlanResult:
    """Cut the exported graph and place it on the best of ``nodes``: which serve, in which
    order and with which cuts (partition.best_placement); ``k`` fixes the number of shards,
    None lets the planner choose (one node alone when no split is faster). With
    ``as_served`` the plan is settled on shard times measured as served
    (served_profile.py). ``stored`` (a previous version's ``plan_costs``, see
    stored_plan_costs) is taken as it was, with its settled costs and measured stage
    times, not measured again, while its nodes are still in the fleet and the shard count
    asked for (if any) is its own (a redeploy then cuts exactly as before). PlanRefusedError when a split of ``k`` is
    predicted slower than one node serving the model whole."""
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise PartitionError(f"k must be a positive int, got {k!r}")
    if k is not None and k > len(nodes):
        raise PartitionError(f"k={k} shards need {k} nodes but the fleet has {len(nodes)}")
    model = onnx.load(str(exported.onnx_path))
    cuts = find_cuts(model)
    if (k or 1) > 1 and not cuts.cuts:
        raise CutError(
            f"model {exported.model_name!r} has no single-tensor cut point (every boundary "
            f"keeps two or more tensors live), so it cannot be split into {k} shards"
        )
    capacities = [node_capacity(n) for n in nodes]

    def plan_with(segment_ms: list[float]) -> Plan:
        return best_placement(
            chain_costs(cuts, segment_ms), capacities, shards=k, batch=profile.batch
        )

    def price_as(segment_ms: list[float], cut_at: list[int], on: list[str]) -> Plan:
        by_name = {c.name: c for c in capacities}
        plan = evaluate_split(
            chain_costs(cuts, segment_ms), [by_name[n] for n in on], cut_at, batch=profile.batch
        )
        return replace(plan, method="dp")

    segment_ms = segment_costs_ms(profile, cuts.node_names, cuts.segments)
    served_ms: list[float] | None = None
    rounds = 0
    is_settled = True
    dp: Plan | None = None
    if stored is not None and _reusable(stored, len(segment_ms), capacities, k):
        # The previous version's plan as it was settled, with its measured stage times.
        segment_ms = list(stored["segment_ms"])
        dp = price_as(segment_ms, stored["plan"]["cuts"], stored["plan"]["nodes"])
        served_ms, rounds = stored.get("served_ms"), int(stored.get("rounds", 0))
        is_settled = bool(stored.get("settled", True))
    elif as_served:
        settled = settle_plan(
            model,
            cuts,
            segment_ms,
            plan_with,
            exported.sample_inputs(batch=profile.batch),
            intra_op_threads=profile.intra_op_threads,
            price=lambda costs, p: price_as(costs, p.cuts, [s.node for s in p.shards]),
            cpus_of={n.name: n.cpus for n in nodes},
        )
        dp, segment_ms, served_ms, rounds, is_settled = (
            settled.plan,
            settled.segment_ms,
            settled.served_ms,
            settled.rounds,
            settled.settled,
        )
    else:
        dp = plan_with(segment_ms)
    costs = chain_costs(cuts, segment_ms)
    # Against every node given, not only those a shard landed on: one may beat them all.
    check_split_pays(dp, costs, capacities, batch=profile.batch)
    chosen = [next(c for c in capacities if c.name == s.node) for s in dp.shards]
    sizes = [len(s) for s in cuts.segments]
    equal = equal_op_split(costs, chosen, sizes, batch=profile.batch)
    return PlanResult(
        cuts, segment_ms, dp, equal, profile.batch, served_ms, rounds, settled=is_settled
    )


def _reusable(
    stored: dict[str, Any], segments: int, capacities: list[NodeCapacity], k: int | None
) -> bool:
    """A stored plan is taken again when it cut this graph and its nodes are still in
    the fleet (and it has the number of shards asked for, if one was)."""
    nodes = stored.get("plan", {}).get("nodes", [])
    names = {c.name for c in capacities}
    return (
        len(stored.get("segment_ms", [])) == segments
        and bool(nodes)
        and set(nodes) <= names
        and (k is None or k == len(nodes))
    )


def _signature(plan: Plan) -> dict[str, Any]:
    return {"cuts": list(plan.cuts), "nodes": [s.node for s in plan.shards]}


PLAN_COSTS_FILE = "plan_costs.json"


def save_plan_costs(result: PlanResult, model_dir: Path) -> Path:
    """What a redeploy of the same export reuses: the settled segment costs, the plan they
    gave and its measured stage times."""
    path = Path(model_dir) / PLAN_COSTS_FILE
    data = {
        "segment_ms": result.segment_ms,
        "served_ms": result.served_ms,
        "rounds": result.rounds,
        "settled": result.settled,
        "plan": _signature(result.dp),
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def stored_plan_costs(previous: Any) -> dict[str, Any] | None:
    """``previous``'s plan costs (a Deployment whose profile is being reused), or None."""
    if previous is None:
        return None
    try:
        data = json.loads((previous.root / "model" / PLAN_COSTS_FILE).read_text())
        return data if isinstance(data.get("segment_ms"), list) and "plan" in data else None
    except (OSError, ValueError, AttributeError):
        return None


def plan_nodes(result: PlanResult, nodes: list[EdgeNode]) -> list[EdgeNode]:
    """The fleet's nodes in the plan's chain order (shard i on the i-th)."""
    by_name = {n.name: n for n in nodes}
    return [by_name[s.node] for s in result.dp.shards]


def plan_message(result: PlanResult) -> str:
    """One line that says what was chosen and why, for the flow's log."""
    plan = result.dp
    names = [s.node for s in plan.shards]
    where = f"on node {names[0]!r} alone" if len(names) == 1 else f"over {' -> '.join(names)}"
    stages = ", ".join(f"{s.stage_ms:.2f}" for s in plan.shards)
    served = (
        f"; stages measured as served after {result.rounds} planning round(s)"
        + ("" if result.settled else " (plans still alternating: the fastest measured taken)")
        if result.served_ms is not None
        else ""
    )
    if len(names) == 1:
        why = "no split over the fleet is faster than this node alone"
    else:
        why = f"slowest stage {plan.bottleneck_ms:.2f} ms, balance {plan.balance:.2f}"
    return f"plan: {len(names)} shard(s) {where} (stage ms: {stages}): {why}{served}"


def stored_profile(
    previous: Any, exported: ExportedModel, intra_op_threads: int
) -> NodeProfile | None:
    """The profile ``previous`` (a Deployment, or None) was planned from, when it can stand
    for this export: the very same ONNX bytes (model, seed, overrides, opset) profiled with
    the same onnxruntime threads. A redeploy then cuts exactly as before instead of
    re-measuring (profiles vary run to run, and so would the cuts)."""
    if previous is None:
        return None
    model_dir = previous.root / "model"
    profile_path = model_dir / "profile.json"
    if not profile_path.is_file():
        return None
    try:
        before = ExportedModel.load(model_dir)
        profile = NodeProfile.load(profile_path)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # an older or damaged record: measure again
    if not before.onnx_path.is_file() or profile.intra_op_threads != intra_op_threads:
        return None
    if file_sha256(before.onnx_path) != file_sha256(exported.onnx_path):
        return None
    return profile


# --- Prefect task ---------------------------------------------------------------------------
from prefect import task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

plan_task = task(plan_shards, name="edge-plan-cuts", cache_policy=NONE)
