"""health_train and monitor flows on the session's Prefect server; the CLI over them."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from gpuflow.flows.health_train import health_train
from gpuflow.flows.monitor import monitor
from gpuflow.hardware.sim import SimBackend
from gpuflow.tasks.health.baselines import GbtConfig
from gpuflow.tasks.health.events import EVENT_NAME, resource_id_for
from gpuflow.tasks.health.history import HistoryConfig
from gpuflow.tasks.health.model import TrainConfig
from gpuflow.tasks.health.monitor import IncidentBook, monitor_dir
from typer.testing import CliRunner

from gpuflow.cli_health import app

TINY_HISTORY = HistoryConfig.small(
    nodes=40,
    days=60.0,
    background_segments=(80, 40, 80),
    background_segment_s=(3600.0, 3600.0, 6 * 3600.0),
)
TINY_TRAIN = TrainConfig.small(
    epochs=1, hidden=8, max_background=1500, far_negatives_per_incident=8
)


@pytest.fixture(autouse=True)
def own_mlflow_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI in os.environ, which tasks.tracking
    prefers over GPUFLOW_HOME: without this, tests share the first test's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)


def read_health_events(resource_id: str, since: datetime, attempts: int = 60) -> list:
    """Events the server stored for one device since ``since`` (other tests share the
    session's server; ingestion is asynchronous: poll)."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import (
        EventFilter,
        EventNameFilter,
        EventOccurredFilter,
        EventResourceFilter,
    )

    flt = EventFilter(
        event=EventNameFilter(name=[EVENT_NAME]),
        resource=EventResourceFilter(id=[resource_id]),
        occurred=EventOccurredFilter(since=since),
    )
    with get_client(sync_client=True) as client:
        for _ in range(attempts):
            events = client.read_events(flt, limit=50).events
            if events:
                return events
            time.sleep(0.5)
    return []


def test_train_then_monitor_emits_through_the_server() -> None:
    """`gpuflow health train` runs the health_train flow and registers the champion; the
    monitor flow loads it and its event reaches the Prefect server."""
    started = datetime.now(UTC)
    runner = CliRunner()
    res = runner.invoke(app, ["status"])
    assert res.exit_code == 0 and "no champion" in res.output
    res = runner.invoke(app, ["train", "--quick", "--nodes", "40", "--days", "60", "--epochs", "1"])
    assert res.exit_code == 0, res.output
    assert "health model vs baselines" in res.output and "oracle" in res.output
    assert "models:/gpuflow-health@champion" in res.output
    res = runner.invoke(app, ["status"])
    assert res.exit_code == 0 and "lstm_pr_auc" in res.output

    twin = SimBackend()
    twin.inject_fault("a100-0", 3, "xid79")
    out = monitor(rounds=2, fast_forward=True)
    # which model (the champion by cost, whatever its kind) and horizon decided
    assert out["model"].endswith("[models:/gpuflow-health@champion v1]"), out["model"]
    assert "within" in out["model"]
    # the challenger beside it, in shadow: it saw the lost device too, and emitted nothing
    shadow = out["shadow"]
    assert shadow["model"].endswith("[models:/gpuflow-health@challenger v2]"), shadow["model"]
    assert [e["device"] for e in shadow["emitted"]] == ["a100-0:3"]
    assert shadow["scorecard"]["failures"] == 1
    emitted = {e["device"]: e for e in out["emitted"]}
    assert emitted["a100-0:3"]["reason"] == "device lost"
    events = read_health_events(resource_id_for("a100-0", 3), started)
    assert [str(e.id) for e in events] == [emitted["a100-0:3"]["event_id"]]
    payload = events[0].payload
    assert payload["risk"] == 1.0 and payload["node"] == "a100-0" and payload["index"] == 3
    # a second run continues the incident: no second event
    assert monitor(rounds=1, fast_forward=True)["emitted"] == []
    time.sleep(1.0)
    assert len(read_health_events(resource_id_for("a100-0", 3), started)) == 1
    res = runner.invoke(app, ["status"])
    assert "a100-0:3" in res.output and "device lost" in res.output
    assert "champion vs challenger" in res.output and "@challenger v2" in res.output


