"""A tiny fleet history and tiny trained models, built once per session (seconds)."""

from __future__ import annotations

import pytest
from gpuflow.tasks.health.baselines import GbtConfig
from gpuflow.tasks.health.history import History, HistoryConfig, generate_history
from gpuflow.tasks.health.model import TrainConfig

TINY_HISTORY = HistoryConfig.small(
    nodes=40,
    days=60.0,
    background_segments=(80, 40, 80),
    background_segment_s=(3600.0, 3600.0, 6 * 3600.0),
)
TINY_TRAIN = TrainConfig.small(
    epochs=2, hidden=8, max_background=1500, far_negatives_per_incident=8, batch_size=256
)
TINY_GBT = GbtConfig(max_iter=20)


@pytest.fixture(scope="session")
def tiny_history() -> History:
    return generate_history(TINY_HISTORY)


@pytest.fixture(scope="session")
def tiny_outcome(tiny_history: History):
    from gpuflow.tasks.health.pipeline import train_and_evaluate

    return train_and_evaluate(TINY_HISTORY, TINY_TRAIN, TINY_GBT, history=tiny_history)


@pytest.fixture(autouse=True)
def own_mlflow_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlflow.set_tracking_uri / set_registry_uri also set MLFLOW_TRACKING_URI /
    MLFLOW_REGISTRY_URI in os.environ, which tasks.tracking then prefers over GPUFLOW_HOME:
    without this every later test would write to the first test's store."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
