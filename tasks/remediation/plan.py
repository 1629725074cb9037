"""What remediation decides, from what it sees: no I/O, so tests call it directly.

The `remediate` flow (flows/remediate.py) does the work - cordons, reserves, asks for
checkpoints, relaunches, writes the ledger - and asks this module what to do at each
turn: how to read the signal, whether the device's loss is news, whether a job
checkpoints in place or checkpoints and stops, which timeline entries a step earns, what
a job's outcome is, the incident's final status, whether a repeat signal is worth a
message, and what a failed step rolls back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuflow.tasks.health.events import DEVICE_LOST_REASON
from gpuflow.tasks.remediation import ledger as L
from gpuflow.tasks.remediation.devices import JobOnDevice
from gpuflow.tasks.remediation.steps import (
    CHECKPOINT_AND_STOP,
    CHECKPOINT_NOW,
    CheckpointOutcome,
    MigrateOutcome,
)

# -- the signal ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """Why remediation runs, as the incident records it."""

    trigger: str  # predicted | reactive | manual
    reason: str
    risk: float | None
    features: dict[str, Any]


def features_of(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The health model's top features from an event payload: a dict, or the pairs
    ``[[name, value], ...]`` / ``[{"name": ..., "value": ...}, ...]`` it may carry."""
    found = payload.get("top_features", payload.get("features"))
    if isinstance(found, dict):
        return found
    if isinstance(found, list):
        out: dict[str, Any] = {}
        for item in found:
            if isinstance(item, dict) and "name" in item:
                out[str(item["name"])] = item.get("value")
            elif isinstance(item, list | tuple) and len(item) == 2:
                out[str(item[0])] = item[1]
        return out
    return {}


def read_signal(
    trigger: str, reason: str, risk: float | None, payload: Mapping[str, Any] | None
) -> Signal:
    """The flow's parameters and the event's payload, as one signal.

    A "predicted" event whose payload says the device is lost is reactive: the monitor
    saw the device gone, nothing was predicted. The payload fills what the caller left out
    (the reason names the monitor's decision: act or drain-now, and why).
    """
    payload = payload or {}
    if risk is None and isinstance(payload.get("risk"), int | float):
        risk = float(payload["risk"])
    if trigger == "predicted" and payload.get("reason") == DEVICE_LOST_REASON:
        trigger = "reactive"
    if not reason and payload:
        why = str(payload.get("reason") or "model")
        reason = "health model risk" if why == "model" else why
        decision = payload.get("decision")
        if why == "model" and isinstance(decision, Mapping) and decision.get("action"):
            # The monitor's cost decision, so the incident says why it was worth acting.
            by = decision.get("model") or "model ?"
            within = payload.get("horizon_s") or decision.get("horizon_s")
            horizon = f" within {float(within) / 60:g} min" if within else ""
            action, why = decision["action"], decision.get("why", "")
            reason = f"{reason} ({by}{horizon}), {action}: {why}"[:300]
    return Signal(trigger, reason, risk, features_of(payload))


def new_result(device: str | None, signal: Signal) -> dict[str, Any]:
    """The flow's return value before anything happened."""
    return {
        "device": device,
        "trigger": signal.trigger,
        "risk": signal.risk,
        "reason": signal.reason,
        "features": signal.features,
        "jobs": {},
        "spares_activated": [],
        "unmanaged": [],
        "duplicate": None,
    }


# -- the device's incident ----------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One line the incident's timeline gets."""

    what: str
    detail: str = ""
    job_id: str | None = None


@dataclass(frozen=True)
class Situation:
    """What the decisions about one device depend on, read once the incident is ours."""

    incident_id: str
    duplicate: str | None  # None: a new incident; "device": the signal joined an active one
    signal: Signal
    present: bool  # the device still answers
    condition_reasons: tuple[str, ...]  # what the device (or its absence) says
    timeline: tuple[str, ...] = ()  # the "what" of each entry the incident already has

    @classmethod
    def of(
        cls,
        incident: L.Incident,
        duplicate: str | None,
        signal: Signal,
        condition: Mapping[str, Any],
    ) -> Situation:
        return cls(
            incident_id=incident.incident_id,
            duplicate=duplicate,
            signal=signal,
            present=bool(condition["present"]),
            condition_reasons=tuple(condition.get("reasons") or ()),
            timeline=tuple(e["what"] for e in incident.timeline),
        )

    def opening_entries(self) -> list[Entry]:
        """A predicted incident whose device is already gone says so first (a reactive
        one opened with "device lost"; a joined one has said it before)."""
        if self.present or self.duplicate is not None or self.signal.trigger != "predicted":
            return []
        return [Entry(L.DEVICE_LOST, "; ".join(self.condition_reasons))]

    def isolation_reason(self) -> str:
        """What the cordon says about why."""
        why = self.signal.reason or self.signal.trigger
        return why if self.signal.risk is None else f"{why} (risk {self.signal.risk:.2f})"

    def cordon_entries(self, isolation: Mapping[str, Any]) -> list[Entry]:
        """A cordon this incident made, noted once (a re-run finds it noted already)."""
        if not isolation["created"] or L.CORDONED in self.timeline:
            return []
        return [Entry(L.CORDONED, f"{isolation['target']}: {isolation['reason']}")]

    def checkpoint_action(self, job: JobOnDevice, target: object | None) -> str:
        """Checkpoint in place when the job has nowhere to go, its device still works and
        it is alive to answer; else checkpoint and stop (a job is never stopped on a
        working device without a target, and a dead device's job is stopped anyway)."""
        if target is None and self.present and job.holds_lease:
            return CHECKPOINT_NOW
        return CHECKPOINT_AND_STOP

    def undo_cordon_on_failure(self, moved: Sequence[str]) -> bool:
        """After a failed step: lift the cordon only if no job was stopped and the device
        still works (a device that is gone, or was left by a job, stays cordoned)."""
        return not moved and self.present

    def should_notify(self, changed: bool) -> bool:
        """A new incident always tells the operators; a repeat signal only when it changed
        something (a second event for a device being handled is no news)."""
        return self.duplicate is None or changed


