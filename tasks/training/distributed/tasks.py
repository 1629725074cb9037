"""The `train` flow's gang steps as Prefect tasks (the logic is in job.py)."""

from __future__ import annotations

from typing import Any

from gpuflow.tasks.tracking import log_params, log_tags
from gpuflow.tasks.training.distributed.job import run_gang_training
from prefect import task
from prefect.cache_policies import NONE


def tag_gang(run_id: str, gang: dict[str, Any]) -> None:
    """world_size, backend, parallel (ddp | fsdp) and nodes (how many: the spec's own
    ``nodes`` param when it names them, so the two agree) as params; the units and the
    nodes' names as tags."""
    keys = ("world_size", "backend", "parallel")
    log_params(run_id, {key: gang[key] for key in keys} | {"nodes": len(gang["nodes"])})
    log_tags(
        run_id,
        {
            "gpuflow.resource_ids": ",".join(gang["resource_ids"]),
            "gpuflow.nodes": ",".join(gang["nodes"]),
        },
    )


# No task retries: torchelastic restarts a failed gang itself (spec.max_restarts) from
# its last committed checkpoint; beyond that the job fails like a crashed one.
train_gang_task = task(run_gang_training, name="train-gang", cache_policy=NONE)
tag_gang_task = task(tag_gang, name="tag-gang", cache_policy=NONE)
