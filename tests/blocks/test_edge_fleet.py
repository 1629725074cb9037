"""EdgeFleet: defaults, validation, and what the partitioner sees of each node."""

from __future__ import annotations

import pytest
from gpuflow.blocks.edge_fleet import EdgeFleet, EdgeNode, load_fleet
from gpuflow.tasks.edge.nodes import (
    NodeUnreachableError,
    check_reachable,
    free_port,
    node_capacity,
)
from pydantic import ValidationError


def test_default_fleet_is_loopback_nodes() -> None:
    fleet = load_fleet(None)
    assert len(fleet.nodes) == 4
    assert {n.host for n in fleet.nodes} == {"127.0.0.1"}
    assert all(n.base_port == 0 and n.speed == 1.0 for n in fleet.nodes)
    for node in fleet.nodes:
        check_reachable(node)  # every default node can be served on


def test_nodes_carry_speed_link_and_memory() -> None:
    fleet = EdgeFleet.loopback(2, speed=2.0, link_mb_s=100.0, memory_mb=512.0)
    capacity = node_capacity(fleet.nodes[1])
    assert (capacity.name, capacity.speed, capacity.link_mb_s, capacity.memory_mb) == (
        "edge-1",
        2.0,
        100.0,
        512.0,
    )


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([], "at least one node"),
        ([{"name": "a"}, {"name": "a"}], "unique; repeated: a"),
        ([{"name": "a", "speed": 0}], "greater than 0"),
        ([{"name": "a", "link_mb_s": -1}], "greater than 0"),
        ([{"name": "a", "cpus": []}], "cpus"),
        ([{"name": "bad name"}], "pattern"),
        ([{"name": "a", "base_port": 70000}], "less than or equal"),
    ],
)
def test_bad_fleets_are_refused(nodes: list, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        EdgeFleet(nodes=nodes)


def test_fixed_port_moves_past_a_busy_one() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert free_port("127.0.0.1", port) != port
    with pytest.raises(NodeUnreachableError, match="unreachable"):
        check_reachable(EdgeNode(name="remote", host="192.0.2.1"))  # TEST-NET-1
