"""What a training process answers to besides its loop: the job's control channel as one
attempt sees it (FencedControl) and the observers that see every step (step_observers).

Imports neither Prefect nor the inventory's database layer at module level: a gang's ranks
import this, and each rank is a fresh process that should start in torch's time, not
Prefect's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuflow.tasks.training.loop import CHECKPOINT_AND_STOP, StepInfo

# Observers in this process that see every step of every job it trains (the CLI's Rich
# progress bar). Flows run in the caller's process when called directly, so a CLI can
# watch a flow it starts without the flow knowing about terminals.
step_observers: list[Callable[[str, int, StepInfo], None]] = []


class FencedControl:
    """The control channel as one attempt sees it: a checkpoint-and-stop moves the job to
    "checkpointing" (compare-and-swap on the attempt), and nothing is answered once the
    attempt's lease is lost."""

    def __init__(self, inventory: Any, job_id: str, attempt: int, keeper: Any) -> None:
        # keeper: the attempt's LeaseKeeper; None for a gang's rank 0, whose leases its
        # launcher keeps (the fencing token in every checkpoint still refuses a stale
        # attempt's writes).
        self.inventory, self.job_id, self.attempt, self.keeper = inventory, job_id, attempt, keeper

    def _check(self) -> None:
        if self.keeper is not None:
            self.keeper.check()

    def poll_control(self, job_id: str) -> Any | None:
        self._check()
        request = self.inventory.poll_control(job_id)
        if request is not None and request.action == CHECKPOINT_AND_STOP:
            from gpuflow.hardware.inventory import JobState

            self.inventory.transition_job(
                job_id, JobState.CHECKPOINTING, expect_attempt=self.attempt
            )
        return request

    def ack_control(self, request_id: Any, checkpoint_id: str) -> Any:
        self._check()
        return self.inventory.ack_control(request_id, checkpoint_id)
