"""A new version of a deployment beside the current one, and its outcome: promoted (the
previous version kept running as the standby: blue/green) or rolled back (its own processes
stopped, the previous version keeps serving); and, after a promotion, ``rollback``: the
standby serves again, at the same stable endpoint, and the promoted version is stopped.

Plain functions first (tests call them without Prefect), task wrappers at the bottom.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from gpuflow.tasks.edge.deploy import (
    Deployment,
    EdgeDeployError,
    Mode,
    current_version,
    list_versions,
    new_version,
    set_current,
    shard_alive,
    stop_deployment,
    wait_ready,
)
from gpuflow.tasks.edge.supervise import deployment_lock
from gpuflow.tasks.edge.verify import CheckResult

log = logging.getLogger(__name__)

Logger = logging.Logger | logging.LoggerAdapter


def start_version(name: str, model: str, mode: Mode) -> tuple[str | None, Deployment]:
    """The version now current (None: none) and the record of a new one, saved as planning."""
    previous = current_version(name)
    deployment = Deployment(name, new_version(name), model, mode, "planning")
    deployment.save()
    return previous, deployment


@contextmanager
def failed_build(deployment: Deployment) -> Iterator[Deployment]:
    """A build (export to launch) that raises leaves its deployment saved as failed, with the
    error as its note."""
    try:
        yield deployment
    except BaseException as exc:
        deployment.status = "failed"
        deployment.note = f"{type(exc).__name__}: {exc}"
        deployment.save()
        raise


def roll_back(deployment: Deployment, previous: str | None, check: CheckResult) -> str:
    """Stop a version whose check failed; ``previous`` (if any) keeps serving. Returns the
    note saved on the deployment (status rolled-back, or failed when there is no previous)."""
    rolled_back = previous is not None
    deployment.check = check.to_dict()
    stop_deployment(deployment, "rolled-back" if rolled_back else "failed")
    reason = check.error or f"max abs diff {check.max_abs_diff:.3g} > atol {check.atol:g}"
    deployment.note = f"check failed ({reason}); " + (
        f"rolled back to {previous}" if rolled_back else "no previous version to keep"
    )
    deployment.save()
    return deployment.note


def promote(
    deployment: Deployment, previous: str | None, check: CheckResult, logger: Logger = log
) -> None:
    """Make a checked version current and active. ``previous`` keeps running as the standby
    that ``rollback`` returns to; an older standby is stopped (superseded). A previous
    version that cannot be kept is logged: the new one serves either way."""
    name = deployment.name
    deployment.check = check.to_dict()
    deployment.status = "active"
    deployment.save()
    set_current(name, deployment.version)
    for version in list_versions(name):
        if version == deployment.version:
            continue
        try:
            other = Deployment.load(name, version)
        except EdgeDeployError:  # a version folder whose record never got written
            continue
        if version == previous:
            other.status, other.note = "standby", f"kept for a rollback of {deployment.version}"
            other.save()
        elif other.status in ("standby", "active", "degraded"):
            stop_deployment(other, "superseded")
    if previous and previous not in list_versions(name):
        logger.warning("could not keep previous version %s as standby: it does not exist", previous)


def rollback(name: str, ready_timeout_s: float = 30.0) -> Deployment:
    """After a promotion: the standby version serves again (at the same stable endpoint)
    and the current one is stopped as rolled-back. Returns the version now serving."""
    with deployment_lock(name):
        current = current_version(name)
        if current is None:
            raise EdgeDeployError(f"no current version of edge deployment {name!r}")
        standby = [
            v for v in reversed(list_versions(name)) if Deployment.load(name, v).status == "standby"
        ]
        if not standby:
            raise EdgeDeployError(
                f"{name}: no standby version to roll back to (the version promoted before "
                f"{current} is kept running for this until the next promotion)"
            )
        back = Deployment.load(name, standby[0])
        if not all(shard_alive(s) for s in back.shards):
            raise EdgeDeployError(
                f"{name}: standby {back.version}'s processes are gone; nothing rolled back"
            )
        wait_ready(back, timeout_s=ready_timeout_s)
        back.status, back.note = "active", f"serving again: {current} rolled back on request"
        back.save()
        set_current(name, back.version)  # the endpoint follows from its next call
        now = Deployment.load(name, current)
        stop_deployment(now, "rolled-back")
        now.note = f"rolled back to {back.version} on request"
        now.save()
        return back


# --- Prefect tasks ---------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

roll_back_task = task(roll_back, name="edge-roll-back", cache_policy=NONE)


rollback_task = task(rollback, name="edge-rollback", cache_policy=NONE)


@task(name="edge-promote", cache_policy=NONE)
def promote_task(deployment: Deployment, previous: str | None, check: CheckResult) -> None:
    promote(deployment, previous, check, get_run_logger())
