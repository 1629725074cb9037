"""Incidents left open by a remediation run that is gone: which to finish, which to undo.

A run holds its incident by a claim it renews on a timer; a run that was killed, or whose
host went away, stops renewing and its claim lapses (ledger.incident_claim_ttl_s). Such an
incident is *abandoned*: still "open", no live claim. The `reconcile` flow takes each over
and re-runs its steps (they are idempotent: the cordon is there, the jobs are marked for
the device, a reservation left behind is used again). An incident that keeps killing its
runs (MAX_TAKEOVERS takeovers) is rolled back instead: unused reservations given back,
jobs left checkpointed and queued, the cordon lifted if nothing was moved, closed failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.remediation.ledger import Ledger
from prefect import task
from prefect.cache_policies import NONE

MAX_TAKEOVERS = 3
FINISH, ROLL_BACK = "finish", "roll back"


@dataclass(frozen=True)
class Reconciliation:
    """What the reconciler does with one abandoned incident."""

    incident_id: str
    device: str  # NODE:INDEX
    phase: str  # how far its last run got
    takeovers: int
    action: str  # finish | roll back

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def abandoned_incidents(ledger: Ledger, max_takeovers: int = MAX_TAKEOVERS) -> list[Reconciliation]:
    """Every abandoned incident, oldest first, with what to do about it."""
    if isinstance(max_takeovers, bool) or not isinstance(max_takeovers, int) or max_takeovers < 1:
        raise InvalidRequestError(f"max_takeovers must be an int >= 1, got {max_takeovers!r}")
    return [
        Reconciliation(
            i.incident_id,
            i.device,
            i.phase,
            i.takeovers,
            ROLL_BACK if i.takeovers >= max_takeovers else FINISH,
        )
        for i in ledger.abandoned()
    ]


abandoned_incidents_task = task(
    abandoned_incidents, name="find-abandoned-incidents", retries=2, cache_policy=NONE
)
