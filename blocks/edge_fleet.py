"""EdgeFleet: the edge nodes a sliced model is deployed over, in chain order, and EdgeNode,
the configuration of one of them (plain pydantic: tasks/edge reads it without Prefect).

Shards are launched as local processes (``launch="local"``): the node's ``host`` must be
an address of this machine (loopback by default), and ``cpus`` pins the process to those
cores so that several "nodes" on one box do not share cores (an emulated fleet).
"""

from __future__ import annotations

from typing import Literal

from prefect.blocks.core import Block
from pydantic import BaseModel, Field, field_validator

LOOPBACK = "127.0.0.1"


# A hop is never free: 1 Gbit/s Ethernet, what edge boxes commonly have, unless a node's
# link is configured (or measured: `gpuflow bench edge` reports loopback's).
DEFAULT_LINK_MB_S = 125.0


class EdgeNode(BaseModel):
    """One edge node of a fleet."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Node name.")
    host: str = Field(default=LOOPBACK, description="Address the shard server listens on.")
    base_port: int = Field(
        default=0, ge=0, le=65535, description="First port to try; 0 = any free port."
    )
    speed: float = Field(default=1.0, gt=0, description="Speed relative to the profiled machine.")
    link_mb_s: float | None = Field(
        default=DEFAULT_LINK_MB_S,
        gt=0,
        description="Link bandwidth in MB/s (10**6 bytes); default 1 GbE; None = free.",
    )
    memory_mb: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Memory for a shard server in MB (its own footprint, the shard's weights and "
            "activations); None = no limit."
        ),
    )
    cpus: list[int] | None = Field(
        default=None, description="Cores to pin the shard process to (emulates separate boxes)."
    )
    intra_op_threads: int = Field(default=1, ge=0, description="onnxruntime threads (0 = auto).")
    launch: Literal["local"] = Field(default="local", description="How shards are started.")

    @field_validator("cpus")
    @classmethod
    def _cpus_valid(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(c < 0 for c in value)):
            raise ValueError(f"cpus must be a non-empty list of core ids >= 0, got {value!r}")
        return value


def default_nodes(count: int = 4) -> list[EdgeNode]:
    """``count`` loopback nodes (the default fleet), each with one onnxruntime thread."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [EdgeNode(name=f"edge-{i}") for i in range(count)]


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
