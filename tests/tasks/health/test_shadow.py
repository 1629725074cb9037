from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.health.decision import DeviceCosts, JobCosts, decide
from gpuflow.tasks.health.features import FEATURES, WINDOW_BUCKETS
from gpuflow.tasks.health.monitor import IncidentBook, apply_round, monitor_dir, run_monitor
from gpuflow.tasks.health.rules import RuleModel
from gpuflow.tasks.health.shadow import (
    SCORECARD,
    SHADOW_BOOK,
    Scorecard,
    record_only,
    scorecard_rows,
)

from tests.helpers.health_risks import risks


class Pair:
    """Champion and challenger books, judged at the drain level (no costs), one round at a
    time, into one scorecard."""

    def __init__(self, tmp: Path) -> None:
        self.books = {
            "champion": IncidentBook(tmp / "c.json"),
            "challenger": IncidentBook(tmp / "s.json"),
        }
        self.card = Scorecard("rules [x v1]", "lstm [x v2]", since_s=0.0, lead_min_s=300.0)
        self.events: list[str] = []

    def round(self, now_s: float, champion: dict, challenger: dict, costs=None) -> None:
        def emit(node, index, *_a, **_k) -> str:
            self.events.append(f"{node}:{index}")
            return "ev"

        rounds = {}
        for role, by_key, sink in (
            ("champion", champion, emit),
            ("challenger", challenger, record_only),
        ):
            before = dict(self.books[role].open)
            report = apply_round(
                risks(**by_key), self.books[role], 0.85, 0.68, sink, now_s, costs=costs
            )
            rounds[role] = (before, report)
        self.card.observe(risks(**champion), rounds, now_s)


def test_the_scorecard_credits_whoever_warned_in_time(tmp_path: Path) -> None:
    p = Pair(tmp_path)
    # t=0: only the challenger raises an alarm on n:0, and one on n:1.
    p.round(0.0, {"n_0": 0.1, "n_1": 0.1, "n_2": 0.1}, {"n_0": 0.9, "n_1": 0.9, "n_2": 0.1})
    # t=600: the champion raises one on n:2, which fails 60 s later: too late to checkpoint.
    p.round(600.0, {"n_0": 0.1, "n_1": 0.1, "n_2": 0.9}, {"n_0": 0.9, "n_1": 0.9, "n_2": 0.1})
    # t=660: n:0 falls off the bus (the challenger warned 660 s before), and n:2 fails.
    p.round(660.0, {"n_0": "lost", "n_1": 0.1, "n_2": "lost"}, {"n_0": 0.9, "n_1": 0.9, "n_2": 0.1})
    # Still lost a round later: the same failure, not a new one.
    p.round(720.0, {"n_0": "lost", "n_1": 0.1, "n_2": "lost"}, {"n_0": 0.9, "n_1": 0.1, "n_2": 0.1})
    s = p.card.summary()
    assert s["failures"] == 2
    assert (s["champion"]["alarms"], s["champion"]["warned"]) == (1, 0)  # n:2 at 60 s lead
    assert (s["challenger"]["alarms"], s["challenger"]["warned"]) == (2, 1)
    assert s["challenger"]["lead_p50_min"] == pytest.approx(11.0)
    # n:1's alarm closed (its risk fell) with no failure under it: a false alarm.
    assert s["challenger"]["closed_without_failure"] == 1
    # Repaired: n:0 and n:2 answer again, healthy; their incidents close, none counted false
    # (a failure came under them), and a later failure of n:0 is a new one.
    p.round(800.0, {"n_0": 0.1, "n_1": 0.1, "n_2": 0.1}, {"n_0": 0.1, "n_1": 0.1, "n_2": 0.1})
    s = p.card.summary()
    assert s["champion"]["closed_without_failure"] == 0
    assert s["challenger"]["closed_without_failure"] == 1
    p.round(900.0, {"n_0": "lost", "n_1": 0.1, "n_2": 0.1}, {"n_0": 0.1, "n_1": 0.1, "n_2": 0.1})
    assert p.card.summary()["failures"] == 3
    # Only the champion's decisions were emitted: its alarm on n:2, and the failures'.
    assert sorted(p.events) == ["n:0", "n:0", "n:2"]
    rows = scorecard_rows(p.card.summary())
    assert [(r["role"], r["model"]) for r in rows] == [
        ("champion", "rules [x v1]"),
        ("challenger", "lstm [x v2]"),
    ]


