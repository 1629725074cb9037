"""What the DVFS controller (controller.py) reports: each tick's events, each decision,
and each device's totals over what it measured. Plain data, JSON-ready."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from gpuflow.tasks.energy.optimizer import Choice

Action = Literal[
    "probe",  # a probe's setting applied; it settles for one interval
    "measuring",  # a window opened at the current setting
    "measured",  # a probe measured (told to the search)
    "chosen",  # the search ended: the choice applied
    "watch",  # re-measured at the chosen setting
    "redecide",  # a new search starts (drift held for N intervals)
    "waiting",  # a new job warming up, or no progress in the window yet (it stays open)
    "restored",  # the device put back (its job ended or changed, or the stop)
    "pinned",  # another holder's settings are on it: left alone
    "skipped",  # not controlled (shared by several jobs, no progress published)
    "lost",  # our hold was taken over (we lapsed): starting over
    "error",  # the device failed a call: put back where possible, dropped
]


@dataclass(frozen=True)
class DeviceEvent:
    node: str
    index: int
    job_id: str | None
    action: Action
    detail: str
    setting_w: float | None = None

    @property
    def device(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True)
class Decision:
    """A search that ended on a device: the choice and why the search ran."""

    node: str
    index: int
    job_id: str
    reason: str  # "new job" | "drift"
    at_s: float
    choice: Choice

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": f"{self.node}:{self.index}",
            "job_id": self.job_id,
            "reason": self.reason,
            "at_s": self.at_s,
            **self.choice.to_dict(),
        }


@dataclass
class Totals:
    """Energy, time and units over every window measured on one device for one job."""

    node: str
    index: int
    job_id: str
    energy_j: float = 0.0
    seconds: float = 0.0
    units: float = 0.0
    setting_w: float | None = None  # the last chosen setting (None: still probing)

    def add(self, energy_j: float, seconds: float, units: float) -> None:
        self.energy_j += energy_j
        self.seconds += seconds
        self.units += units

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": f"{self.node}:{self.index}",
            "job_id": self.job_id,
            "energy_j": self.energy_j,
            "average_power_w": self.energy_j / self.seconds if self.seconds else None,
            "energy_per_unit_j": self.energy_j / self.units if self.units else None,
            "time_per_unit_s": self.seconds / self.units if self.units else None,
            "measured_s": self.seconds,
            "units": self.units,
            "chosen_power_limit_w": self.setting_w,
        }


@dataclass
class TickReport:
    at_s: float
    events: list[DeviceEvent] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    def of(self, node: str, index: int) -> list[DeviceEvent]:
        return [e for e in self.events if (e.node, e.index) == (node, index)]

    def actions(self, node: str, index: int) -> list[str]:
        return [e.action for e in self.of(node, index)]

    def why_left_alone(self) -> dict[str, str]:
        """device -> why the controller did not touch it this tick."""
        return {e.device: e.detail for e in self.events if e.action in ("pinned", "skipped")}


@dataclass
class ControllerRun:
    """What run_controller did: the stale settings it cleaned first, every decision, the
    per-device totals, the restores at the stop and how many ticks ran."""

    cleaned: list[dict[str, Any]]
    decisions: list[Decision]
    totals: list[Totals]
    restored: list[dict[str, Any]]
    ticks: int
    holder: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "ticks": self.ticks,
            "cleaned": self.cleaned,
            "decisions": [d.to_dict() for d in self.decisions],
            "totals": [t.to_dict() for t in self.totals],
            "restored": self.restored,
        }
