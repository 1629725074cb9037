"""From an exported model and its profile to a k-shard plan (and the naive one beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.cuts import CutError, GraphCuts, bytes_per_item, find_cuts
from gpuflow.tasks.edge.export import ExportedModel
from gpuflow.tasks.edge.manifest import file_sha256
from gpuflow.tasks.edge.nodes import node_capacity
from gpuflow.tasks.edge.partition import (
    ChainCosts,
    PartitionError,
    Plan,
    check_split_pays,
    equal_op_split,
    optimal_split,
)
from gpuflow.tasks.edge.profile import NodeProfile, segment_costs_ms


@dataclass
class PlanResult:
    """The cut analysis, the per-segment costs, the DP plan and the equal-op baseline."""

    cuts: GraphCuts
    segment_ms: list[float]
    dp: Plan
    equal_ops: Plan
    batch: int

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
    return ChainCosts(segment_ms, boundaries, cuts.weight_bytes)


def plan_shards(
    exported: ExportedModel, profile: NodeProfile, nodes: list[EdgeNode], k: int | None = None
) -> PlanResult:
    """Cut the exported graph and split it over the first ``k`` nodes (default: all).
    PlanRefusedError when the split is predicted slower than one node serving it whole."""
    k = len(nodes) if k is None else k
    if not isinstance(k, int) or k < 1:
        raise PartitionError(f"k must be a positive int, got {k!r}")
    if k > len(nodes):
        raise PartitionError(f"k={k} shards need {k} nodes but the fleet has {len(nodes)}")
    cuts = find_cuts(onnx.load(str(exported.onnx_path), load_external_data=False))
    if k > 1 and not cuts.cuts:
        raise CutError(
            f"model {exported.model_name!r} has no single-tensor cut point (every boundary "
            f"keeps two or more tensors live), so it cannot be split into {k} shards"
        )
    segment_ms = segment_costs_ms(profile, cuts.node_names, cuts.segments)
    costs = chain_costs(cuts, segment_ms)
    capacities = [node_capacity(n) for n in nodes[:k]]
    sizes = [len(s) for s in cuts.segments]
    dp = optimal_split(costs, capacities, batch=profile.batch)
    # Against every node given, not only those a shard landed on: one may beat them all.
    check_split_pays(dp, costs, [node_capacity(n) for n in nodes])
    equal = equal_op_split(costs, capacities, sizes, batch=profile.batch)
    return PlanResult(cuts, segment_ms, dp, equal, profile.batch)


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