def test_the_scorecard_prices_alarms_and_warned_failures_as_the_decisions_did(
    tmp_path: Path,
) -> None:
    gang = DeviceCosts((JobCosts("big", 64, 3600.0, 120.0, 600.0, 300.0),), room_elsewhere=True)
    costs = lambda node, index: gang  # noqa: E731 - every device runs the big gang
    p = Pair(tmp_path)
    # The challenger acts on n:0 and n:1 (risk 0.2, far above the big gang's break-even);
    # the champion on neither. n:0 fails 20 minutes later; n:1 never does.
    p.round(0.0, {"n_0": 0.0, "n_1": 0.0}, {"n_0": 0.2, "n_1": 0.2}, costs)
    p.round(1200.0, {"n_0": "lost", "n_1": 0.0}, {"n_0": 0.2, "n_1": 0.2}, costs)
    decided = decide(0.2, 1800.0, gang)
    assert decided.action == "act"
    s = p.card.summary()
    ch, champ = s["challenger"], s["champion"]
    assert ch["act_cost_gpu_h"] == pytest.approx(2 * decided.act_cost_gpu_s / 3600, abs=1e-3)
    assert ch["saved_gpu_h"] == pytest.approx(decided.failure_cost_gpu_s / 3600, abs=1e-3)
    assert ch["net_gpu_h"] == pytest.approx(ch["saved_gpu_h"] - ch["act_cost_gpu_h"], abs=2e-3)
    assert ch["net_gpu_h"] > 0  # one failure of a 64-GPU gang outweighs two moves
    assert (champ["alarms"], champ["saved_gpu_h"], champ["net_gpu_h"]) == (0, 0.0, 0.0)


def test_a_new_pair_or_a_damaged_file_starts_a_new_scorecard(tmp_path: Path) -> None:
    path = tmp_path / SCORECARD
    card = Scorecard("a", "b", since_s=5.0)
    card.failures = 4
    card.roles["challenger"].alarms = 7
    card.save(path)
    again, fresh = Scorecard.load(path, "a", "b", now_s=99.0, lead_min_s=card.lead_min_s)
    assert (again.since_s, again.failures, again.roles["challenger"].alarms) == (5.0, 4, 7)
    assert not fresh
    other, fresh = Scorecard.load(path, "a", "c", now_s=99.0, lead_min_s=card.lead_min_s)
    assert (other.since_s, other.failures, other.roles["challenger"].alarms) == (99.0, 0, 0)
    assert fresh
    path.write_text("{not json")
    assert Scorecard.load(path, "a", "b", now_s=7.0, lead_min_s=300.0)[0].since_s == 7.0


class RemapOnly(RuleModel):
    """A second model for the monitor: fires on a pending remap only (not on XIDs or heat)."""

    name = "remap-only"

    def predict_risk(self, windows: np.ndarray) -> np.ndarray:
        return (windows[:, -1, FEATURES.index("remap_pending")] > 0.5).astype(np.float32)


class Recorder:
    def __init__(self) -> None:
        self.devices: list[str] = []

    def __call__(self, node, index, *_a, **_k) -> str:
        self.devices.append(f"{node}:{index}")
        return f"ev-{len(self.devices)}"


def test_the_monitor_scores_the_challenger_in_shadow_and_acts_on_the_champion_only() -> None:
    twin = SimBackend()
    emit = Recorder()
    run_monitor(
        twin, RuleModel(WINDOW_BUCKETS), rounds=1, interval_s=5.0, wait=twin.advance, emit=emit
    )
    twin.inject_fault("a100-1", 3, "remap-pending")
    twin.inject_fault("v100-0", 2, "xid79")
    out = run_monitor(
        twin,
        RuleModel(WINDOW_BUCKETS),
        rounds=3,
        interval_s=5.0,
        wait=twin.advance,
        emit=emit,
        challenger=RemapOnly(WINDOW_BUCKETS),
        challenger_name="remap-only [test]",
    )
    # One event per incident, the champion's: the remap and the lost device.
    assert sorted(emit.devices) == ["a100-1:3", "v100-0:2"]
    shadow = out.shadow
    assert shadow is not None and shadow["model"] == "remap-only [test]"
    # The challenger decided the same devices into its own book, and emitted nothing.
    assert sorted(e["device"] for e in shadow["emitted"]) == ["a100-1:3", "v100-0:2"]
    assert all(e["event_id"].startswith("shadow-") for e in shadow["emitted"])
    state = monitor_dir()
    book = json.loads((state / SHADOW_BOOK).read_text())["open"]
    assert book["a100-1:3"]["decision"]["model"] == "remap-only [test]"
    card = shadow["scorecard"]
    assert card["failures"] == 1  # the lost V100; neither warned of an abrupt XID 79
    assert card["champion"]["alarms"] == card["challenger"]["alarms"] == 1
    assert card["champion"]["warned"] == card["challenger"]["warned"] == 0
    # Another challenger starts its own record: the last one's open incidents are not its.
    other = run_monitor(
        twin,
        RuleModel(WINDOW_BUCKETS),
        rounds=1,
        interval_s=5.0,
        emit=emit,
        challenger=RemapOnly(WINDOW_BUCKETS),
        challenger_name="remap-only [test v2]",
    )
    assert other.shadow["scorecard"]["challenger"]["model"] == "remap-only [test v2]"
    assert sorted(e["device"] for e in other.shadow["emitted"]) == ["a100-1:3", "v100-0:2"]
    assert other.shadow["scorecard"]["challenger"]["alarms"] == 1
    # Without a challenger the monitor keeps no shadow.
    plain = run_monitor(twin, RuleModel(WINDOW_BUCKETS), rounds=1, interval_s=5.0, emit=emit)
    assert plain.shadow is None


