"""A training job's progress, published to the inventory for the DVFS controller.

The controller (tasks/energy/controller.py) runs in another process and times the job by
its progress (Inventory.report_progress / job_progress). ``progress_publisher`` is the
step hook a job adds (tasks.training.loop hooks); it writes at most every ``every_s`` so a
fast loop does not turn every step into a database write. The controller divides by units
between two reports' own timestamps, so publishing once a second costs it no accuracy.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import Inventory

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import StepInfo

DEFAULT_EVERY_S = 1.0

log = logging.getLogger(__name__)


def progress_publisher(
    inventory: Inventory,
    job_id: str,
    every_s: float = DEFAULT_EVERY_S,
    clock: Callable[[], float] = time.monotonic,
    *,
    attempt: int | None = None,
    unit: str = "step",
) -> Callable[[StepInfo], None]:
    """A step hook that reports ``info.step`` as ``job_id``'s progress: the first step at
    once, then at most every ``every_s`` of ``clock``. ``attempt``: the job's attempt
    (default: the registry's). A failed write is logged, not raised: progress is advisory
    (the controller's next window is just longer), and a training step must not die of it."""
    if not isinstance(job_id, str) or not job_id.strip():
        raise InvalidRequestError(f"job_id must be a non-empty string, got {job_id!r}")
    if (
        isinstance(every_s, bool)
        or not isinstance(every_s, int | float)
        or not math.isfinite(every_s)
        or every_s < 0
    ):
        raise InvalidRequestError(f"every_s must be a number of seconds >= 0, got {every_s!r}")
    last: list[float] = []  # when it last wrote (clock); empty until the first step

    def publish(info: StepInfo) -> None:
        t = clock()
        if last and t - last[0] < every_s:
            return
        try:
            inventory.report_progress(job_id, info.step, unit=unit, attempt=attempt)
        except InvalidRequestError:
            raise  # a bug (wrong unit, bad attempt): say so, it will not heal itself
        except Exception as exc:  # the database away for a moment: the next step retries
            log.warning("job %s: progress at step %s not published: %s", job_id, info.step, exc)
            return
        last[:] = [t]

    return publish