def test_health_train_flow_without_registering() -> None:
    result = health_train(
        history=TINY_HISTORY,
        training=TINY_TRAIN,
        gbt=GbtConfig(max_iter=5),
        cache=False,
        register_model=False,
    )
    assert "registry_uri" not in result and result["run_id"]
    assert result["summary"]["test_at_monitor_threshold"]["oracle"]["recall"] == 1.0
    # A bad cost is refused, naming it, before the history is even loaded.
    with pytest.raises(ValueError, match="cordon_price"):
        health_train(history=TINY_HISTORY, training=TINY_TRAIN, costs={"cordon_price": 2.0})


def test_monitor_with_rules_and_bad_parameters() -> None:
    twin = SimBackend()
    twin.inject_fault("a100-1", 1, "remap-pending")
    out = monitor(rounds=1, model_uri="rules", fast_forward=True)
    assert [e["device"] for e in out["emitted"]] == ["a100-1:1"]
    # The event says which model and which rule decided: the rules' risk 1.0 is at the
    # drain level, the device idle (the inventory holds no job for it).
    e = out["emitted"][0]
    assert (e["action"], e["decided_by"]) == ("drain-now", "drain level")
    assert e["model"] == "rules P(fail within 1h) [rules]"
    assert e["drain_risk"] == 0.85 and e["horizon_s"] == 3600.0 and e["break_even_risk"] is None
    assert "rules" in e["decision"] and "60 min" in e["decision"]
    with pytest.raises(ValueError, match="interval_s"):
        monitor(rounds=1, interval_s=2.0)
    with pytest.raises(ValueError, match="threshold"):
        monitor(rounds=1, threshold=0.0)
    # A bad cost default is refused, naming it, before anything is sampled or emitted.
    twin.inject_fault("a100-0", 0, "remap-pending")
    with pytest.raises(ValueError, match="restart_s"):
        monitor(rounds=1, model_uri="rules", fast_forward=True, costs={"restart_s": -1.0})
    assert "a100-0:0" not in IncidentBook(monitor_dir() / "incidents.json").open


def test_cli_score_and_monitor_without_a_champion() -> None:
    runner = CliRunner()
    SimBackend().inject_fault("v100-0", 1, "xid79")
    res = runner.invoke(app, ["score", "--top", "3"])
    assert res.exit_code == 0, res.output
    assert "v100-0:1" in res.output and "device lost" in res.output and "rules" in res.output
    res = runner.invoke(app, ["monitor", "--rounds", "1", "--model", "rules", "--fast-forward"])
    assert res.exit_code == 0, res.output
    assert "1 events emitted" in res.output
    assert "drain-now (device lost)" in res.output
    # A challenger named on the command line watches in shadow: its book starts empty, so
    # it records the lost device the champion's open incident already covers; no event.
    args = ["monitor", "--rounds", "1", "--model", "rules", "--fast-forward"]
    res = runner.invoke(app, [*args, "--challenger", "rules"])
    assert res.exit_code == 0, res.output
    assert "0 events emitted" in res.output
    assert "challenger in shadow, rules P(fail within 1h) [rules]: would have acted on 1" in (
        res.output
    )
    assert "would have: v100-0:1 (device lost)" in res.output
    res = runner.invoke(app, [*args, "--challenger", "models:/no-such-model@champion"])
    assert res.exit_code == 2 and "no-such-model" in res.output
    res = runner.invoke(app, ["decide", "--device", "v100-0:1", "--model", "rules"])
    assert res.exit_code == 0, res.output
    assert "v100-0:1: drain-now (device lost): model rules" in res.output
    res = runner.invoke(app, ["decide", "--device", "a100-0:0", "--model", "rules", "--json"])
    assert res.exit_code == 0, res.output
    assert '"action": "watch"' in res.output and "idle" in res.output
    res = runner.invoke(app, ["decide", "--device", "nowhere:9", "--model", "rules"])
    assert res.exit_code == 2 and "no device nowhere:9" in res.output
    res = runner.invoke(app, ["monitor", "--interval", "1"])
    assert res.exit_code == 2 and "interval_s" in res.output
    res = runner.invoke(app, ["train", "--nodes", "1"])
    assert res.exit_code == 2 and "nodes" in res.output
