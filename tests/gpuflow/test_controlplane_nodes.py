"""Nodes registered on a control plane: each gets its queue and its own monitor and
inventory deployments, and the fleet-wide ones stop being scheduled (the session's
Prefect server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from gpuflow.hardware.backend import InvalidRequestError

from gpuflow.controlplane import POOL
from gpuflow.controlplane_blocks import create_work_pool
from gpuflow.controlplane_nodes import (
    read_mlflow_url,
    register_nodes,
    save_mlflow_url,
)


@pytest.fixture
def fleet_wide(prefect_server: None) -> Iterator[dict]:
    """monitor/monitor and inventory/inventory as `prefect deploy --all` leaves them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.schedules import IntervalSchedule

    create_work_pool(POOL)
    ids = {}
    with get_client(sync_client=True) as client:
        for name, params, every in (("monitor", {"rounds": 12}, 60), ("inventory", {}, 300)):
            flow_id = client.create_flow_from_name(name)
            ids[name] = client.create_deployment(
                flow_id=flow_id,
                name=name,
                entrypoint=f"flows/{name}.py:{name}",
                work_pool_name=POOL,
                work_queue_name="default",
                parameters=params,
                tags=["gpuflow"],
                concurrency_limit=1 if name == "monitor" else None,
                schedules=[
                    DeploymentScheduleCreate(schedule=IntervalSchedule(interval=every), active=True)
                ],
            )
    yield ids
    with get_client(sync_client=True) as client:
        for dep in client.read_deployments():
            if dep.id in ids.values() or dep.name.startswith("node-"):
                client.delete_deployment(dep.id)


def _deployment(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_deployment_by_name(name)


def test_each_node_gets_its_own_monitor_and_inventory_on_its_queue(fleet_wide: dict) -> None:
    assert register_nodes(["gpu-a"], POOL) == ["monitor/node-gpu-a", "inventory/node-gpu-a"]
    mon = _deployment("monitor/node-gpu-a")
    assert mon.work_queue_name == "node-gpu-a" and mon.work_pool_name == POOL
    assert mon.parameters == {"rounds": 12, "node": "gpu-a"}
    assert mon.entrypoint == "flows/monitor.py:monitor" and not mon.paused
    assert [(s.schedule.interval.total_seconds(), s.active) for s in mon.schedules] == [
        (60.0, True)
    ]
    assert mon.global_concurrency_limit is not None and mon.global_concurrency_limit.limit == 1
    assert "node:gpu-a" in mon.tags
    assert _deployment("inventory/node-gpu-a").parameters == {"node": "gpu-a"}
    # No device is watched twice: the fleet-wide deployments are paused.
    assert _deployment("monitor/monitor").paused and _deployment("inventory/inventory").paused

    # A second host joins later, and the first registers again: both copies are active.
    register_nodes(["gpu-b", "gpu-a"], POOL)
    for node in ("gpu-a", "gpu-b"):
        dep = _deployment(f"monitor/node-{node}")
        assert [s.active for s in dep.schedules] == [True] and not dep.paused
        assert dep.parameters["node"] == node


def test_the_node_queues_exist_even_without_deployments_to_copy(prefect_server: None) -> None:
    from prefect.client.orchestration import get_client

    create_work_pool(POOL)
    assert register_nodes(["gpu-c"], POOL) == []  # `up --no-deploy`: nothing to copy
    with get_client(sync_client=True) as client:
        assert client.read_work_queue_by_name("node-gpu-c", work_pool_name=POOL).name


def test_a_bad_node_name_is_refused_before_anything_changes(prefect_server: None) -> None:
    with pytest.raises(InvalidRequestError, match=r"node names \['a b'\]"):
        register_nodes(["ok", "a b"], POOL)


def test_joining_hosts_read_the_mlflow_url_up_saved(prefect_server: None) -> None:
    save_mlflow_url("http://10.0.0.1:5000")
    assert read_mlflow_url() == "http://10.0.0.1:5000"
    save_mlflow_url("http://10.0.0.1:5001")  # a later `up` replaces it
    assert read_mlflow_url() == "http://10.0.0.1:5001"
