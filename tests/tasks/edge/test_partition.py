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
    equal_op_split,
    evaluate_split,
    optimal_split,
)


def _brute_force(costs: ChainCosts, nodes: list[NodeCapacity], batch: int) -> float:
    m, k = len(costs.segment_ms), len(nodes)
    best = math.inf
    for cuts in itertools.combinations(range(1, m), k - 1):
        plan = evaluate_split(costs, nodes, list(cuts), batch=batch)
        weights_ok = all(
            n.memory_mb is None or s.weight_bytes <= n.memory_mb * 1e6
            for s, n in zip(plan.shards, nodes, strict=True)
        )
        if weights_ok:
            best = min(best, plan.bottleneck_ms)
    return best


@pytest.mark.parametrize("seed", range(60))
def test_dp_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    m = rng.randint(1, 8)
    k = rng.randint(1, min(m, 4))
    costs = ChainCosts(
        segment_ms=[rng.choice([0.0, rng.uniform(0.1, 10.0)]) for _ in range(m)],
        boundary_bytes=[rng.randint(1_000, 2_000_000) for _ in range(m + 1)],
        weight_bytes=[rng.randint(0, 50_000_000) for _ in range(m)],
    )
    nodes = [
        NodeCapacity(
            f"n{i}",
            speed=rng.choice([1.0, 0.5, 2.0, rng.uniform(0.2, 3.0)]),
            link_mb_s=rng.choice([None, 10.0, 100.0, rng.uniform(1.0, 1000.0)]),
            memory_mb=rng.choice([None, None, rng.uniform(20.0, 400.0)]),
        )
        for i in range(k)
    ]
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
    # No node holds the whole model (4 MB of weights, 2 MB each): splitting is the only way.
    small = [NodeCapacity(f"n{i}", link_mb_s=0.1, memory_mb=2.0) for i in range(4)]
    check_split_pays(optimal_split(costs, small), costs, small)
