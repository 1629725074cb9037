"""The monitor's work: sample -> score -> decide -> emit, one event per device per incident.

State under GPUFLOW_HOME/health/monitor/ so consecutive runs (a deployment on an interval
schedule) continue: ``windows.npz`` (every device's feature window) and
``incidents.json`` (the open incidents: which devices already had their event). Every
round each device's risk goes through the decision rule (tasks.health.decision) with the
costs of what runs on it: an incident opens when the rule says ``act`` (the expected loss
exceeds the cost of checkpoint + migration) or ``drain-now`` (risk at or above the drain
level, ``threshold``, 0.85; or the device lost / failed), and emits
``gpuflow.device.health-risk`` once, carrying the decision. It closes when the risk falls
below its clear level (hysteresis, so a risk hovering at the level that opened it does
not emit on every run): CLEAR_RATIO x the break-even risk for an ``act`` incident, the
clear threshold for a ``drain-now`` one; or when a lost device answers again (repaired);
only then can the device emit again. A lock file keeps two monitor runs from
interleaving their state.

A challenger, when given, is scored in shadow on the same windows and decided by the same
rule into a book of its own: its decisions are recorded, never emitted (tasks.health.shadow,
which also keeps the scorecard that compares the two).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuflow.hardware.backend import Backend
from gpuflow.hardware.home import gpuflow_home, replace_atomically
from gpuflow.tasks.health.decision import DRAIN_RISK, Decision, DeviceCosts, decide
from gpuflow.tasks.health.events import DEVICE_LOST_REASON, DeviceRisk, emit_health_risk
from gpuflow.tasks.health.fleet_windows import FleetWindows
from gpuflow.tasks.health.horizons import DEFAULT_LEAD_MIN_S
from gpuflow.tasks.health.registry import RULES_URI as RULES_URI  # callers import it from here
from gpuflow.tasks.health.registry import load_challenger, load_health_model
from gpuflow.tasks.health.sampler import (
    DEFAULT_INTERVAL_S,
    FleetSample,
    TelemetrySampler,
    validate_interval_s,
)
from gpuflow.tasks.health.scoring import DEVICE_FAILED_REASON, FleetScorer, max_clocks
from gpuflow.tasks.health.shadow import SCORECARD, SHADOW_BOOK, Scorecard, record_only
from prefect import task
from prefect.cache_policies import NONE

if TYPE_CHECKING:
    # A type only: importing the module would load torch and sklearn (seconds).
    from gpuflow.tasks.health.model import HealthModel

DEFAULT_THRESHOLD = DRAIN_RISK  # the drain-at-once level, whatever the costs
CLEAR_RATIO = 0.8  # default clear threshold: 80 % of the level that opened the incident

# Top features (occlusion: one extra model pass per feature) are worked out for devices
# at or above this risk only, so a fleet of thousands stays cheap; the cost rule acts from
# about 1 % for a job at its Young/Daly checkpoint period (tasks.health.decision), so an
# event raised by it has them unless the job went a day without a checkpoint.
EXPLAIN_ABOVE = 0.005

# The costs of acting on a device, by (node, index). One is made per round (the jobs move).
CostLookup = Callable[[str, int], DeviceCosts]


def monitor_dir(home: Path | None = None) -> Path:
    return (home or gpuflow_home()) / "health" / "monitor"


def validate_thresholds(threshold: float, clear_threshold: float | None) -> tuple[float, float]:
    """(threshold, clear threshold); clear defaults to CLEAR_RATIO x threshold."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float):
        raise ValueError(f"threshold must be a number in (0, 1], got {threshold!r}")
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    clear = threshold * CLEAR_RATIO if clear_threshold is None else clear_threshold
    if (
        isinstance(clear, bool)
        or not isinstance(clear, int | float)
        or not 0.0 <= clear <= threshold
    ):
        raise ValueError(
            f"clear_threshold must be in [0, threshold={threshold}], got {clear_threshold!r}"
        )
    return float(threshold), float(clear)


