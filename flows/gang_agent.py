"""Flow `gang-agent`: one node's torchelastic agent of a gang that spans nodes.

The `train` flow of a gang across nodes runs its first node's agent itself and starts this
flow on every other node's work queue (tasks/training/distributed/agents.py), so the
worker that owns the node starts the ranks there, bound to that node's leased units. No
retries: the agents restart the gang together (max_restarts), and a failed agent fails
the gang's train run, which remediation and the scheduler take from there.
"""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.training.distributed.node_agent import run_agent_order
from prefect import flow, task
from prefect.cache_policies import NONE

run_agent_task = task(run_agent_order, name="node-agent", cache_policy=NONE)


@flow(name="gang-agent", log_prints=True)
def gang_agent(order: dict[str, Any]) -> dict[str, Any]:
    """Run one node's agent: ``order`` is an AgentOrder's parameters (the gang's spec and
    units, this node, the rendezvous, the attempt and its fencing token; no secret)."""
    return run_agent_task(**order)
