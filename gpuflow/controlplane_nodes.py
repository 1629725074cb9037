"""What a control plane keeps on its Prefect server for the hosts that join it: the MLflow
URL they record to, and per node its work queue and its own `monitor` and `inventory`.

A host that owns devices runs one worker per node it owns, on that node's queue
(tasks/worker_queues.py). The fleet-wide `monitor` and `inventory` deployments of
prefect.yaml watch whatever the worker that runs them sees - on a single machine, the
whole fleet. Once nodes register, each gets a copy of both (``monitor/node-<N>``,
``inventory/node-<N>``: the same schedules and parameters plus ``node``) on its queue, and
the fleet-wide two are paused, so every device is watched once, by the host it sits in.

These talk to the Prefect server of the caller's settings (PREFECT_API_URL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.worker_queues import node_queue_name

# The deployments of prefect.yaml that get one copy per node.
PER_NODE_FLOWS = ("monitor", "inventory")
MLFLOW_URL_VARIABLE = "gpuflow_mlflow_url"


def validate_node_names(nodes: Sequence[str]) -> None:
    bad = [n for n in nodes if not n or not all(c.isalnum() or c in "-_." for c in n)]
    if bad:
        raise InvalidRequestError(f"node names {bad} must be letters, digits, '-', '_', '.'")


def save_mlflow_url(url: str) -> None:
    """Tell joining hosts where MLflow is (`gpuflow join` reads it)."""
    from prefect.variables import Variable

    Variable.set(MLFLOW_URL_VARIABLE, url, overwrite=True)


def read_mlflow_url() -> str | None:
    from prefect.variables import Variable

    value = Variable.get(MLFLOW_URL_VARIABLE)
    return str(value) if value else None


def node_deployment_name(flow_name: str, node: str) -> str:
    return f"{flow_name}/{node_queue_name(node)}"


def register_nodes(nodes: Sequence[str], pool: str) -> list[str]:
    """Each node's work queue in ``pool`` and its monitor and inventory deployments (made
    again from the fleet-wide ones, so a second call changes nothing); the fleet-wide ones
    paused. Returns the node deployments, ``flow/deployment``."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    validate_node_names(nodes)
    made: list[str] = []
    with get_client(sync_client=True) as client:
        for node in nodes:
            try:
                client.create_work_queue(name=node_queue_name(node), work_pool_name=pool)
            except ObjectAlreadyExists:
                pass
        for flow_name in PER_NODE_FLOWS:
            try:
                fleet_wide = client.read_deployment_by_name(f"{flow_name}/{flow_name}")
            except ObjectNotFound:
                continue  # not deployed (`up --no-deploy`): nothing to copy
            for node in nodes:
                client.create_deployment(**_node_copy(fleet_wide, node))
                made.append(node_deployment_name(flow_name, node))
            client.pause_deployment(fleet_wide.id)
    return made


def _node_copy(fleet_wide: Any, node: str) -> dict[str, Any]:
    """create_deployment's arguments for ``node``'s copy of the deployment ``fleet_wide``."""
    from prefect.client.schemas.actions import DeploymentScheduleCreate

    limit = fleet_wide.global_concurrency_limit
    return {
        "flow_id": fleet_wide.flow_id,
        "name": node_queue_name(node),
        "description": f"{fleet_wide.description or ''} Node {node} only.".strip(),
        "schedules": [
            DeploymentScheduleCreate(
                schedule=s.schedule,
                active=s.active,
                max_scheduled_runs=s.max_scheduled_runs,
                parameters=s.parameters,
            )
            for s in fleet_wide.schedules
        ],
        "concurrency_limit": limit.limit if limit else None,
        "concurrency_options": fleet_wide.concurrency_options,
        "parameters": {**fleet_wide.parameters, "node": node},
        "work_pool_name": fleet_wide.work_pool_name,
        "work_queue_name": node_queue_name(node),
        "tags": sorted({*fleet_wide.tags, f"node:{node}"}),
        "path": fleet_wide.path,
        "entrypoint": fleet_wide.entrypoint,
        "parameter_openapi_schema": fleet_wide.parameter_openapi_schema,
        "pull_steps": fleet_wide.pull_steps,
        "enforce_parameter_schema": fleet_wide.enforce_parameter_schema,
        "job_variables": fleet_wide.job_variables,
        "paused": False,
    }
