"""Launch and supervise a gang: torchelastic's agent, started and watched by gpuflow.

``run_gang`` runs one elastic agent in this process (torch.distributed.launcher's
``elastic_launch``, torchrun's own launcher API) that starts one rank process per leased
unit, hosts the c10d rendezvous, and restarts the whole gang from its last committed
checkpoint when a rank dies, up to ``max_restarts`` times; beyond that it raises and the
job goes the way a crashed one goes (remediation). The agent's rendezvous endpoint is on
loopback: the gang spans this node (docs/distributed.md says what multi-node needs).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuflow.hardware.backend import InvalidRequestError
from gpuflow.tasks.training.distributed.gang import (
    GangUnit,
    check_world_sizes,
    choose_backend,
    encode_plan,
)
from gpuflow.tasks.training.distributed.worker import rank_main
from gpuflow.tasks.training.spec import TrainSpec


class GangFailedError(RuntimeError):
    """The gang failed more often than its max_restarts allowed."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_gang(spec: TrainSpec, units: Sequence[GangUnit]) -> None:
    """Refuse, before anything starts, a gang that cannot split its batch or has no unit."""
    if not units:
        raise InvalidRequestError(f"job {spec.job_id!r}: a gang needs at least one unit")
    if len({u.node for u in units}) > 1:
        raise InvalidRequestError(
            f"job {spec.job_id!r}: its units span nodes {sorted({u.node for u in units})}; "
            "a gang runs on one node here"
        )
    check_world_sizes(spec.job_id, spec.resolved_batch_size, [len(units)])


def run_gang(
    spec: TrainSpec,
    storage: Any,  # a CheckpointStorage block
    units: Sequence[GangUnit],
    *,
    staging: Path,
    inventory_url: str | None = None,
    fencing_token: int | None = None,
    attempt: int = 0,
    max_restarts: int = 0,
    backend: str | None = None,
    threads_per_rank: int = 1,
    run_id: str | None = None,
    record: bool = False,
) -> dict[str, Any]:
    """Train ``spec`` as one rank per unit; returns rank 0's result (with ``ranks``).

    ``record``: each rank's result also holds its losses and checkpoint stalls (worker.py).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    check_gang(spec, units)
    chosen = choose_backend(units, backend)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=len(units),
        run_id=f"{spec.job_id}-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{_free_port()}",
        max_restarts=max_restarts,
        start_method="spawn",
        monitor_interval=0.2,
    )
    # Pickled to the ranks through the agent's spawn pipe: never on a command line, and a
    # storage's SecretStr keys stay secret (not rendered as text anywhere).
    args = (
        spec,
        storage,
        encode_plan(units),
        chosen,
        inventory_url,
        fencing_token,
        str(staging),
        attempt,
        threads_per_rank,
        run_id,
        record,
    )
    try:
        results = elastic_launch(config, rank_main)(*args)
    except ChildFailedError as exc:
        raise GangFailedError(
            f"job {spec.job_id!r}: the gang of {len(units)} failed after {max_restarts} "
            f"restart(s): {exc}"
        ) from exc
    first = dict(results[0])
    first["ranks"] = [results[r] for r in sorted(results)]
    first["backend"] = chosen
    return first
