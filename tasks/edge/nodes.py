"""Edge nodes as gpuflow sees them: where a shard runs and what the partitioner may assume.

Shards are launched as local processes (``launch="local"``): the node's ``host`` must be an
address of this machine (loopback by default), and ``cpus`` pins the process to those cores
so that several "nodes" on one box do not share cores (an emulated fleet). A real fleet
runs one Prefect work pool per edge node; that launcher is not part of this module.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from typing import Literal

from gpuflow.tasks.edge.partition import NodeCapacity
from pydantic import BaseModel, Field, field_validator

LOOPBACK = "127.0.0.1"


class NodeUnreachableError(ConnectionError):
    """A node's address cannot be reached (or served on) from here."""


class EdgeNode(BaseModel):
    """One edge node of a fleet."""

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", description="Node name.")
    host: str = Field(default=LOOPBACK, description="Address the shard server listens on.")
    base_port: int = Field(
        default=0, ge=0, le=65535, description="First port to try; 0 = any free port."
    )
    speed: float = Field(default=1.0, gt=0, description="Speed relative to the profiled machine.")
    link_mb_s: float | None = Field(
        default=None, gt=0, description="Link bandwidth in MB/s (10**6 bytes); None = free."
    )
    memory_mb: float | None = Field(
        default=None, gt=0, description="Memory for a shard's weights in MB; None = no limit."
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

    def capacity(self) -> NodeCapacity:
        return NodeCapacity(self.name, self.speed, self.link_mb_s, self.memory_mb)


def default_nodes(count: int = 4) -> list[EdgeNode]:
    """``count`` loopback nodes (the default fleet), each with one onnxruntime thread."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return [EdgeNode(name=f"edge-{i}") for i in range(count)]


def check_reachable(node: EdgeNode, timeout_s: float = 2.0) -> None:
    """Raise NodeUnreachableError unless a shard can be served at the node's address.

    For local launch the host must resolve to an address of this machine (a bind to it
    succeeds) and, when ``base_port`` is fixed, that port must be free or the next ones.
    """
    try:
        infos = socket.getaddrinfo(node.host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise NodeUnreachableError(
            f"node {node.name!r}: host {node.host!r} does not resolve ({exc})"
        ) from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.bind((sockaddr[0], 0))
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL):
                raise NodeUnreachableError(
                    f"node {node.name!r}: {node.host} is unreachable for a local launch "
                    f"(not an address of this machine); a remote node needs its own "
                    f"work pool"
                ) from None
            raise NodeUnreachableError(
                f"node {node.name!r}: cannot use {node.host}: {exc}"
            ) from None


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def free_port(host: str, start: int, attempts: int = 50) -> int:
    """The first port from ``start`` that can be bound on ``host`` (``start`` 0 = any)."""
    if start == 0:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for port in range(start, min(start + attempts, 65536)):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise NodeUnreachableError(f"no free port in {start}..{start + attempts - 1} on {host}")
