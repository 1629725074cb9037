"""A multi-modal job on its leases: one rank per leased unit, launched by torchelastic's
agent on this node (the same launcher as the `train` flow's gangs), with the leases kept
alive while it runs and the job's state in the inventory.

The units form one gang of one SKU (the scheduler's gang placement); their roles differ
(head, vision tower, text tower: spec.py's layout), which the scheduler need not know:
the role is the rank, and the rank the rendezvous order on this node, which follows the
units' order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.hardware.inventory import JobState
from gpuflow.tasks.multimodal.spec import MultimodalSpec
from gpuflow.tasks.multimodal.worker import multimodal_rank_main
from gpuflow.tasks.training.distributed.gang import GangUnit, choose_backend, encode_plan
from gpuflow.tasks.training.distributed.job import gang_units, running_gang
from gpuflow.tasks.training.distributed.launch import free_port, launch_agent
from gpuflow.tasks.training.distributed.node_agent import device_backend_of
from gpuflow.tasks.training.distributed.relay import StepRelay
from gpuflow.tasks.training.storage import open_store


def check_units(spec: MultimodalSpec, units: Sequence[GangUnit]) -> None:
    """One unit per rank of the layout, each once, all on this node's agent."""
    layout = spec.resolved_layout
    if len(units) != layout.world_size:
        raise InvalidRequestError(
            f"job {spec.job_id!r}: layout {layout.name} ({', '.join(map('+'.join, layout.roles))}) "
            f"needs {layout.world_size} unit(s), got {len(units)}"
        )
    ids = [u.resource_id for u in units]
    if len(set(ids)) != len(ids):
        raise InvalidRequestError(f"job {spec.job_id!r}: a unit appears twice in {ids}")
    nodes = sorted({u.node for u in units})
    if len(nodes) > 1:
        raise InvalidRequestError(
            f"job {spec.job_id!r}: its units span nodes {nodes}; a multi-modal job runs on "
            "one node (its feature exchange is point to point inside the node)"
        )


def run_ranks(
    spec: MultimodalSpec,
    storage: Any,  # CheckpointStorage block, or an opened CheckpointStore
    units: Sequence[GangUnit],
    *,
    fencing_token: int | None = None,
    attempt: int = 0,
    run_id: str | None = None,
    device_backend: tuple[str, str | None] | None = None,
    record_gradients: bool = False,
) -> dict[int, dict[str, Any]]:
    """Run the job's ranks on this node to the end; every rank's result by rank."""
    from gpuflow.tasks.training.control import step_observers

    check_units(spec, units)
    backend = choose_backend(units, spec.backend)
    store = storage if hasattr(storage, "put_bytes") else open_store(storage)
    relay = StepRelay(spec.job_id, spec.steps, step_observers) if step_observers else None
    args = (
        spec,
        store,
        encode_plan(units),
        backend,
        fencing_token,
        run_id,
        device_backend,
        record_gradients,
    )
    with relay or contextlib.nullcontext():
        return launch_agent(
            multimodal_rank_main,
            (*args, relay.address if relay else None),
            nodes=1,
            nproc=len(units),
            rendezvous_id=f"{spec.job_id}-attempt-{attempt}",
            endpoint=("127.0.0.1", free_port()),
            is_host=True,
            join_timeout_s=300.0,
            max_restarts=spec.max_restarts,
            local_addr="127.0.0.1",
            what=f"multi-modal job {spec.job_id!r} ({len(units)} ranks)",
        )


def run_multimodal_job(
    spec: MultimodalSpec,
    storage: Any,  # CheckpointStorage
    cluster: Any,  # GpuCluster
    bindings: Sequence[Any],  # Binding, one per rank, rank 0's first
    run_id: str | None = None,
) -> dict[int, dict[str, Any]]:
    """Train on the leased units, leases renewed meanwhile; every rank's result."""
    attempt = bindings[0].lease.attempt
    with running_gang(cluster, spec.job_id, bindings) as inventory:
        results = run_ranks(
            spec,
            storage,
            gang_units(bindings),
            fencing_token=bindings[0].lease.token,
            attempt=attempt,
            run_id=run_id,
            device_backend=device_backend_of(cluster),
        )
    inventory.transition_job(
        spec.job_id,
        JobState.FINISHED,
        expect_attempt=attempt,
        last_checkpoint_id=results[0]["last_checkpoint"],
    )
    return results
