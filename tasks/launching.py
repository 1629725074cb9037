"""Starting a placed job: one interface for the scheduler, remediation and the train flow.

A *launch order* is one attempt of a job on the resource it was placed on (a scheduling
pass's decision, or remediation's reservation), with the `train` flow's parameters. A
``Launcher`` starts it:

* ``DeploymentLauncher`` (here) - the `train` deployment through ``run_deployment``, on the
  work queue of the worker that owns the node (tasks/worker_queues.py); a Kubernetes work
  pool also gets the placement's job variables. Every run carries the idempotency key of
  (job, attempt): the Prefect server creates one flow run per key and deployment however
  often it is asked (a retried task, a second signal while a relaunch is in flight, the
  scheduler and remediation both launching one placement), so an attempt starts once.
* ``InProcessLauncher`` (tasks.remediation.launch) - a thread of this process.
* ``InlineLauncher`` (tasks.scheduling.runner) - the job, to its end, inside the calling
  `schedule` flow run (a laptop, CI).

In-process launchers have no server to deduplicate for them: they start an attempt only
if they are the ones that moved it from placed to launching (``Inventory.mark_launching``,
a compare-and-swap), so of two launchers of one attempt exactly one runs it.

Every job's launch record (tasks.remediation.launch.remember_launch) names the kind of
launcher that started it, so whoever starts it again uses the same kind.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

from gpuflow.blocks.checkpoint_storage import CheckpointStorage
from gpuflow.hardware.backend import HardwareError
from gpuflow.tasks.worker_queues import queue_for_node

TRAIN_DEPLOYMENT = "train/train"


class LaunchError(HardwareError):
    """A job could not be started (no launch record, no deployment...)."""


class AlreadyLaunchedError(LaunchError):
    """This attempt of the job was started already (by another launcher, or before)."""


def idempotency_key(job_id: str, attempt: int) -> str:
    """The key of one attempt of one job: the same for every launcher that starts it."""
    return f"gpuflow.job/{job_id}/attempt-{attempt}"


@dataclass(frozen=True)
class LaunchOrder:
    """Start attempt ``attempt`` of ``job_id`` on ``resource_id`` (on ``node``)."""

    job_id: str
    attempt: int
    resource_id: str
    node: str
    # The `train` flow's parameters (spec, device, storage, cluster_block...).
    parameters: dict[str, Any] = field(default_factory=dict)
    # For Kubernetes work pools: the placement's pod settings (tasks/scheduling/env.py).
    job_variables: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return idempotency_key(self.job_id, self.attempt)

    @property
    def where(self) -> dict[str, Any]:
        return {"node": self.node, "resource_id": self.resource_id, "attempt": self.attempt}


@dataclass(frozen=True)
class LaunchReceipt:
    """What a launcher did with an order."""

    launcher: str
    job_id: str
    attempt: int
    # False: this attempt was already started, by this or another in-process launcher.
    started: bool
    flow_run_id: str | None = None
    deployment: str | None = None
    result: dict[str, Any] | None = None  # an inline launch: the job's outcome

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v is not None}


class Launcher(abc.ABC):
    """Starts one attempt of a job on its placement."""

    name: ClassVar[str]

    @abc.abstractmethod
    def launch(self, order: LaunchOrder) -> LaunchReceipt:
        """Start ``order``; starting an attempt that already started starts nothing."""


def pin_units(resource_ids: Any) -> dict[str, Any]:
    """The `train` flow's device parameter pinned to these units (one, or a gang's)."""
    ids = list(resource_ids)
    return {"resource_id": ids[0]} if len(ids) == 1 else {"resource_ids": ids}


def storage_fields(storage: CheckpointStorage) -> dict[str, Any]:
    """The storage's fields without credentials. An access key without its secret is
    refused by CheckpointStorage, so both go: a storage rebuilt from these falls back to
    boto3's credential chain (save the storage as a block to keep explicit keys)."""
    hidden = {"secret_access_key", "access_key_id", "block_type_slug"}
    return storage.model_dump(exclude=hidden)


def deployment_target(name: str) -> tuple[bool, bool]:
    """(the deployment exists, its work pool is a Kubernetes one)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            return False, False
        pool_name = getattr(deployment, "work_pool_name", None)
        if not pool_name:
            return True, False
        try:
            pool = client.read_work_pool(pool_name)
        except ObjectNotFound:
            return True, False
        return True, str(getattr(pool, "type", "")).startswith("kubernetes")


class DeploymentLauncher(Launcher):
    """The `train` deployment, one flow run per (job, attempt), on the node's queue."""

    name = "deployment"

    def __init__(self, deployment: str = TRAIN_DEPLOYMENT) -> None:
        self.deployment = deployment

    def launch(self, order: LaunchOrder) -> LaunchReceipt:
        from prefect.deployments import run_deployment

        exists, kubernetes = deployment_target(self.deployment)
        if not exists:
            raise LaunchError(
                f"cannot start deployment {self.deployment!r} for job {order.job_id!r}: it is "
                "not deployed on this Prefect server (`gpuflow up` applies prefect.yaml)"
            )
        try:
            flow_run = run_deployment(
                self.deployment,
                parameters=order.parameters,
                timeout=0,  # fire and forget: the scheduler's next pass reaps it
                as_subflow=False,  # the job is not a child of whoever launched it
                job_variables=(order.job_variables or None) if kubernetes else None,
                flow_run_name=f"train-{order.job_id}-{order.attempt}",
                idempotency_key=order.key,
                # Where workers own nodes, the run goes to the worker of its node.
                work_queue_name=queue_for_node(self.deployment, order.node),
            )
        except Exception as exc:  # the server refused it: say which job and deployment
            raise LaunchError(
                f"cannot start deployment {self.deployment!r} for job {order.job_id!r}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return LaunchReceipt(
            self.name,
            order.job_id,
            order.attempt,
            started=True,  # or the run already made for this key: the server deduplicates
            flow_run_id=str(flow_run.id),
            deployment=self.deployment,
        )
