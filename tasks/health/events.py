"""The health-risk event contract (DESIGN.md section 3).

What the parts that react to risk (remediation, the CLI, the tour) need of it:

- ``EVENT_NAME`` and ``resource_id_for(node, index)``: what a deployment trigger matches;
- ``DeviceRisk``: one scored device;
- ``emit_health_risk(...)``: send the event, returns its id. The event carries the
  decision (tasks.health.decision) that raised it: in its payload with the numbers, and as
  the resource label ``gpuflow.decision`` (act | drain-now | watch), which the remediate
  trigger matches.

Scoring a fleet is tasks.health.scoring (``score_fleet``), the registered model
tasks.health.model (``load_champion``); this module imports neither, so it stays light
(no torch) and scoring can build on it.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gpuflow.tasks.health.decision import ACTIONS, DRAIN, DRAIN_RISK, WATCH, Decision

EVENT_NAME = "gpuflow.device.health-risk"
RESOURCE_PREFIX = "gpuflow.device."
DEVICE_LOST_REASON = "device lost"
DECISION_LABEL = "gpuflow.decision"  # resource label: the action the event asks for
# The horizon today's models score (HealthLSTM.horizon_s, the history's labels): P(fail
# within 30 minutes). A risk always travels with its horizon.
DEFAULT_HORIZON_S = 1800.0

_RESOURCE_RE = re.compile(r"^gpuflow\.device\.(?P<node>.+)\.(?P<index>\d+)$")


def resource_id_for(node: str, index: int) -> str:
    """``gpuflow.device.<node>.<index>``: the Prefect resource id of one device."""
    if not node or not isinstance(node, str):
        raise ValueError(f"node must be a non-empty string, got {node!r}")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"index must be a non-negative int, got {index!r}")
    return f"{RESOURCE_PREFIX}{node}.{index}"


def parse_resource_id(resource_id: str) -> tuple[str, int]:
    """Inverse of resource_id_for: ``gpuflow.device.n3.2`` -> ("n3", 2)."""
    m = _RESOURCE_RE.match(resource_id or "")
    if not m:
        raise ValueError(
            f"not a device resource id: {resource_id!r} (expected gpuflow.device.<node>.<index>)"
        )
    return m.group("node"), int(m.group("index"))


@dataclass(frozen=True)
class DeviceRisk:
    """One device's risk of failure within the model's horizon.

    ``top_features`` maps feature name -> the value that drove the score most (by
    attribution), so an operator can read why. ``reason`` is "model" for a scored
    device and "device lost" for one that no longer answers (risk 1.0). ``missing``
    names the features the model had no input for (telemetry the device's backend cannot
    read, e.g. ECC and XIDs on a hy-smi DCU): a low risk there rests on less evidence.
    """

    node: str
    index: int
    sku: str
    risk: float
    top_features: dict[str, float] = field(default_factory=dict)
    reason: str = "model"
    missing: tuple[str, ...] = ()
    horizon_s: float = DEFAULT_HORIZON_S  # the risk is P(fail within this many seconds)

    @property
    def resource_id(self) -> str:
        return resource_id_for(self.node, self.index)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _decision_dict(
    decision: Decision | Mapping[str, Any] | None, risk: float, reason: str
) -> dict[str, Any]:
    """The decision as the payload carries it. None (an event not raised by the monitor):
    no costs known, so the drain level alone: drain-now at or above it or for a device
    lost or failed, else watch."""
    if isinstance(decision, Decision):
        return decision.to_dict()
    if isinstance(decision, Mapping):
        if decision.get("action") not in ACTIONS:
            raise ValueError(f"decision action must be act, drain-now or watch: {decision!r}")
        return dict(decision)
    forced = reason != "model"
    return {
        "action": DRAIN if forced or risk >= DRAIN_RISK else WATCH,
        "decided_by": reason if forced else "drain level",
        "drain_risk": DRAIN_RISK,
        "why": "no cost decision came with the event: the drain level alone",
    }


def health_risk_payload(
    node: str,
    index: int,
    risk: float,
    features: dict[str, float],
    sku: str,
    reason: str = "model",
    missing: Sequence[str] = (),
    horizon_s: float = DEFAULT_HORIZON_S,
    decision: Decision | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The event payload; validated before anything is sent. ``missing``: see DeviceRisk;
    ``decision``: the monitor's (tasks.health.decision), else judged at the drain level."""
    resource_id_for(node, index)  # validates node/index
    try:
        risk_f = float(risk)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"risk must be a number in [0, 1], got {risk!r}") from exc
    if not 0.0 <= risk_f <= 1.0:
        raise ValueError(f"risk must be in [0, 1], got {risk_f}")
    if not isinstance(features, dict):
        raise ValueError(f"features must be a dict name -> value, got {type(features).__name__}")
    if isinstance(horizon_s, bool) or not isinstance(horizon_s, int | float) or not horizon_s > 0:
        raise ValueError(f"horizon_s must be a number of seconds > 0, got {horizon_s!r}")
    return {
        "risk": round(risk_f, 6),
        "horizon_s": float(horizon_s),
        "top_features": {str(k): float(v) for k, v in features.items()},
        "node": node,
        "index": index,
        "sku": sku,
        "reason": reason,
        "missing": [str(m) for m in missing],
        "decision": _decision_dict(decision, risk_f, reason),
    }


def emit_health_risk(
    node: str,
    index: int,
    risk: float,
    features: dict[str, float],
    sku: str,
    reason: str = "model",
    missing: Sequence[str] = (),
    horizon_s: float = DEFAULT_HORIZON_S,
    decision: Decision | Mapping[str, Any] | None = None,
) -> str:
    """Emit ``gpuflow.device.health-risk`` for one device; returns the event id.

    The id is chosen here (not by the server) so the caller can log it and match the
    automation's flow run to it even when no events client is configured (then Prefect
    drops the event silently and the id is still returned).
    """
    from prefect.events import emit_event

    payload = health_risk_payload(
        node, index, risk, features, sku, reason, missing, horizon_s, decision
    )
    event_id = uuid.uuid4()
    emit_event(
        event=EVENT_NAME,
        resource={
            "prefect.resource.id": resource_id_for(node, index),
            "prefect.resource.name": f"{node}:{index}",
            "gpuflow.node": node,
            "gpuflow.index": str(index),
            "gpuflow.sku": sku,
            DECISION_LABEL: payload["decision"]["action"],
        },
        payload=payload,
        id=event_id,
    )
    return str(event_id)


__all__ = [
    "DECISION_LABEL",
    "DEFAULT_HORIZON_S",
    "DEVICE_LOST_REASON",
    "EVENT_NAME",
    "DeviceRisk",
    "emit_health_risk",
    "health_risk_payload",
    "parse_resource_id",
    "resource_id_for",
]
