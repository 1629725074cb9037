"""prefect.yaml: every deployment's entrypoint loads and its default parameters validate."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).parents[1]
DEPLOYMENTS = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def _agent_order_parameters() -> dict:
    from gpuflow.tasks.training.distributed.agents import AgentOrder

    return AgentOrder("j", 1, "n1", {}, {}, "[]", ("127.0.0.1", 1), None, None, None).parameters()


# Deployments only other flows start (with the parameters these return).
STARTED_BY_FLOWS = {"gang-agent": _agent_order_parameters}


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_entrypoint_and_parameters(
    deployment: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == deployment["name"]
    if deployment["name"] in STARTED_BY_FLOWS:
        # No defaults: another flow starts it with every parameter it needs.
        required = {
            name
            for name, p in inspect.signature(flow.fn).parameters.items()
            if p.default is inspect.Parameter.empty
        }
        assert required <= set(STARTED_BY_FLOWS[deployment["name"]]())
    else:
        flow.validate_parameters(deployment.get("parameters") or {})
    assert deployment["work_pool"]["name"] == "gpuflow-process"


def test_every_capability_has_a_deployment() -> None:
    names = {d["name"] for d in DEPLOYMENTS}
    assert {"partition", "inventory", "train", "compare_precision"} <= names
