"""The tour's edge step: the edge_deploy flow slices resnet18-digits over three loopback
nodes, checks the shard chain against the whole model, and tears it down again."""

from __future__ import annotations

from typing import Any

MODEL = "resnet18-digits"
SHARDS = 3


def deploy_and_teardown(measure_requests: int) -> dict[str, Any]:
    """The flow's result (addresses, cuts, balance, check); no shard server is left running."""
    from gpuflow.flows.edge_deploy import edge_deploy
    from gpuflow.tasks.edge.deploy import teardown

    try:
        return edge_deploy(model=MODEL, shards=SHARDS, measure_requests=measure_requests)
    finally:
        teardown(MODEL)
