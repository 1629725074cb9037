"""A gang across nodes: one torchelastic agent per node, each started where its node runs.

The `train` flow run of a gang runs on the work queue of the gang's first node and runs
that node's agent itself (it hosts the rendezvous). Every other node's agent is started
here, one per node:

* ``deployment``: a run of the `gang-agent` deployment (flows/gang_agent.py) on that
  node's work queue, so the worker that owns the node starts it there; keyed by (job,
  attempt, node), so a retry is the same run. Its parameters hold no secret: the storage
  without credentials (as the `train` deployment's), the cluster by block name.
* ``in-process``: a process of this machine (the twin, tests, a laptop), spawned, so the
  agent has its own main thread (torchelastic installs signal handlers there).

``RemoteAgents`` waits for them after this node's agent returned and says which failed.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from gpuflow.tasks.training.distributed.gang import GangUnit, encode_plan

log = logging.getLogger(__name__)

AGENT_DEPLOYMENT = "gang-agent/gang-agent"
ADDRESS_ENV = "GPUFLOW_NODE_ADDRESS"  # where other nodes reach this one, if set
AGENT_MODES = ("auto", "deployment", "in-process")


class AgentFailedError(RuntimeError):
    """Another node's agent failed or never ended."""


def node_address(all_local: bool) -> str:
    """The address the gang's other nodes reach this node's rendezvous at: GPUFLOW_NODE_
    ADDRESS if set; loopback when every agent runs on this machine; else the address of
    the interface that routes to the Prefect server (the one the other hosts reach)."""
    if os.environ.get(ADDRESS_ENV):
        return os.environ[ADDRESS_ENV]
    if all_local:
        return "127.0.0.1"
    from prefect.settings import PREFECT_API_URL

    api = urlparse(PREFECT_API_URL.value() or "")
    if not api.hostname:
        raise AgentFailedError(
            f"a gang across nodes needs an address the other nodes reach this one at: set "
            f"{ADDRESS_ENV} (no Prefect server to route to either)"
        )
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((api.hostname, api.port or 80))  # no packet: only picks the route
        return str(s.getsockname()[0])


def agent_mode(mode: str) -> str:
    """``auto``: the deployment when it exists on the Prefect server, else in-process."""
    if mode not in AGENT_MODES:
        raise ValueError(f"agent mode {mode!r} is not one of {', '.join(AGENT_MODES)}")
    if mode != "auto":
        return mode
    from gpuflow.tasks.launching import deployment_target

    try:
        exists, _ = deployment_target(AGENT_DEPLOYMENT)
    except Exception:  # noqa: BLE001 - no Prefect server reachable: this machine it is
        return "in-process"
    return "deployment" if exists else "in-process"


@dataclass
class AgentOrder:
    """What one node's agent needs (run_node_agent's arguments, secrets left out)."""

    job_id: str
    attempt: int
    node: str
    spec: dict[str, Any]
    storage: dict[str, Any]  # CheckpointStorage fields, no credentials
    plan: str  # every unit of the gang (gang.encode_plan)
    rendezvous: tuple[str, int]
    fencing_token: int | None
    run_id: str | None
    cluster_block: str | None
    options: dict[str, Any] = field(default_factory=dict)

    def parameters(self) -> dict[str, Any]:
        """The `gang-agent` flow's parameters."""
        return {"order": self.fields()}

    def fields(self) -> dict[str, Any]:
        """node_agent.run_agent_order's arguments."""
        return {
            "spec": self.spec,
            "storage": self.storage,
            "plan": self.plan,
            "node": self.node,
            "rendezvous": list(self.rendezvous),
            "attempt": self.attempt,
            "fencing_token": self.fencing_token,
            "run_id": self.run_id,
            "cluster_block": self.cluster_block,
            **self.options,
        }