def test_a_challenger_that_reads_other_windows_is_refused_before_any_round() -> None:
    twin = SimBackend()
    with pytest.raises(ValueError, match="buckets"):
        run_monitor(twin, RuleModel(WINDOW_BUCKETS), rounds=1, challenger=RuleModel(3))
    assert not (monitor_dir() / "incidents.json").exists()


def _monitor_in_a_process(home: str, gate_dir: str, role: str, events: mp.Queue) -> None:
    """One monitor process: the twin with a pending remap, the champion and a challenger.
    ``first`` stops inside its first round (after scoring, before the incidents are
    written) until the test opens the gate; ``second`` runs a round straight through."""
    import os
    import time

    os.environ["GPUFLOW_HOME"] = home
    gate = Path(gate_dir)
    twin = SimBackend()
    twin.inject_fault("a100-1", 3, "remap-pending")
    twin.advance(5.0)

    def costs():
        if role == "first":
            (gate / "first-in-round").touch()
            while not (gate / "open").exists():
                time.sleep(0.02)
        return lambda _n, _i: DeviceCosts()  # idle devices: the drain level decides

    if role == "second":
        (gate / "second-started").touch()
    out = run_monitor(
        twin,
        RuleModel(WINDOW_BUCKETS),
        rounds=1,
        emit=lambda n, i, *_a, **_k: events.put((role, f"{n}:{i}")) or "ev",
        costs=costs,
        challenger=RemapOnly(WINDOW_BUCKETS),
    )
    events.put((role, "shadow", len(out.shadow["emitted"])))


def test_two_monitor_processes_at_once_raise_each_incident_once(tmp_path: Path) -> None:
    """The lock covers the champion's book, the challenger's and the scorecard: a second
    monitor that starts while the first is inside a round waits for it, then continues
    its incidents instead of raising them again."""
    ctx = mp.get_context("spawn")
    events = ctx.Queue()
    home = tmp_path / "home"
    gate = tmp_path / "gate"
    gate.mkdir()
    first = ctx.Process(target=_monitor_in_a_process, args=(str(home), str(gate), "first", events))
    first.start()
    try:
        for _ in range(3000):  # the first is inside its round, holding the lock
            if (gate / "first-in-round").exists():
                break
            first.join(0.02)
        assert (gate / "first-in-round").exists(), "the first monitor never reached its round"
        second = ctx.Process(
            target=_monitor_in_a_process, args=(str(home), str(gate), "second", events)
        )
        second.start()
        for _ in range(3000):
            if (gate / "second-started").exists():
                break
            second.join(0.02)
        (gate / "open").touch()
        first.join(120)
        second.join(120)
    finally:
        (gate / "open").touch()
        for p in (first, second) if "second" in locals() else (first,):
            if p.is_alive():
                p.kill()
    assert first.exitcode == 0 and second.exitcode == 0
    got = [events.get(timeout=10) for _ in range(3)]
    assert events.empty()
    raised = [e for e in got if len(e) == 2]
    shadow = {e[0]: e[2] for e in got if len(e) == 3}
    assert raised == [("first", "a100-1:3")]  # the second continued the open incident
    assert shadow == {"first": 1, "second": 0}
    card = json.loads((home / "health" / "monitor" / SCORECARD).read_text())
    assert card["roles"]["champion"]["alarms"] == card["roles"]["challenger"]["alarms"] == 1
