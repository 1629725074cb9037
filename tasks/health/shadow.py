"""The challenger in shadow: a second model scored beside the champion, never acted on.

The champion is chosen on the twin's validation split, which is not the fleet it watches.
What would justify handing the decisions to another model (the LSTM or the trees while
the rules decide, or the other way round) is its record on *this* fleet. So every monitor
round also scores the registered challenger (alias ``challenger``: the cheapest candidate
on validation of another kind than the champion, tasks.health.champion.challenger_of) on
the same windows, decides for it by the same cost rule with the same jobs' costs, and keeps
its incidents in a book of its own (``shadow_incidents.json``). Nothing is emitted for it
and nothing is remediated.

A scorecard (``shadow_scorecard.json``) sets the two side by side from the moment this
pair of models started: for each, the incidents it opened on its risk (alarms), what
acting on them costs (the decisions' own checkpoint + migration figures), the alarms that
closed with no failure, and for every failure the fleet then showed (a device failed or
lost), whether it had an incident open on that device at least ``lead_min_s`` before the
failure was seen (warned, with the lead). A warned failure saves what the decision that
opened the alarm priced a failure at (the jobs' work since their checkpoint + restart);
net GPU-hours = saved - acting, in the currency the champion was chosen by
(tasks.health.champion), counted on the fleet instead of the validation split. The clock is the samples' own (on the twin, its
fast-forwarded time), so leads mean the same on the twin and on hardware. An operator
promotes the challenger by moving the registry alias; a new pair starts a new scorecard.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpuflow.hardware.home import replace_atomically
from gpuflow.tasks.health.events import DeviceRisk
from gpuflow.tasks.health.horizons import DEFAULT_LEAD_MIN_S

SHADOW_BOOK = "shadow_incidents.json"
SCORECARD = "shadow_scorecard.json"
ROLES = ("champion", "challenger")
MODEL_REASON = "model"  # an incident opened on a model's risk (not on a failure)
MAX_LEADS = 1000  # leads kept per role (the newest): a summary, not a log


def record_only(*_args: Any, **_kwargs: Any) -> str:
    """The challenger's ``emit``: its decision is kept in its own book, no event is sent."""
    return f"shadow-{uuid.uuid4()}"


@dataclass
class RoleRecord:
    """One model's record since the scorecard started."""

    alarms: int = 0  # incidents opened on its risk
    act_cost_gpu_s: float = 0.0  # checkpoint + migration for those, as its decisions priced them
    saved_gpu_s: float = 0.0  # the failure cost its decisions priced, for the failures it warned of
    warned: int = 0  # failures with one of its incidents open >= lead_min before
    closed_without_failure: int = 0  # alarms whose incident closed with no failure under it
    lead_s: list[float] = field(default_factory=list)
    opened_at_s: dict[str, float] = field(default_factory=dict)  # open alarms, sample clock
    failure_cost_s: dict[str, float] = field(default_factory=dict)  # open alarms' priced failure
    failed_under: list[str] = field(default_factory=list)  # open alarms that saw a failure


@dataclass
class Scorecard:
    champion: str
    challenger: str
    since_s: float
    lead_min_s: float = DEFAULT_LEAD_MIN_S
    failures: int = 0
    failing: list[str] = field(default_factory=list)  # devices failed now (counted once)
    roles: dict[str, RoleRecord] = field(
        default_factory=lambda: {role: RoleRecord() for role in ROLES}
    )

    @classmethod
    def read(cls, path: Path) -> Scorecard | None:
        """The saved scorecard, or None (none yet, or damaged: a record, not state
        anything depends on)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls(
                **{k: v for k, v in data.items() if k != "roles"},
                roles={role: RoleRecord(**data["roles"][role]) for role in ROLES},
            )
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return None

    @classmethod
    def load(
        cls, path: Path, champion: str, challenger: str, now_s: float, lead_min_s: float
    ) -> tuple[Scorecard, bool]:
        """(the saved scorecard if it is this pair's, else a new one from ``now_s``;
        whether it is new)."""
        card = cls.read(path)
        if (
            card is None
            or (card.champion, card.challenger) != (champion, challenger)
            or card.lead_min_s != lead_min_s
        ):
            return cls(champion, challenger, now_s, lead_min_s), True
        return card, False

    def save(self, path: Path) -> None:
        text = json.dumps(asdict(self), indent=1, sort_keys=True)
        replace_atomically(Path(path), text.encode("utf-8"), ".scorecard-")

    def observe(
        self,
        risks: list[DeviceRisk],
        rounds: dict[str, tuple[dict[str, dict[str, Any]], Any]],
        now_s: float,
    ) -> None:
        """One monitor round. ``risks``: the champion's (a failure or a lost device is the
        same for both models); ``rounds[role]``: (that role's open incidents before the
        round, its RoundReport)."""
        for role, (before, report) in rounds.items():
            rec = self.roles[role]
            for e in report.emitted:
                if e["reason"] == MODEL_REASON:
                    rec.alarms += 1
                    rec.act_cost_gpu_s += float(e.get("act_cost_gpu_s") or 0.0)
                    rec.opened_at_s[e["device"]] = now_s
                    rec.failure_cost_s[e["device"]] = float(e.get("failure_cost_gpu_s") or 0.0)
            for key in report.cleared:
                if before.get(key, {}).get("reason") != MODEL_REASON:
                    continue
                if key in rec.failed_under:
                    rec.failed_under.remove(key)
                else:
                    rec.closed_without_failure += 1
                rec.opened_at_s.pop(key, None)
                rec.failure_cost_s.pop(key, None)
        for r in risks:
            key = f"{r.node}:{r.index}"
            if r.reason == MODEL_REASON:
                if key in self.failing:
                    self.failing.remove(key)  # repaired
                continue
            if key in self.failing:
                continue
            self.failing.append(key)
            self.failures += 1
            for rec in self.roles.values():
                opened = rec.opened_at_s.get(key)
                if opened is None:
                    continue
                if key not in rec.failed_under:
                    rec.failed_under.append(key)
                if now_s - opened >= self.lead_min_s:
                    rec.warned += 1
                    rec.saved_gpu_s += rec.failure_cost_s.get(key, 0.0)
                    rec.lead_s = [*rec.lead_s, now_s - opened][-MAX_LEADS:]

    def summary(self) -> dict[str, Any]:
        """What an operator compares, per role."""
        out: dict[str, Any] = {"since_s": self.since_s, "failures": self.failures}
        names = {"champion": self.champion, "challenger": self.challenger}
        for role, rec in self.roles.items():
            leads = sorted(rec.lead_s)
            out[role] = {
                "model": names[role],
                "alarms": rec.alarms,
                "act_cost_gpu_h": round(rec.act_cost_gpu_s / 3600.0, 3),
                "saved_gpu_h": round(rec.saved_gpu_s / 3600.0, 3),
                "net_gpu_h": round((rec.saved_gpu_s - rec.act_cost_gpu_s) / 3600.0, 3),
                "warned": rec.warned,
                "closed_without_failure": rec.closed_without_failure,
                "lead_p50_min": round(leads[len(leads) // 2] / 60.0, 1) if leads else None,
            }
        return out


def scorecard_rows(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``Scorecard.summary()`` as one row per role (the monitor's table artifact, the CLI)."""
    return [{"role": role, "failures seen": summary["failures"], **summary[role]} for role in ROLES]


__all__ = [
    "MODEL_REASON",
    "ROLES",
    "SCORECARD",
    "SHADOW_BOOK",
    "RoleRecord",
    "Scorecard",
    "record_only",
    "scorecard_rows",
]
