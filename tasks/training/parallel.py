"""How many processes train one job, and how they agree: the loop's parallelism unit.

The training loop (loop.py) is written once; what differs between one process and a gang
of N ranks is behind ``Parallel``: wrapping the model (DDP; FSDP2 shards it before the
checkpointer restores, distributed/fsdp.py), taking this rank's share of
each global batch, agreeing on rank 0's inputs to every decision (the control channel's
request, the utilization reading the precision policy acts on), averaging the loss it
logs, and how checkpoints are written (one process: CheckpointManager's files; a gang:
torch.distributed.checkpoint, tasks/training/distributed/). ``SINGLE`` is the one-process
case and costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.state import full_state, restore_full

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload
OnCommit = Callable[[str, int], None]  # (checkpoint id, step), once it is committed


class Checkpointer(Protocol):
    """Saves and restores a workload; ``save`` may return before the write is committed
    (async): ``on_commit`` is called once it is, and ``flush`` waits for it."""

    def save(self, w: Workload, step: int, meta: dict[str, Any], *, blocking: bool) -> str: ...

    def restore(self, w: Workload) -> tuple[str, int] | None: ...  # (checkpoint id, step)

    def flush(self) -> None: ...


class Parallel(Protocol):
    rank: int
    world_size: int

    @property
    def primary(self) -> bool: ...

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module: ...

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def mean(self, value: float) -> float: ...

    def agree(self, value: Any) -> Any: ...

    def checkpointer(
        self, manager: CheckpointManager, on_commit: OnCommit | None
    ) -> Checkpointer: ...


class TorchCheckpointer:
    """One process: every save is CheckpointManager's, synchronous and committed at once."""

    def __init__(self, manager: CheckpointManager, on_commit: OnCommit | None) -> None:
        self.manager, self.on_commit = manager, on_commit

    def save(self, w: Workload, step: int, meta: dict[str, Any], *, blocking: bool) -> str:
        cid = self.manager.save(full_state(w, step), step, meta)
        if self.on_commit:
            self.on_commit(cid, step)
        return cid

    def restore(self, w: Workload) -> tuple[str, int] | None:
        loaded = self.manager.latest(expected_model=self.manager.expected_model)
        if loaded is None:
            return None
        return loaded.checkpoint_id, restore_full(w, loaded.state)

    def flush(self) -> None:
        return None


class Single:
    """One process, world size 1."""

    rank, world_size = 0, 1
    primary = True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, y

    def mean(self, value: float) -> float:
        return value

    def agree(self, value: Any) -> Any:
        return value

    def checkpointer(self, manager: CheckpointManager, on_commit: OnCommit | None) -> Checkpointer:
        return TorchCheckpointer(manager, on_commit)


SINGLE = Single()
