"""A gang job on its leases: what run_training is for one device, for N.

The launcher's process keeps every unit's lease alive (one LeaseKeeper over all of them,
renewed in one statement) while torchelastic's agent runs the ranks; the job moves to
running, then to finished or stopped with its last committed checkpoint. The ranks write
checkpoints with the leases' fencing token, so a stale attempt's writes are refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from gpuflow.hardware.home import gpuflow_home
from gpuflow.hardware.inventory import JobState
from gpuflow.hardware.inventory.keeper import LeaseKeeper
from gpuflow.tasks.training.distributed.agents import (
    RemoteAgents,
    agent_mode,
    agent_orders,
    node_address,
)
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.distributed.launch import free_port, run_gang, run_node_agent
from gpuflow.tasks.training.distributed.node_agent import agent_options, node_staging
from gpuflow.tasks.training.distributed.worker import rank_owner
from gpuflow.tasks.training.loop import TrainResult
from gpuflow.tasks.training.spec import TrainSpec

LEASE_TTL_S = 300.0
AGENT_MODE_ENV = "GPUFLOW_GANG_AGENTS"  # auto | deployment | in-process (agents.py)
_RESULT_FIELDS = tuple(TrainResult.__dataclass_fields__)


def gang_units(bindings: Sequence[Any]) -> list[GangUnit]:
    return [GangUnit.of(b.resource, b.backend_name) for b in bindings]


@contextlib.contextmanager
def rank_workloads_ended(cluster: Any, job_id: str, ranks: int) -> Iterator[None]:
    """Each rank ends its own workload; one killed mid-run (SIGKILL) cannot: its device
    would look busy for ever on the twin. Ended here for every rank, whatever happened."""
    try:
        yield
    finally:
        backend = cluster.get_backend()
        for rank in range(ranks):
            backend.end_workload(rank_owner(job_id, rank))


@contextlib.contextmanager
def running_gang(cluster: Any, job_id: str, bindings: Sequence[Any]) -> Iterator[Any]:
    """The gang's job RUNNING on its leases, which one LeaseKeeper renews meanwhile; every
    rank's workload ended afterwards, and a lease lost on the way raised at the end.
    Yields the inventory."""
    inventory = cluster.get_inventory()
    attempt = bindings[0].lease.attempt
    ids = [b.resource.resource_id for b in bindings]
    keeper = LeaseKeeper(inventory, job_id, attempt, ids, LEASE_TTL_S)
    with keeper, rank_workloads_ended(cluster, job_id, len(bindings)):
        inventory.transition_job(job_id, JobState.RUNNING, expect_attempt=attempt)
        yield inventory
        keeper.check()


def run_gang_training(
    spec: TrainSpec,
    storage: Any,  # CheckpointStorage
    cluster: Any,  # GpuCluster
    bindings: Sequence[Any],  # Binding, one per unit, the primary first
    run_id: str | None = None,
) -> tuple[TrainResult, dict[str, Any]]:
    """Train ``spec`` as one rank per binding; (rank 0's result, the gang's report)."""
    attempt = bindings[0].lease.attempt
    with running_gang(cluster, spec.job_id, bindings) as inventory:
        units = gang_units(bindings)
        common = agent_options(spec, cluster, bindings[0].lease.token, attempt, run_id)
        if len({u.node for u in units}) == 1:
            out = run_gang(spec, storage, units, staging=gpuflow_home() / "gangs", **common)
        else:
            out = _run_across_nodes(spec, storage, cluster, units, common)
    result = TrainResult(
        **{k: v for k, v in out.items() if k in _RESULT_FIELDS and k != "switches"}
    )
    inventory.transition_job(
        spec.job_id,
        JobState.STOPPED if result.stopped_by_request else JobState.FINISHED,
        expect_attempt=attempt,
        last_checkpoint_id=result.last_checkpoint,
    )
    report = {
        "world_size": out["world_size"],
        "backend": out["backend"],
        "parallel": spec.parallel,
        "nodes": sorted({b.resource.node for b in bindings}),
        "resource_ids": [b.resource.resource_id for b in bindings],
    }
    return result, report


def _run_across_nodes(
    spec: TrainSpec, storage: Any, cluster: Any, units: list[GangUnit], common: dict[str, Any]
) -> dict[str, Any]:
    """This node's agent here (the gang's first node: it hosts the rendezvous), every
    other node's started where that node runs (agents.py); rank 0's result."""
    mode = agent_mode(os.environ.get(AGENT_MODE_ENV, "auto"))
    address = node_address(all_local=mode == "in-process")
    rendezvous = (address, free_port(address))
    orders = agent_orders(
        spec,
        storage,
        units,
        rendezvous,
        attempt=common["attempt"],
        fencing_token=common["fencing_token"],
        run_id=common["run_id"],
        cluster_block=getattr(cluster, "_block_document_name", None),
    )
    for order in orders:  # on this machine every agent listens on loopback
        order.options["local_addr"] = address if mode == "in-process" else None
    first = units[0].node
    with RemoteAgents(orders, mode, cluster):
        mine = run_node_agent(
            spec,
            storage,
            units,
            first,
            rendezvous,
            staging=node_staging(first),
            local_addr=address,
            **common,
        )
    # Rank 0 may be on any node (the rendezvous orders them): every rank carries its result.
    any_rank = mine[min(mine)]
    out = dict(any_rank["rank0"])
    out.update(world_size=len(units), backend=any_rank["backend"])
    return out
