"""Edge nodes at work: whether a shard can be served at a node, on which port, and what the
partitioner may assume of it. A node's configuration (EdgeNode) is the EdgeFleet block's.

Shards are launched as local processes (``launch="local"``): the node's ``host`` must be an
address of this machine (loopback by default), and ``cpus`` pins the process to those cores
so that several "nodes" on one box do not share cores (an emulated fleet). A real fleet
runs one Prefect work pool per edge node; that launcher is not part of this module.
"""

from __future__ import annotations

import errno
import ipaddress
import socket

from gpuflow.blocks.edge_fleet import EdgeNode
from gpuflow.tasks.edge.partition import NodeCapacity


class NodeUnreachableError(ConnectionError):
    """A node's address cannot be reached (or served on) from here."""


def node_capacity(node: EdgeNode) -> NodeCapacity:
    """What the partitioner may assume of ``node``: its speed, link and memory."""
    return NodeCapacity(node.name, node.speed, node.link_mb_s, node.memory_mb)


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
