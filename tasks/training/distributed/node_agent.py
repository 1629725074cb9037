"""One node's agent of a gang across nodes, as the `gang-agent` flow (or a spawned process
on this machine) runs it: rebuilt from an AgentOrder's parameters on that node.

What is secret never travels in the parameters: the inventory's URL comes from the
cluster (a block by name, or this node's environment), the storage's credentials from
boto3's chain or the saved block, as for the `train` deployment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuflow.hardware.home import gpuflow_home
from gpuflow.tasks.training.distributed.gang import decode_plan


def run_agent_order(
    spec: dict[str, Any],
    storage: dict[str, Any],
    plan: str,
    node: str,
    rendezvous: list[Any],
    attempt: int,
    fencing_token: int | None,
    run_id: str | None = None,
    cluster_block: str | None = None,
    local_addr: str | None = None,
    cluster: Any = None,  # a GpuCluster handed over in memory (in-process agents)
) -> dict[str, Any]:
    """Run ``node``'s agent; returns a summary of its ranks (by global rank)."""
    from gpuflow.blocks.checkpoint_storage import CheckpointStorage
    from gpuflow.tasks.cluster import load_cluster
    from gpuflow.tasks.training.distributed.launch import run_node_agent
    from gpuflow.tasks.training.spec import TrainSpec

    train = TrainSpec.model_validate(spec)
    cluster = cluster or load_cluster(cluster_block)
    results = run_node_agent(
        train,
        CheckpointStorage(**storage),
        decode_plan(plan),
        node,
        (str(rendezvous[0]), int(rendezvous[1])),
        staging=node_staging(node),
        local_addr=local_addr,
        **agent_options(train, cluster, fencing_token, attempt, run_id),
    )
    return {
        str(rank): {k: r.get(k) for k in ("resource_id", "steps_done", "final_loss")}
        for rank, r in results.items()
    }


def agent_options(
    spec: Any, cluster: Any, fencing_token: int | None, attempt: int, run_id: str | None
) -> dict[str, Any]:
    """run_node_agent's options every node's agent of one gang run shares (the inventory's
    URL read on the node itself, from its cluster: it may hold a password)."""
    return {
        "inventory_url": cluster.get_inventory().url,
        "fencing_token": fencing_token,
        "attempt": attempt,
        "backend": spec.backend,
        "run_id": run_id,
        "device_backend": device_backend_of(cluster),
    }


def node_staging(node: str) -> Path:
    """This node's own staging folder for a gang's DCP files (never another node's)."""
    return gpuflow_home() / "gangs" / node


def device_backend_of(cluster: Any) -> tuple[str, str | None]:
    """What a rank needs to open the cluster's hardware backend itself."""
    spec = str(Path(cluster.cluster_spec).expanduser()) if cluster.cluster_spec else None
    return str(cluster.backend), spec
