"""The InfiniteHBD replay: the real fault sequence under reactive restart, spares and
prediction (tasks.remediation.trace_replay)."""

from __future__ import annotations

import pytest
from gpuflow.tasks.health.trace_calibration import load_faults
from gpuflow.tasks.remediation.downtime_sim import fleet_figures
from gpuflow.tasks.remediation.trace_replay import (
    ABRUPT,
    PRECURSOR,
    UNWATCHED,
    Incident,
    Predictor,
    ReplayConfig,
    Strategy,
    node_incidents,
    replay,
    study,
)

HOUR = 3600.0
T = 4 * HOUR  # a checkpoint interval for the unit cases
SEER = Predictor("seer", {PRECURSOR: 1.0})


def test_replay_reads_the_trace_and_a_fault_free_node_only_checkpoints() -> None:
    faults = load_faults()
    gpu = node_incidents(faults, "gpu")
    other = node_incidents(faults, "other")
    n_gpu = sum(len(v) for v in gpu.values())
    assert 0 < n_gpu <= sum(f.cls == "GPU" for f in faults)
    assert {i.kind for v in gpu.values() for i in v} == {PRECURSOR, ABRUPT}
    assert {i.kind for v in other.values() for i in v} == {UNWATCHED}
    assert all(a.end_s < b.start_s for v in gpu.values() for a, b in zip(v, v[1:], strict=False))
    res = study("gpu", [SEER], resamples=5)
    assert res.incidents == n_gpu and res.days > 300
    cfg = res.config
    # A fleet whose nodes have no fault: nothing lost, ETTR is the checkpoint duty cycle.
    idle = replay([[]] * cfg.nodes, cfg, Strategy("reactive", 0), res.checkpoint_every_s)
    assert idle.unplanned_gpu_s == idle.planned_gpu_s == 0
    share = cfg.costs().checkpoint_share(res.checkpoint_every_s)
    ettr = fleet_figures(0.0, 0.0, 1000.0, share)["ettr"]
    assert ettr == pytest.approx(1 - cfg.checkpoint_s / (res.checkpoint_every_s + cfg.checkpoint_s))
    table = res.table
    assert table["reactive"]["ettr"] < ettr
    lo, hi = table["spares"]["reduction_lo"], table["spares"]["reduction_hi"]
    assert 0 < lo <= hi <= 1 and table["spares"]["reduction"] > 0


def _one_fault(kind: str = PRECURSOR, repair_s: float = 10 * HOUR):
    cfg = ReplayConfig(nodes=2, nodes_per_job=1, spares=1)
    return cfg, [[Incident(HOUR, HOUR + repair_s, kind)], []]


def test_a_foreseen_fault_costs_checkpoint_and_move_instead_of_lost_work() -> None:
    cfg, slots = _one_fault()
    g, c = cfg.costs().gang_gpus, cfg.costs()
    seen = replay(slots, cfg, Strategy("p", 1, SEER), T, draws=[[0.5], []], false_alarms=[0, 0])
    assert seen.foreseen == 1 and seen.unplanned_gpu_s == 0
    assert seen.planned_gpu_s == pytest.approx(g * (c.checkpoint_s + c.migrate_s))
    assert replay(slots, cfg, Strategy("p", 1, SEER), T).foreseen == 0  # nothing drawn
    unseen = replay(
        slots, cfg, Strategy("p", 1, Predictor("half", {PRECURSOR: 0.4})), T, draws=[[0.5], []]
    )
    assert unseen.missed == 1 and unseen.planned_gpu_s == 0
    assert unseen.unplanned_gpu_s == pytest.approx(g * ((T + c.checkpoint_s) / 2 + c.restart_s))
    # Non-GPU faults are never foreseen; false alarms cost C + M each.
    cfg2, slots2 = _one_fault(UNWATCHED)
    out = replay(slots2, cfg2, Strategy("p", 1, SEER), T, draws=[[0.0], []], false_alarms=[2, 1])
    assert out.foreseen == 0 and out.false_alarms == 3
    assert out.planned_gpu_s == pytest.approx(3 * g * (c.checkpoint_s + c.migrate_s))


def test_spares_cut_waiting_for_repair() -> None:
    cfg = ReplayConfig(nodes=3, nodes_per_job=1, spares=1)
    g = cfg.costs().gang_gpus
    slots = [[Incident(0.0, 10 * HOUR, ABRUPT)], [Incident(HOUR, 11 * HOUR, ABRUPT)], []]
    reactive = replay(slots, cfg, Strategy("reactive", 0), T)
    assert reactive.wait_gpu_s == pytest.approx(g * 20 * HOUR)  # both wait for their repair
    one = replay(slots, cfg, Strategy("spares", 1), T)
    # The first takes the spare; the second waits for the first node back (9 h < 10 h).
    assert one.wait_gpu_s == pytest.approx(g * 9 * HOUR)
    two = replay(slots, cfg, Strategy("spares", 2), T)
    assert two.wait_gpu_s == 0 and two.unplanned_gpu_s < one.unplanned_gpu_s
    capped = replay(
        slots, ReplayConfig(nodes=3, nodes_per_job=1, reschedule_s=HOUR), Strategy("r", 0), T
    )
    assert capped.wait_gpu_s == pytest.approx(g * 2 * HOUR)


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of nodes_per_job"):
        ReplayConfig(nodes=10, nodes_per_job=3)
    with pytest.raises(ValueError, match="spares"):
        ReplayConfig(spares=-1)
    with pytest.raises(ValueError, match="fault_set"):
        node_incidents([], "nic")
    with pytest.raises(ValueError, match="recall"):
        Predictor("x", {UNWATCHED: 0.5})
    with pytest.raises(ValueError, match="slots"):
        replay([[]], ReplayConfig(), Strategy("r", 0), T)
