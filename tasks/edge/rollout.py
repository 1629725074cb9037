"""A new version of a deployment beside the current one, and its outcome: promoted (the
previous version stopped) or rolled back (its own processes stopped, the previous version
keeps serving).

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
    new_version,
    set_current,
    stop_deployment,
)
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
    """Make a checked version current and active, then stop ``previous`` (a previous version
    that cannot be stopped is logged: the new one serves either way)."""
    deployment.check = check.to_dict()
    set_current(deployment.name, deployment.version)
    deployment.status = "active"
    deployment.save()
    if previous and previous != deployment.version:
        try:
            stop_deployment(Deployment.load(deployment.name, previous), "superseded")
        except EdgeDeployError as exc:
            logger.warning("could not stop previous version %s: %s", previous, exc)


# --- Prefect tasks ---------------------------------------------------------------------------
from prefect import get_run_logger, task  # noqa: E402
from prefect.cache_policies import NONE  # noqa: E402

roll_back_task = task(roll_back, name="edge-roll-back", cache_policy=NONE)


@task(name="edge-promote", cache_policy=NONE)
def promote_task(deployment: Deployment, previous: str | None, check: CheckResult) -> None:
    promote(deployment, previous, check, get_run_logger())