class IncidentBook:
    """Open incidents per device (``node:index``), saved as JSON."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.open: dict[str, dict[str, Any]] = {}
        if self.path.exists():
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
                self.open = dict(data.get("open", {}))
            except (json.JSONDecodeError, AttributeError):
                self.open = {}  # a damaged book: at worst one event is sent again

    def save(self) -> None:
        text = json.dumps({"open": self.open}, indent=1, sort_keys=True)
        replace_atomically(self.path, text.encode("utf-8"), ".incidents-")


@dataclass
class RoundReport:
    risks: list[DeviceRisk]
    emitted: list[dict[str, Any]] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    decisions: dict[str, Decision] = field(default_factory=dict)  # devices decided this round
    shadow: RoundReport | None = None  # the challenger's round, when one is scored


def _forced(r: DeviceRisk) -> str | None:
    """Why the device must be drained whatever its risk says: lost or failed, else None."""
    if r.reason == DEVICE_LOST_REASON or r.reason.startswith(DEVICE_FAILED_REASON):
        return r.reason
    return None


def decision_for(
    r: DeviceRisk,
    threshold: float,
    costs: CostLookup | None,
    model: str = "",
    *,
    always_look_up: bool = False,
) -> Decision:
    """The rule's decision for one scored device. No ``costs``: the jobs are unknown, so
    the drain level alone decides (as for an idle device). A risk of 0 cannot outweigh
    any cost, so the monitor skips its look-up (a fleet is mostly such devices) unless
    ``always_look_up`` (`gpuflow health decide` shows the numbers anyway)."""
    if costs is None:
        looked = None
    elif r.risk > 0 or always_look_up:
        looked = costs(r.node, r.index)
    else:
        looked = DeviceCosts(jobs_known=False, note="risk 0: costs not looked up")
    return decide(r.risk, r.horizon_s, looked, model=model, drain_risk=threshold, forced=_forced(r))


def apply_round(
    risks: list[DeviceRisk],
    book: IncidentBook,
    threshold: float,
    clear_threshold: float,
    emit: Callable[..., str] = emit_health_risk,
    now_s: float | None = None,
    costs: CostLookup | None = None,
    model: str = "",
) -> RoundReport:
    """Open / close incidents for one round of risks; emit for the newly opened.

    ``threshold`` is the drain level; ``costs`` the round's cost look-up (None: the drain
    level alone decides); ``model`` names the model that scored the risks."""
    now_s = time.time() if now_s is None else now_s
    report = RoundReport(risks)
    seen = set()
    for r in risks:
        key = f"{r.node}:{r.index}"
        seen.add(key)
        inc = book.open.get(key)
        if inc is not None:
            lost_now = r.reason == DEVICE_LOST_REASON
            if inc["reason"] == DEVICE_LOST_REASON and not lost_now:
                # It answers again: repaired. A fresh incident may open below.
                book.open.pop(key)
                report.cleared.append(key)
                inc = None
            elif not _forced(r) and r.risk < inc.get("clear_below", clear_threshold):
                book.open.pop(key)
                report.cleared.append(key)
                continue
            else:
                inc["last_risk"] = r.risk
                inc["last_seen_s"] = now_s
                continue
        decision = decision_for(r, threshold, costs, model)
        report.decisions[key] = decision
        if not decision.remediates:
            continue
        event_id = emit(
            r.node,
            r.index,
            r.risk,
            r.top_features,
            r.sku,
            reason=r.reason,
            missing=r.missing,
            horizon_s=r.horizon_s,
            decision=decision,
        )
        # Hysteresis around the level that opened it: the break-even risk or the drain
        # level (an explicit clear threshold is the drain level's).
        clear_below = (
            clear_threshold
            if decision.level >= threshold
            else min(clear_threshold, CLEAR_RATIO * decision.level)
        )
        book.open[key] = {
            "event_id": event_id,
            "opened_s": now_s,
            "risk": r.risk,
            "last_risk": r.risk,
            "last_seen_s": now_s,
            "reason": r.reason,
            "sku": r.sku,
            "top_features": r.top_features,
            "missing": list(r.missing),
            "clear_below": clear_below,
            "decision": decision.to_dict(),
        }
        report.emitted.append(
            {
                "device": key,
                "event_id": event_id,
                "risk": r.risk,
                "horizon_s": r.horizon_s,
                "reason": r.reason,
                "top_features": r.top_features,
                "action": decision.action,
                "model": decision.model,
                "break_even_risk": decision.break_even_risk,
                "drain_risk": decision.drain_risk,
                "expected_loss_gpu_s": decision.expected_loss_gpu_s,
                "act_cost_gpu_s": decision.act_cost_gpu_s,
                "failure_cost_gpu_s": decision.failure_cost_gpu_s,
                "decided_by": decision.decided_by,
                "decision": decision.summary(),
            }
        )
    # Devices that left the fleet (decommissioned, twin reset) close their incidents.
    for key in [k for k in book.open if k not in seen]:
        book.open.pop(key)
        report.cleared.append(key)
    return report


@contextlib.contextmanager
def monitor_lock(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "monitor.lock", "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass
class MonitorResult:
    rounds: int
    devices: int
    emitted: list[dict[str, Any]]
    cleared: list[str]
    open_incidents: dict[str, dict[str, Any]]
    max_risk: dict[str, float]  # per device over the run
    score_s: float  # time spent scoring (not sampling or waiting)
    # The challenger's decisions this run (what it would have emitted, its open incidents)
    # and the scorecard since the pair started; None without a challenger.
    shadow: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "devices": self.devices,
            "emitted": self.emitted,
            "cleared": self.cleared,
            "open_incidents": self.open_incidents,
            "max_risk": self.max_risk,
            "score_s": round(self.score_s, 4),
            "shadow": self.shadow,
        }


def sample_clock_s(fleet: FleetSample) -> float:
    """The round's time on the devices' own clock (the twin's when it fast-forwards)."""
    return max((s.timestamp_s for s in fleet.samples), default=fleet.taken_at_s)


def run_monitor(
    backend: Backend,
    model: HealthModel,
    rounds: int = 12,
    interval_s: float = DEFAULT_INTERVAL_S,
    threshold: float = DEFAULT_THRESHOLD,
    clear_threshold: float | None = None,
    wait: Callable[[float], object] = time.sleep,
    emit: Callable[..., str] = emit_health_risk,
    state_dir: Path | None = None,
    on_round: Callable[[int, RoundReport], None] | None = None,
    costs: Callable[[], CostLookup] | None = None,
    model_name: str | None = None,
    challenger: HealthModel | None = None,
    challenger_name: str | None = None,
) -> MonitorResult:
    """``rounds`` samples of every device ``interval_s`` apart; each one scored, decided,
    incidents opened (event emitted) and closed; the state saved after every round.

    ``threshold``: the drain level. ``costs``: called once a round for that round's cost
    look-up (tasks.remediation.costs.FleetCosts over the inventory); None: the drain level
    alone decides. ``model_name``: what the decisions say scored them. ``challenger``:
    a model scored in shadow (module doc), named ``challenger_name``."""
    interval_s = validate_interval_s(interval_s)
    threshold, clear = validate_thresholds(threshold, clear_threshold)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    state_dir = state_dir or monitor_dir()
    name = model_name or getattr(model, "name", None) or type(model).__name__
    shadow_name = challenger_name or getattr(challenger, "name", None) or "challenger"
    with monitor_lock(state_dir):
        win_path = state_dir / "windows.npz"
        windows = FleetWindows.load_or_new(win_path, window=model.window)
        book = IncidentBook(state_dir / "incidents.json")
        explain_above = min(clear, threshold, EXPLAIN_ABOVE)
        scorer = FleetScorer(model, windows, explain_above=explain_above)
        shadow = None
        if challenger is not None:  # refused here if it reads other windows or features
            shadow = (
                FleetScorer(challenger, windows, explain_above=explain_above),
                IncidentBook(state_dir / SHADOW_BOOK),
            )
        card: Scorecard | None = None
        shadow_emitted: list[dict[str, Any]] = []
        sampler = TelemetrySampler(backend, interval_s, wait=wait)
        emitted: list[dict[str, Any]] = []
        cleared: list[str] = []
        max_risk: dict[str, float] = {}
        devices = 0
        score_s = 0.0
        for i, fleet in enumerate(sampler.rounds(rounds)):
            t0 = time.perf_counter()
            rows = windows.update(fleet.samples, max_clocks(sampler, fleet))
            risks = scorer.score_rows(fleet, rows)
            shadow_risks = shadow[0].score_rows(fleet, rows) if shadow else []
            score_s += time.perf_counter() - t0
            lookup = costs() if costs is not None else None
            before = dict(book.open) if shadow is not None else {}  # for the scorecard
            report = apply_round(risks, book, threshold, clear, emit, costs=lookup, model=name)
            if shadow is not None:
                shadow_book = shadow[1]
                now = sample_clock_s(fleet)
                if card is None:
                    card, fresh = Scorecard.load(
                        state_dir / SCORECARD, name, shadow_name, now, DEFAULT_LEAD_MIN_S
                    )
                    if fresh:  # another pair: the last challenger's incidents are not its
                        shadow_book.open.clear()
                shadow_before = dict(shadow_book.open)
                report.shadow = apply_round(
                    shadow_risks,
                    shadow_book,
                    threshold,
                    clear,
                    record_only,
                    costs=lookup,
                    model=shadow_name,
                )
                card.observe(
                    risks,
                    {"champion": (before, report), "challenger": (shadow_before, report.shadow)},
                    now,
                )
                shadow_emitted += report.shadow.emitted
                shadow_book.save()
                card.save(state_dir / SCORECARD)
            windows.save(win_path)
            book.save()
            devices = len(risks)
            emitted += report.emitted
            cleared += report.cleared
            for r in risks:
                key = f"{r.node}:{r.index}"
                max_risk[key] = max(max_risk.get(key, 0.0), round(r.risk, 6))
            if on_round is not None:
                on_round(i, report)
        shadow_out = None
        if shadow is not None and card is not None:
            shadow_out = {
                "model": shadow_name,
                "emitted": shadow_emitted,
                "open_incidents": dict(shadow[1].open),
                "scorecard": card.summary(),
            }
        return MonitorResult(
            rounds, devices, emitted, cleared, dict(book.open), max_risk, score_s, shadow_out
        )


# -- which model -------------------------------------------------------------------------------


def describe_model(model: HealthModel, source: str) -> str:
    """What decides, for logs, events and the tour: kind, horizon of its risk, source."""
    from gpuflow.tasks.health.horizons import horizon_label

    kind = getattr(model, "name", None) or type(model).__name__
    h = getattr(model, "horizon_s", None)
    within = f" P(fail within {horizon_label(h)})" if h else ""
    version = getattr(model, "registry_version", None)
    return f"{kind}{within} [{source}{f' v{version}' if version else ''}]"


# -- Prefect tasks -----------------------------------------------------------------------------


load_health_model_task = task(
    load_health_model, name="load-health-model", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
load_challenger_task = task(
    load_challenger, name="load-challenger", retries=2, retry_delay_seconds=2, cache_policy=NONE
)
run_monitor_task = task(run_monitor, name="monitor-rounds", cache_policy=NONE)
