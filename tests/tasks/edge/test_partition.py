"""The DP partitioner against brute force, the equal-op baseline, and bad input."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from gpuflow.tasks.edge.partition import (
    ChainCosts,
    NodeCapacity,
    PartitionError,
    best_placement,
    equal_op_split,
    evaluate_split,
    optimal_split,
)


def _fits(plan, nodes: list[NodeCapacity]) -> bool:
    by_name = {n.name: n for n in nodes}
    return all(
        by_name[s.node].memory_mb is None or s.memory_bytes <= by_name[s.node].memory_mb * 1e6
        for s in plan.shards
    )


def _random_chain(rng: random.Random, m: int) -> ChainCosts:
    return ChainCosts(
        segment_ms=[rng.choice([0.0, rng.uniform(0.1, 10.0)]) for _ in range(m)],
        boundary_bytes=[rng.randint(1_000, 2_000_000) for _ in range(m + 1)],
        weight_bytes=[rng.randint(0, 50_000_000) for _ in range(m)],
        activation_bytes=[rng.randint(0, 20_000_000) for _ in range(m)],
    )


def _random_node(rng: random.Random, name: str) -> NodeCapacity:
    return NodeCapacity(
        name,
        speed=rng.choice([1.0, 0.5, 2.0, rng.uniform(0.2, 3.0)]),
        link_mb_s=rng.choice([None, 10.0, 100.0, rng.uniform(1.0, 1000.0)]),
        memory_mb=rng.choice([None, None, rng.uniform(120.0, 300.0)]),
    )


def _brute_force(costs: ChainCosts, nodes: list[NodeCapacity], batch: int) -> float:
    m, k = len(costs.segment_ms), len(nodes)
    best = math.inf
    for cuts in itertools.combinations(range(1, m), k - 1):
        plan = evaluate_split(costs, nodes, list(cuts), batch=batch)
        if _fits(plan, nodes):
            best = min(best, plan.bottleneck_ms)
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    m = rng.randint(1, 8)
    k = rng.randint(1, min(m, 4))
    costs = _random_chain(rng, m)
    nodes = [_random_node(rng, f"n{i}") for i in range(k)]
    batch = rng.choice([1, 4])
    expected = _brute_force(costs, nodes, batch)
    if expected == math.inf:
        with pytest.raises(PartitionError, match="memory_mb"):
            optimal_split(costs, nodes, batch=batch)
        return
    plan = optimal_split(costs, nodes, batch=batch)
    assert plan.bottleneck_ms == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert len(plan.shards) == k
    assert [s.first_segment for s in plan.shards][0] == 0
    assert plan.shards[-1].stop_segment == m
    assert all(s.stop_segment > s.first_segment for s in plan.shards)
    assert plan.shards[-1].transfer_ms == 0.0
    assert plan.balance >= 1.0 - 1e-9


def test_dp_beats_equal_ops_when_costs_are_skewed() -> None:
    # Like ResNet-152's layer3: many cheap-looking segments in one stage cost the most.
    costs = ChainCosts([1, 1, 1, 1, 20, 20, 20, 20, 1, 1], [4] * 11)
    nodes = [NodeCapacity(f"n{i}") for i in range(4)]
    sizes = [10] * 4 + [3] * 4 + [10] * 2  # the expensive segments have few operators
    dp = optimal_split(costs, nodes)
    naive = equal_op_split(costs, nodes, sizes)
    # Four 20-ms segments on four nodes: the first shard must also take the cheap head.
    assert dp.bottleneck_ms == 24
    assert naive.bottleneck_ms == 80  # equal operator counts put all of "layer3" on one node
    assert naive.bottleneck_ms > dp.bottleneck_ms
    assert naive.balance > dp.balance >= 1.0
    assert dp.ideal_ms == pytest.approx(86 / 4)


def test_speed_and_link_shift_the_split() -> None:
    costs = ChainCosts([10.0] * 4, [0, 1_000_000, 1_000_000, 1_000_000, 0])
    even = optimal_split(costs, [NodeCapacity("a"), NodeCapacity("b")])
    assert even.cuts == [2]
    fast_second = optimal_split(costs, [NodeCapacity("a"), NodeCapacity("b", speed=3.0)])
    assert fast_second.cuts == [1]  # the 3x node takes three segments
    slow_link = [NodeCapacity("a", link_mb_s=1.0), NodeCapacity("b", link_mb_s=1.0)]
    plan = optimal_split(costs, slow_link)
    assert plan.shards[0].transfer_ms == pytest.approx(1000.0)  # 1 MB over 1 MB/s


def test_bad_input_is_named() -> None:
    costs = ChainCosts([1.0, 2.0, 3.0], [1, 1, 1, 1])
    with pytest.raises(PartitionError, match="k=4 shards need 3 single-tensor cut points"):
        optimal_split(costs, [NodeCapacity(f"n{i}") for i in range(4)])
    with pytest.raises(PartitionError, match="speed"):
        NodeCapacity("x", speed=0)
    with pytest.raises(PartitionError, match="boundary_bytes"):
        ChainCosts([1.0], [1])
    with pytest.raises(PartitionError, match="memory_mb"):
        optimal_split(
            ChainCosts([1.0, 1.0], [0, 0, 0], [10**9, 10**9]),
            [NodeCapacity("a", memory_mb=1), NodeCapacity("b", memory_mb=1)],
        )


def test_a_split_that_does_not_pay_is_refused() -> None:
    from gpuflow.tasks.edge.partition import PlanRefusedError, check_split_pays, single_node

    costs = ChainCosts([4.0, 4.0, 4.0, 4.0], [1_000_000] * 5, [10**6] * 4)
    fast_links = [NodeCapacity(f"n{i}", link_mb_s=1000.0) for i in range(4)]
    check_split_pays(optimal_split(costs, fast_links), costs, fast_links)  # 4.0 + 1 ms < 16
    slow_links = [NodeCapacity(f"n{i}", link_mb_s=0.1) for i in range(4)]
    plan = optimal_split(costs, slow_links)
    assert plan.bottleneck_ms > 16.0  # 10 s a hop
    with pytest.raises(PlanRefusedError, match="on node 'n0' alone takes 16.0 ms"):
        check_split_pays(plan, costs, slow_links)
    # A faster node that is not in the split still counts.
    assert single_node(costs, [*fast_links, NodeCapacity("big", speed=4.0)]) == ("big", 4.0)
    # No node holds the whole model (4 MB of weights, room for 2 MB besides the server):
    # splitting is the only way.
    small = [NodeCapacity(f"n{i}", link_mb_s=0.1, memory_mb=102.0) for i in range(4)]
    check_split_pays(optimal_split(costs, small), costs, small)


def _placement_brute_force(
    costs: ChainCosts, nodes: list[NodeCapacity], shards: int | None, batch: int
) -> tuple[float, int]:
    """(best bottleneck, fewest shards reaching it) over every ordered subset and cut."""
    m = len(costs.segment_ms)
    best: tuple[float, int] = (math.inf, 0)
    sizes = [shards] if shards else range(1, min(len(nodes), m) + 1)
    for size in sizes:
        for order in itertools.permutations(nodes, size):
            for cuts in itertools.combinations(range(1, m), size - 1):
                plan = evaluate_split(costs, list(order), list(cuts), batch=batch)
                if _fits(plan, nodes):
                    best = min(best, (plan.bottleneck_ms, size))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_placement_equals_brute_force_over_orders_and_subsets(seed: int) -> None:
    rng = random.Random(1000 + seed)
    m = rng.randint(1, 6)
    n = rng.randint(1, 4)
    costs = _random_chain(rng, m)
    nodes = [_random_node(rng, f"n{i}") for i in range(n)]
    shards = rng.choice([None, rng.randint(1, min(n, m))])
    batch = rng.choice([1, 2])
    expected, fewest = _placement_brute_force(costs, nodes, shards, batch)
    if expected == math.inf:
        with pytest.raises(PartitionError, match="memory_mb"):
            best_placement(costs, nodes, shards=shards, batch=batch)
        return
    plan = best_placement(costs, nodes, shards=shards, batch=batch)
    assert plan.bottleneck_ms == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert len(plan.shards) == (shards or fewest)
    assert len({s.node for s in plan.shards}) == len(plan.shards)  # a node serves once
    assert plan.shards[0].first_segment == 0 and plan.shards[-1].stop_segment == m


def test_placement_puts_fast_nodes_where_the_work_is_and_leaves_slow_ones_out() -> None:
    # Two heavy segments in the middle; nodes of speed 1, 1, 3, 3 in that order.
    costs = ChainCosts([2.0, 30.0, 30.0, 2.0], [0, 10**5, 10**5, 10**5, 0])
    nodes = [
        NodeCapacity("slow-a", speed=1.0, link_mb_s=1000.0),
        NodeCapacity("slow-b", speed=1.0, link_mb_s=1000.0),
        NodeCapacity("fast-a", speed=3.0, link_mb_s=1000.0),
        NodeCapacity("fast-b", speed=3.0, link_mb_s=1000.0),
    ]
    given = optimal_split(costs, nodes)
    placed = best_placement(costs, nodes, shards=4)
    assert placed.bottleneck_ms < given.bottleneck_ms
    heavy = [s.node for s in placed.shards if s.stop_segment - s.first_segment >= 1]
    assert {s.node for s in placed.shards if s.compute_ms * 3 >= 30.0} <= {"fast-a", "fast-b"}
    assert heavy  # every shard has work
    # Free to choose the count: the two fast nodes alone beat any use of the slow ones.
    chosen = best_placement(costs, [*nodes, NodeCapacity("crawler", speed=0.05)])
    assert "crawler" not in {s.node for s in chosen.shards}
    assert chosen.bottleneck_ms <= placed.bottleneck_ms


def test_on_slow_links_the_planner_keeps_the_model_on_one_node() -> None:
    from gpuflow.tasks.edge.partition import PlanRefusedError, check_split_pays

    costs = ChainCosts([4.0, 4.0, 4.0, 4.0], [1_000_000] * 5, [10**6] * 4)
    slow = [NodeCapacity(f"n{i}", speed=1.0 + i / 10, link_mb_s=0.1) for i in range(4)]
    alone = best_placement(costs, slow)
    assert [s.node for s in alone.shards] == ["n3"]  # the fastest, whole
    forced = best_placement(costs, slow, shards=4)
    with pytest.raises(PlanRefusedError, match="on node 'n3' alone takes"):
        check_split_pays(forced, costs, slow)


def test_memory_counts_the_server_and_the_activations() -> None:
    from gpuflow.tasks.edge.partition import SERVER_FOOTPRINT_MB

    # 10 MB of weights, 30 MB of activations per item: fits 150 MB at batch 1, not at 2.
    costs = ChainCosts([1.0], [0, 0], [10_000_000], [30_000_000])
    node = [NodeCapacity("box", memory_mb=SERVER_FOOTPRINT_MB + 45.0)]
    plan = best_placement(costs, node, batch=1)
    assert plan.shards[0].memory_bytes == int(SERVER_FOOTPRINT_MB * 1e6) + 40_000_000
    with pytest.raises(PartitionError, match="needs 100 MB of its own plus its activations"):
        best_placement(costs, node, batch=2)
    with pytest.raises(PartitionError, match="memory_mb"):  # weights alone would have fitted
        best_placement(costs, [NodeCapacity("tiny", memory_mb=20.0)])


def test_equal_nodes_keep_the_fleets_order_and_ties_take_fewer_shards() -> None:
    costs = ChainCosts([1.0] * 6, [1000] * 7)
    nodes = [NodeCapacity(f"e{i}", link_mb_s=100.0) for i in range(4)]
    assert [s.node for s in best_placement(costs, nodes, shards=3).shards] == ["e0", "e1", "e2"]
    # Four shards would leave one node with the same 2 segments as three do: three it is.
    assert [s.node for s in best_placement(costs, nodes).shards] == ["e0", "e1", "e2"]
