from __future__ import annotations

import uuid

import pytest
from gpuflow.tasks.health import events
from gpuflow.tasks.health.events import (
    EVENT_NAME,
    DeviceRisk,
    emit_health_risk,
    health_risk_payload,
    parse_resource_id,
    resource_id_for,
)


def test_contract_names() -> None:
    assert EVENT_NAME == "gpuflow.device.health-risk"
    assert resource_id_for("a100-0", 3) == "gpuflow.device.a100-0.3"
    # Node names may contain dots: the index is the last part.
    assert parse_resource_id("gpuflow.device.rack1.n7.2") == ("rack1.n7", 2)
    assert parse_resource_id(resource_id_for("n", 0)) == ("n", 0)


@pytest.mark.parametrize("node,index", [("", 0), ("n", -1), ("n", True), ("n", 1.0)])
def test_resource_id_rejects_bad_devices(node: object, index: object) -> None:
    with pytest.raises(ValueError):
        resource_id_for(node, index)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["gpuflow.device.n", "other.n.1", "gpuflow.device.n.x", ""])
def test_parse_resource_id_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="not a device resource id"):
        parse_resource_id(bad)


@pytest.mark.parametrize("risk", [-0.1, 1.5, "high", None])
def test_payload_rejects_bad_risk(risk: object) -> None:
    with pytest.raises(ValueError, match="risk"):
        health_risk_payload("n", 0, risk, {}, "sku")  # type: ignore[arg-type]


def test_device_risk_resource_id() -> None:
    r = DeviceRisk("n1", 2, "NVIDIA A100-SXM4-40GB", 0.9, {"remap_pending": 1.0})
    assert r.resource_id == "gpuflow.device.n1.2"
    assert r.to_dict()["top_features"] == {"remap_pending": 1.0}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """emit_event replaced by a recorder (the real path runs in tests/flows, on a server)."""
    calls: list[dict] = []
    monkeypatch.setattr("prefect.events.emit_event", lambda **kw: calls.append(kw))
    return calls


def test_emit_sends_the_event(sent: list[dict]) -> None:
    event_id = emit_health_risk(
        "a100-0", 1, 0.93, {"remap_pending": 1.0, "xid_memory_log": 0.69}, "NVIDIA A100-SXM4-40GB"
    )
    assert len(sent) == 1
    e = sent[0]
    assert str(e["id"]) == event_id and uuid.UUID(event_id)
    assert e["event"] == EVENT_NAME
    assert e["resource"]["prefect.resource.id"] == "gpuflow.device.a100-0.1"
    assert e["payload"]["risk"] == pytest.approx(0.93)
    assert e["payload"]["top_features"] == {"remap_pending": 1.0, "xid_memory_log": 0.69}
    assert (e["payload"]["node"], e["payload"]["index"], e["payload"]["sku"]) == (
        "a100-0",
        1,
        "NVIDIA A100-SXM4-40GB",
    )


def test_the_event_carries_its_decision_for_the_trigger(sent: list[dict]) -> None:
    from gpuflow.tasks.health.decision import DeviceCosts, JobCosts, decide

    costs = DeviceCosts((JobCosts("big", 64, 3600.0, 120.0, 600.0, 300.0),), True)
    decision = decide(0.12, 1800.0, costs, model="lstm@champion")
    emit_health_risk("a100-0", 1, 0.12, {}, "sku", horizon_s=1800.0, decision=decision)
    e = sent[-1]
    assert e["resource"][events.DECISION_LABEL] == "act"
    d = e["payload"]["decision"]
    assert (d["action"], d["model"], d["horizon_s"]) == ("act", "lstm@champion", 1800.0)
    assert d["break_even_risk"] == pytest.approx(420 / 5100, abs=1e-5)
    assert d["jobs"][0]["job_id"] == "big" and e["payload"]["horizon_s"] == 1800.0
    # An event without a decision (an operator's, another tool's): the drain level alone.
    emit_health_risk("a100-0", 2, 0.97, {}, "sku")
    assert sent[-1]["resource"][events.DECISION_LABEL] == "drain-now"
    emit_health_risk("a100-0", 3, 0.5, {}, "sku")
    assert sent[-1]["resource"][events.DECISION_LABEL] == "watch"
    emit_health_risk("a100-0", 4, 1.0, {}, "sku", reason=events.DEVICE_LOST_REASON)
    assert sent[-1]["payload"]["decision"]["decided_by"] == events.DEVICE_LOST_REASON


def test_bad_input_sends_nothing(sent: list[dict]) -> None:
    with pytest.raises(ValueError):
        emit_health_risk("a100-0", 1, 2.0, {}, "sku")
    with pytest.raises(ValueError):
        emit_health_risk("", 1, 0.9, {}, "sku")
    with pytest.raises(ValueError, match="horizon_s"):
        emit_health_risk("a100-0", 1, 0.9, {}, "sku", horizon_s=0.0)
    with pytest.raises(ValueError, match="decision"):
        emit_health_risk("a100-0", 1, 0.9, {}, "sku", decision={"action": "panic"})
    assert sent == []


def test_public_names_are_exported() -> None:
    for name in (
        "emit_health_risk",
        "resource_id_for",
        "EVENT_NAME",
        "DeviceRisk",
    ):
        assert name in events.__all__
