"""A gang job on its leases: what run_training is for one device, for N.

The launcher's process keeps every unit's lease alive (one LeaseKeeper over all of them,
renewed in one statement) while torchelastic's agent runs the ranks; the job moves to
running, then to finished or stopped with its last committed checkpoint. The ranks write
checkpoints with the leases' fencing token, so a stale attempt's writes are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.home import gpuflow_home
from gpuflow.hardware.inventory import JobState
from gpuflow.hardware.inventory.keeper import LeaseKeeper
from gpuflow.tasks.training.distributed.gang import GangUnit
from gpuflow.tasks.training.distributed.launch import run_gang
from gpuflow.tasks.training.loop import TrainResult
from gpuflow.tasks.training.spec import TrainSpec

LEASE_TTL_S = 300.0
_RESULT_FIELDS = tuple(TrainResult.__dataclass_fields__)


def gang_units(bindings: Sequence[Any]) -> list[GangUnit]:
    return [GangUnit.of(b.resource, b.backend_name) for b in bindings]


def run_gang_training(
    spec: TrainSpec,
    storage: Any,  # CheckpointStorage
    cluster: Any,  # GpuCluster
    bindings: Sequence[Any],  # Binding, one per unit, the primary first
    run_id: str | None = None,
) -> tuple[TrainResult, dict[str, Any]]:
    """Train ``spec`` as one rank per binding; (rank 0's result, the gang's report)."""
    inventory = cluster.get_inventory()
    attempt = bindings[0].lease.attempt
    ids = [b.resource.resource_id for b in bindings]
    keeper = LeaseKeeper(inventory, spec.job_id, attempt, ids, LEASE_TTL_S)
    with keeper:
        inventory.transition_job(spec.job_id, JobState.RUNNING, expect_attempt=attempt)
        out = run_gang(
            spec,
            storage,
            gang_units(bindings),
            staging=gpuflow_home() / "gangs",
            inventory_url=inventory.url,
            fencing_token=bindings[0].lease.token,
            attempt=attempt,
            max_restarts=spec.max_restarts,
            backend=spec.backend,
            run_id=run_id,
        )
        keeper.check()
    result = TrainResult(
        **{k: v for k, v in out.items() if k in _RESULT_FIELDS and k != "switches"}
    )
    inventory.transition_job(
        spec.job_id,
        JobState.STOPPED if result.stopped_by_request else JobState.FINISHED,
        expect_attempt=attempt,
        last_checkpoint_id=result.last_checkpoint,
    )
    report = {
        "world_size": out["world_size"],
        "backend": out["backend"],
        "nodes": sorted({b.resource.node for b in bindings}),
        "resource_ids": ids,
    }
    return result, report