def agent_orders(
    spec: Any,
    storage: Any,
    units: Sequence[GangUnit],
    rendezvous: tuple[str, int],
    *,
    attempt: int,
    fencing_token: int | None,
    run_id: str | None,
    cluster_block: str | None,
) -> list[AgentOrder]:
    """One order per node of the gang but the first (its agent runs in this process)."""
    from gpuflow.tasks.launching import storage_fields

    nodes = list(dict.fromkeys(u.node for u in units))
    return [
        AgentOrder(
            spec.job_id,
            attempt,
            node,
            spec.model_dump(),
            storage_fields(storage),
            encode_plan(units),
            rendezvous,
            fencing_token,
            run_id,
            cluster_block,
        )
        for node in nodes[1:]
    ]


@dataclass
class _Started:
    order: AgentOrder
    process: Any = None  # multiprocessing.Process (in-process)
    flow_run_id: str | None = None  # (deployment)


class RemoteAgents:
    """The other nodes' agents of one gang run, started at once, waited for together."""

    def __init__(self, orders: Sequence[AgentOrder], mode: str, cluster: Any = None) -> None:
        # ``cluster``: the GpuCluster, for in-process agents (handed over in memory, its
        # secrets with it; a deployment's agent loads the block by name on its node).
        self.orders, self.mode, self.cluster = list(orders), agent_mode(mode), cluster
        self._started: list[_Started] = []

    def __enter__(self) -> RemoteAgents:
        for order in self.orders:
            self._started.append(self._start(order))
        return self

    def __exit__(self, *exc: object) -> None:
        # This node's agent ended (or failed): the others end with it; the ones still
        # running after the grace are stopped (in-process) or left to their flow run.
        self.wait(timeout_s=120.0, raise_on_failure=exc[0] is None)

    def _start(self, order: AgentOrder) -> _Started:
        if self.mode == "deployment":
            from gpuflow.tasks.worker_queues import queue_for_node
            from prefect.deployments import run_deployment

            run = run_deployment(
                AGENT_DEPLOYMENT,
                parameters=order.parameters(),
                timeout=0,
                as_subflow=False,
                flow_run_name=f"gang-agent-{order.job_id}-{order.attempt}-{order.node}",
                idempotency_key=f"{order.job_id}:{order.attempt}:{order.node}",
                work_queue_name=queue_for_node(AGENT_DEPLOYMENT, order.node),
            )
            log.info("job %s: node %s's agent is flow run %s", order.job_id, order.node, run.id)
            return _Started(order, flow_run_id=str(run.id))
        ctx = multiprocessing.get_context("spawn")
        process = ctx.Process(
            target=_agent_process,
            args=(order.fields(), self.cluster),
            name=f"gpuflow-agent-{order.job_id}-{order.node}",
        )
        process.start()
        return _Started(order, process=process)

    def wait(self, timeout_s: float, raise_on_failure: bool = True) -> list[str]:
        """Wait for every agent; the nodes whose agent failed (raised if asked)."""
        deadline = time.monotonic() + timeout_s
        failed = [s.order.node for s in self._started if not self._ended_well(s, deadline)]
        if failed and raise_on_failure:
            raise AgentFailedError(
                f"job {self.orders[0].job_id!r}: the agent of node(s) {', '.join(failed)} failed"
            )
        return failed

    def _ended_well(self, started: _Started, deadline: float) -> bool:
        if started.process is not None:
            started.process.join(max(0.0, deadline - time.monotonic()))
            if started.process.is_alive():
                started.process.terminate()
                started.process.join(10)
                return False
            return started.process.exitcode == 0
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            while True:
                state = client.read_flow_run(started.flow_run_id).state
                if state is not None and state.is_final():
                    return bool(state.is_completed())
                if time.monotonic() >= deadline:
                    return False
                time.sleep(1.0)


def _agent_process(fields: dict[str, Any], cluster: Any) -> None:
    """An in-process agent: the `gang-agent` flow's body in a spawned process."""
    from gpuflow.tasks.training.distributed.node_agent import run_agent_order

    run_agent_order(**fields, cluster=cluster)
