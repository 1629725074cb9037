"""Heterogeneous scheduling: homogeneous gangs, partition-aware placement, preemption
through checkpoints, bounded queues, reservations, elastic jobs, regions.

The engine (engine.py) decides in memory; the service (service.py) keeps it in step with
the inventory and the control channel; the `schedule` flow drives the service. See
docs/scheduling.md.
"""

from gpuflow.tasks.scheduling.engine import Engine
from gpuflow.tasks.scheduling.model import (
    JobRequest,
    NoCapacityError,
    Placement,
    Preemption,
    QueueFullError,
    SchedulerConfig,
    SubmissionRefused,
)

__all__ = [
    "Engine",
    "JobRequest",
    "NoCapacityError",
    "Placement",
    "Preemption",
    "QueueFullError",
    "SchedulerConfig",
    "SubmissionRefused",
]
