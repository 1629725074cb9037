from __future__ import annotations

from pathlib import Path

import pytest
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.health.baselines import RuleModel
from gpuflow.tasks.health.decision import DeviceCosts, JobCosts
from gpuflow.tasks.health.events import DEVICE_LOST_REASON, health_risk_payload
from gpuflow.tasks.health.features import WINDOW_BUCKETS
from gpuflow.tasks.health.monitor import (
    IncidentBook,
    apply_round,
    monitor_dir,
    run_monitor,
    validate_thresholds,
)

from tests.helpers.health_risks import risks


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(
        self, node, index, risk, features, sku, reason="model", missing=(), **decided
    ) -> str:
        self.calls.append((node, index, risk, reason))
        self.missing = tuple(missing)
        self.decided = decided  # horizon_s and the decision
        return f"ev-{len(self.calls)}"


def test_one_event_per_incident(tmp_path: Path) -> None:
    book = IncidentBook(tmp_path / "inc.json")
    emit = Recorder()
    r = apply_round(risks(n_0=0.9, n_1=0.1), book, 0.85, 0.68, emit)
    assert [e["device"] for e in r.emitted] == ["n:0"]
    # still risky, or hovering between the clear threshold and the threshold: no new event
    for level in (0.95, 0.7, 0.86):
        assert not apply_round(risks(n_0=level, n_1=0.1), book, 0.85, 0.68, emit).emitted
    # drops below the clear threshold: closed; risky again: a new event
    r = apply_round(risks(n_0=0.5, n_1=0.1), book, 0.85, 0.68, emit)
    assert r.cleared == ["n:0"] and not book.open
    assert apply_round(risks(n_0=0.9, n_1=0.1), book, 0.85, 0.68, emit).emitted
    assert len(emit.calls) == 2
    # the book survives a restart
    book.save()
    again = IncidentBook(tmp_path / "inc.json")
    assert not apply_round(risks(n_0=0.9, n_1=0.1), again, 0.85, 0.68, emit).emitted


def test_lost_device_until_repaired(tmp_path: Path) -> None:
    book = IncidentBook(tmp_path / "inc.json")
    emit = Recorder()
    r = apply_round(risks(n_0="lost"), book, 0.85, 0.68, emit)
    assert r.emitted[0]["reason"] == DEVICE_LOST_REASON
    assert not apply_round(risks(n_0="lost"), book, 0.85, 0.68, emit).emitted
    # back (repaired) and healthy: the incident closes
    r = apply_round(risks(n_0=0.01), book, 0.85, 0.68, emit)
    assert r.cleared == ["n:0"] and not r.emitted
    # a device that leaves the fleet closes its incident too
    apply_round(risks(n_0="lost"), book, 0.85, 0.68, emit)
    assert apply_round(risks(n_1=0.0), book, 0.85, 0.68, emit).cleared == ["n:0"]


@pytest.mark.parametrize("t,c", [(0.0, None), (1.2, None), (0.8, 0.9), (0.8, -0.1), ("x", None)])
def test_threshold_validation(t: object, c: object) -> None:
    with pytest.raises(ValueError, match="threshold"):
        validate_thresholds(t, c)  # type: ignore[arg-type]
    assert validate_thresholds(0.85, None) == (0.85, pytest.approx(0.68))


def test_damaged_book_starts_empty(tmp_path: Path) -> None:
    p = tmp_path / "inc.json"
    p.write_text("{not json")
    assert IncidentBook(p).open == {}


def test_monitor_runs_continue_and_do_not_repeat() -> None:
    twin = SimBackend()
    model = RuleModel(WINDOW_BUCKETS)
    emit = Recorder()
    first = run_monitor(twin, model, rounds=3, interval_s=5.0, wait=twin.advance, emit=emit)
    assert first.emitted == [] and first.devices == len(twin.devices())
    twin.inject_fault("a100-1", 3, "remap-pending")
    twin.inject_fault("v100-0", 2, "xid79")
    second = run_monitor(twin, model, rounds=4, interval_s=5.0, wait=twin.advance, emit=emit)
    assert sorted(e["device"] for e in second.emitted) == ["a100-1:3", "v100-0:2"]
    lost = next(e for e in second.emitted if e["device"] == "v100-0:2")
    assert lost["reason"] == DEVICE_LOST_REASON and lost["risk"] == 1.0
    # the next run continues the incidents: no event again
    third = run_monitor(twin, model, rounds=2, interval_s=5.0, wait=twin.advance, emit=emit)
    assert third.emitted == []
    assert set(third.open_incidents) == {"a100-1:3", "v100-0:2"}
    assert len(emit.calls) == 2
    # the windows were persisted and picked up again (7 + 2 samples a device)
    state = monitor_dir()
    assert (state / "windows.npz").exists() and (state / "incidents.json").exists()
    # repaired: the lost device answers again and its incident closes
    twin.repair("v100-0", 2)
    fourth = run_monitor(twin, model, rounds=1, interval_s=5.0, wait=twin.advance, emit=emit)
    assert "v100-0:2" in fourth.cleared and "v100-0:2" not in fourth.open_incidents


