"""prefect.yaml: every deployment's entrypoint loads and its default parameters validate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_entrypoint_and_parameters(
    deployment: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == deployment["name"]
    flow.validate_parameters(deployment.get("parameters") or {})
    assert deployment["work_pool"]["name"] == "gpuflow-process"


def test_every_capability_has_a_deployment() -> None:
    names = {d["name"] for d in DEPLOYMENTS}
    assert {"partition", "inventory", "train", "compare_precision"} <= names
