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


def test_bad_input_sends_nothing(sent: list[dict]) -> None:
    with pytest.raises(ValueError):
        emit_health_risk("a100-0", 1, 2.0, {}, "sku")
    with pytest.raises(ValueError):
        emit_health_risk("", 1, 0.9, {}, "sku")
    assert sent == []


def test_public_names_are_exported() -> None:
    for name in (
        "emit_health_risk",
        "resource_id_for",
        "EVENT_NAME",
        "DeviceRisk",
    ):
        assert name in events.__all__
