"""What acting on a device costs, read from the inventory (tasks.remediation.costs), and
the monitor deciding with it on the twin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gpuflow.hardware.inventory import Inventory
from gpuflow.tasks.health.decision import CostDefaults, decide
from gpuflow.tasks.health.features import FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.monitor import run_monitor
from gpuflow.tasks.remediation.costs import FleetCosts

from tests.tasks.remediation.helpers import A100, fill, make_cluster


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class ConstantModel:
    """Every device at the same risk of failing within 30 minutes."""

    window = WINDOW_BUCKETS
    feature_names = FEATURES
    horizon_s = 1800.0

    def __init__(self, risk: float) -> None:
        self.risk = risk

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        return np.full(len(windows), self.risk, dtype=np.float32)


@pytest.fixture
def fleet(gpuflow_home: Path):
    """The quiet twin with three running jobs, on an inventory whose clock the test moves:
    a 2-GPU gang on a100-0 an hour after a requested checkpoint that took 30 s, a job on
    a100-1:0 whose loop recorded a checkpoint 10 minutes ago, and a job on the V100 with
    no checkpoint yet, started 50 s ago."""
    cluster = make_cluster(gpuflow_home)
    clock = Clock(1_000_000.0)
    inv = Inventory(None, now=clock)
    a0, a1 = inv.devices("a100-0")
    b0 = inv.devices("a100-1")[0]
    v0 = inv.devices("v100-0")[0]
    inv.record_job("gang", {}, "running", [a0.uuid, a1.uuid])
    ask = inv.request_control("gang", "checkpoint-now")
    clock.t += 30.0
    inv.ack_control(ask, "step-000000100")
    inv.record_job("solo", {}, "running", [b0.uuid])
    clock.t += 3000.0
    inv.transition_job("solo", last_checkpoint_id="step-000000050")
    clock.t += 550.0
    inv.record_job("fresh", {}, "running", [v0.uuid])
    clock.t += 50.0
    return cluster, inv, clock


def test_a_jobs_own_numbers_are_used_and_their_sources_named(fleet) -> None:
    _, inv, clock = fleet
    costs = FleetCosts(inv, now=clock)
    gang = costs("a100-0", 0)
    assert costs("a100-0", 1).jobs == gang.jobs  # both devices of the gang
    (job,) = gang.jobs
    assert (job.job_id, job.gang_gpus) == ("gang", 2)
    assert job.since_checkpoint_s == pytest.approx(3600.0)
    assert job.sources["since_checkpoint_s"].startswith("measured: checkpoint step-000000100")
    assert job.checkpoint_save_s == pytest.approx(30.0)
    assert job.sources["checkpoint_save_s"].startswith("measured: median of 1")
    assert job.restart_s == CostDefaults().restart_s and "default" in job.sources["restart_s"]
    assert gang.room_elsewhere is True  # a100-1:1 is free, and the spare node
    (solo,) = costs("a100-1", 0).jobs
    assert solo.since_checkpoint_s == pytest.approx(600.0)
    assert "lower bound" in solo.sources["since_checkpoint_s"]
    assert solo.checkpoint_save_s == CostDefaults().checkpoint_save_s
    assert "default" in solo.sources["checkpoint_save_s"]
    (fresh,) = costs("v100-0", 0).jobs
    assert fresh.since_checkpoint_s == pytest.approx(50.0)
    assert "no checkpoint yet" in fresh.sources["since_checkpoint_s"]
    idle = costs("a100-1", 1)
    assert idle.jobs == () and idle.room_elsewhere is None
    assert decide(0.5, 1800.0, idle).action == "watch"


def test_the_clusters_cordon_cost_reaches_every_device(fleet) -> None:
    _, inv, clock = fleet
    priced = FleetCosts(inv, CostDefaults(cordon_hold_s=7200.0, cordon_price=0.5), now=clock)
    assert priced("a100-0", 0).cordon_gpu_s == 3600.0
    assert FleetCosts(inv, now=clock)("a100-0", 0).cordon_gpu_s == 0.0
    # Priced, the same gang is acted on only at a higher risk.
    unpriced_be = decide(0.0, 1800.0, FleetCosts(inv, now=clock)("a100-0", 0)).break_even_risk
    assert decide(0.0, 1800.0, priced("a100-0", 0)).break_even_risk > unpriced_be


def test_no_room_anywhere_is_seen(fleet) -> None:
    _, inv, clock = fleet
    inv.set_node_role("a100-spare-0", "active")
    fill(inv, A100)
    assert FleetCosts(inv, now=clock)("a100-0", 0).room_elsewhere is False


def test_the_monitor_acts_by_cost_on_the_twin(fleet, tmp_path: Path) -> None:
    """At one risk (0.25) for every device: the gang an hour after its checkpoint and the
    job 10 minutes after its own are acted on, the job that just started is watched
    (acting costs more than it could lose), idle devices are left alone."""
    cluster, inv, clock = fleet
    backend = cluster.get_backend()
    sent: list[dict] = []

    def emit(node, index, risk, features, sku, reason="model", missing=(), **decided) -> str:
        sent.append({"device": f"{node}:{index}", **decided})
        return f"ev-{len(sent)}"

    out = run_monitor(
        backend,
        ConstantModel(0.25),
        rounds=1,
        interval_s=5.0,
        wait=backend.advance,
        emit=emit,
        state_dir=tmp_path / "monitor",
        costs=lambda: FleetCosts(inv, now=clock),
        model_name="constant",
    )
    acted = sorted(e["device"] for e in out.emitted)
    assert acted == ["a100-0:0", "a100-0:1", "a100-1:0"]
    assert {e["action"] for e in out.emitted} == {"act"}
    assert {e["model"] for e in out.emitted} == {"constant"}
    gang = next(e for e in out.emitted if e["device"] == "a100-0:0")
    assert gang["break_even_risk"] == pytest.approx((30 + 300) / (3600 + 900 + 600), abs=1e-4)
    assert sent[0]["decision"].jobs[0]["sources"]["checkpoint_save_s"].startswith("measured")
    assert out.open_incidents["a100-1:0"]["decision"]["jobs"][0]["job_id"] == "solo"
