"""Which worker runs a flow: a work queue per node, whose worker owns that node.

With one worker per host (or per twin node in a cluster-in-a-box), a run placed on a node
must go to that node's queue. Launchers (the scheduler, remediation) ask
``queue_for_node``; where no such queue exists, runs go to the pool's default queue.
"""

from __future__ import annotations

import os


def node_queue_name(node: str) -> str:
    return f"node-{node}"


def queue_for_node(deployment: str, node: str) -> str | None:
    """The node's queue in ``deployment``'s work pool, or None when the pool has none."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    name = node_queue_name(node)
    with get_client(sync_client=True) as client:
        try:
            pool = client.read_deployment_by_name(deployment).work_pool_name
            if not pool:
                return None
            client.read_work_queue_by_name(name, work_pool_name=pool)
        except ObjectNotFound:
            return None
    return name


def owned_node() -> str | None:
    """The node this worker process owns (GPUFLOW_NODE), if it owns one."""
    return os.environ.get("GPUFLOW_NODE") or None