def test_monitor_refuses_bad_parameters_before_sampling() -> None:
    twin = SimBackend()
    with pytest.raises(ValueError, match="interval_s"):
        run_monitor(twin, RuleModel(WINDOW_BUCKETS), rounds=1, interval_s=1.0)
    with pytest.raises(ValueError, match="rounds"):
        run_monitor(twin, RuleModel(WINDOW_BUCKETS), rounds=0)
    assert not (monitor_dir() / "incidents.json").exists()


def test_a_failed_device_is_one_incident_until_repaired() -> None:
    twin = SimBackend()
    model = RuleModel(WINDOW_BUCKETS)
    emit = Recorder()
    twin.inject_fault("a100-0", 0, "ecc-uncorrectable")
    out = run_monitor(twin, model, rounds=3, interval_s=5.0, wait=twin.advance, emit=emit)
    assert [e["device"] for e in out.emitted] == ["a100-0:0"]
    assert out.emitted[0]["reason"].startswith("device failed")
    out = run_monitor(twin, model, rounds=2, interval_s=5.0, wait=twin.advance, emit=emit)
    assert out.emitted == [] and "a100-0:0" in out.open_incidents
    twin.repair("a100-0", 0)
    out = run_monitor(twin, model, rounds=1, interval_s=5.0, wait=twin.advance, emit=emit)
    assert "a100-0:0" in out.cleared and len(emit.calls) == 1


BIG_GANG = DeviceCosts((JobCosts("big", 64, 3600.0, 120.0, 600.0, 300.0),), room_elsewhere=True)


def lookup(**by_key: DeviceCosts):
    """A round's cost look-up: the given devices' costs, every other device idle."""
    return lambda node, index: by_key.get(f"{node}_{index}", DeviceCosts())


def test_the_cost_rule_opens_an_incident_far_below_the_drain_level(tmp_path: Path) -> None:
    book = IncidentBook(tmp_path / "inc.json")
    emit = Recorder()
    costs = lookup(n_0=BIG_GANG)  # n:1 is idle
    r = apply_round(risks(n_0=0.12, n_1=0.12), book, 0.85, 0.68, emit, costs=costs, model="m@1")
    assert [e["device"] for e in r.emitted] == ["n:0"]
    e = r.emitted[0]
    assert (e["action"], e["model"], e["horizon_s"], e["decided_by"]) == (
        "act",
        "m@1",
        1800.0,
        "cost rule",
    )
    assert e["break_even_risk"] == pytest.approx(420 / 5100, abs=1e-5) and e["drain_risk"] == 0.85
    assert e["expected_loss_gpu_s"] > e["act_cost_gpu_s"] > 0
    assert "m@1" in e["decision"] and "30 min" in e["decision"]
    # The idle device was decided too, and left alone.
    assert r.decisions["n:1"].action == "watch" and "idle" in r.decisions["n:1"].why
    # What the emitter got makes a valid event payload, decision included.
    payload = health_risk_payload("n", 0, 0.12, {}, "sku", **emit.decided)
    assert payload["decision"]["action"] == "act" and payload["decision"]["jobs"]
    # Hysteresis around the break-even (0.082): open down to 80 % of it, then closed.
    assert not apply_round(risks(n_0=0.07), book, 0.85, 0.68, emit, costs=costs).cleared
    assert apply_round(risks(n_0=0.05), book, 0.85, 0.68, emit, costs=costs).cleared == ["n:0"]
    assert len(emit.calls) == 1


def test_without_costs_the_drain_level_alone_decides(tmp_path: Path) -> None:
    book = IncidentBook(tmp_path / "inc.json")
    emit = Recorder()
    r = apply_round(risks(n_0=0.5, n_1=0.9), book, 0.85, 0.68, emit)
    assert [(e["device"], e["action"]) for e in r.emitted] == [("n:1", "drain-now")]
    assert "not looked up" in r.decisions["n:0"].why
    assert book.open["n:1"]["decision"]["decided_by"] == "drain level"