def spare_entries(promoted: Iterable[str]) -> list[Entry]:
    return [Entry(L.SPARE_ACTIVATED, f"node {node} joined the active pool") for node in promoted]


def request_entries(job: JobOnDevice, action: str) -> list[Entry]:
    """Only a job that still holds its lease is asked (the others cannot answer)."""
    return [Entry(L.CHECKPOINT_REQUESTED, action, job.job_id)] if job.holds_lease else []


# -- one job ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStep:
    """What a step did to one job: its outcome (what the result and the ledger keep), the
    timeline entries it earns, and whether the job was stopped and must now migrate."""

    outcome: dict[str, Any]
    entries: list[Entry] = field(default_factory=list)
    migrate: bool = False


def _checkpoint_fields(ck: CheckpointOutcome) -> dict[str, Any]:
    return {
        "checkpoint_id": ck.checkpoint_id,
        "checkpoint_how": ck.how,
        "step": ck.step,
        "waited_s": round(ck.waited_s, 3),
    }


def after_checkpoint(job: JobOnDevice, ck: CheckpointOutcome) -> JobStep:
    """A job checkpointed in place is done with (it keeps running where it is); a job
    checkpointed and stopped goes on to migrate."""
    fields = _checkpoint_fields(ck)
    if ck.action == CHECKPOINT_NOW:
        what = L.CHECKPOINT_IN_PLACE if ck.checkpoint_id else L.JOB_QUEUED
        detail = f"{ck.checkpoint_id or '-'}; no free {job.sku}: keeps running where it is"
        outcome = fields | {
            "status": "in-place",
            "detail": f"no free {job.sku}: kept running, {ck.detail}".strip(", "),
        }
        return JobStep(outcome, [Entry(what, detail, job.job_id)])
    what = L.CHECKPOINT_WRITTEN if ck.how == "on-request" else L.CHECKPOINT_FALLBACK
    detail = f"{ck.checkpoint_id or 'none: restarts from step 0'}" + (
        f" ({ck.detail})" if ck.detail else ""
    )
    return JobStep(fields, [Entry(what, detail, job.job_id)], migrate=True)


def after_migration(job: JobOnDevice, ck: CheckpointOutcome, mig: MigrateOutcome) -> JobStep:
    """Resumed elsewhere, or checkpointed and queued (with why)."""
    outcome = _checkpoint_fields(ck) | {
        "status": mig.status,
        "target": mig.target,
        "launcher": mig.launcher,
        "detail": mig.detail,
    }
    if mig.status == "resumed":
        detail = f"on {mig.target} from {ck.checkpoint_id or 'scratch'} (step {ck.step or 0})"
        entry = Entry(L.JOB_RESUMED, detail, job.job_id)
    elif mig.status == "ended":
        entry = Entry(L.JOB_ENDED, mig.detail, job.job_id)
    else:
        entry = Entry(L.JOB_QUEUED, f"checkpointed and queued: {mig.detail}", job.job_id)
    return JobStep(outcome, [entry])


def final_status(outcomes: Mapping[str, Mapping[str, Any]]) -> Literal["waiting", "done"]:
    """Done when every job runs elsewhere, or ended meanwhile (or there was none); else
    some job waits for capacity: kept running in place, or checkpointed and queued."""
    settled = ("resumed", "ended")
    return "waiting" if any(o["status"] not in settled for o in outcomes.values()) else "done"


# -- a failed step ------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def failure_entry(exc: BaseException) -> Entry:
    return Entry(L.STEP_FAILED, error_text(exc))


CORDON_UNDONE_ENTRY = Entry(L.CORDON_UNDONE, "nothing was moved")


def unfinished(jobs: Iterable[JobOnDevice], outcomes: Mapping[str, Any]) -> list[JobOnDevice]:
    """The jobs a failed step left without an outcome."""
    return [job for job in jobs if job.job_id not in outcomes]


def failed_step_marker(
    info: Mapping[str, Any], device_uuid: str, incident_id: str
) -> dict[str, Any] | None:
    """The remediation marker a job left unfinished by a failed step gets, or None when it
    is already marked for this device.

    Whatever the job does next (it may still answer a pending stop), the marker keeps it
    findable: the next run for this device takes a stopped job over.
    """
    if (info.get("remediation") or {}).get("device_uuid") == device_uuid:
        return None
    return {"device_uuid": device_uuid, "incident": incident_id, "cause": "failed step"}
