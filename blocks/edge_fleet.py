"""EdgeFleet: the edge nodes a sliced model is deployed over, in chain order."""

from __future__ import annotations

from gpuflow.tasks.edge.nodes import EdgeNode, default_nodes
from prefect.blocks.core import Block
from pydantic import Field, field_validator


class EdgeFleet(Block):
    """Edge nodes in chain order: shard i runs on node i.

    Each node has an address (host, base port; port 0 = any free one), a speed factor
    relative to the machine the model is profiled on, a link bandwidth in MB/s and an
    optional memory limit for its shard's weights. The default is four loopback nodes:
    every shard a local process on this machine.
    """

    _block_type_name = "gpuflow Edge Fleet"
    _block_type_slug = "gpuflow-edge-fleet"
    _description = "Edge nodes (address, speed factor, link bandwidth) a model is sliced over."

    nodes: list[EdgeNode] = Field(
        default_factory=default_nodes, description="Edge nodes in chain order."
    )

    @field_validator("nodes")
    @classmethod
    def _nodes_valid(cls, value: list[EdgeNode]) -> list[EdgeNode]:
        if not value:
            raise ValueError("an edge fleet needs at least one node")
        names = [n.name for n in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"edge node names must be unique; repeated: {', '.join(duplicates)}")
        return value

    @classmethod
    def loopback(cls, count: int = 4, **node_settings: object) -> EdgeFleet:
        """``count`` loopback nodes sharing the given settings (speed, link_mb_s, ...)."""
        return cls(
            nodes=[EdgeNode(name=f"edge-{i}", **node_settings) for i in range(count)]  # type: ignore[arg-type]
        )


def load_fleet(block_name: str | None = None) -> EdgeFleet:
    """The saved EdgeFleet block ``block_name``, or the default loopback fleet."""
    if not block_name:
        return EdgeFleet()
    return EdgeFleet.load(block_name)
