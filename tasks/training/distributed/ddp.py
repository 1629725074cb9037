"""A gang's parallelism units (the Parallel of parallel.py): what every rank shares, and DDP.

``GangParallel`` is what the units of a gang share whatever they do with the model: the
batch is cut in W equal shares (B must divide by W), the logged loss is the mean of the
ranks' losses (the global batch's), every decision input comes from rank 0 by broadcast,
and checkpoints are DCP's (checkpoint.py) on a group of their own.

``DataParallel``: every rank holds the whole model; DDP averages the gradients, so a step
of W ranks on their shares of a global batch B is the step one process would take on B
(up to the order of float sums). FSDP2, the other unit, is fsdp.py's ``ShardedParallel``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from gpuflow.tasks.training.checkpoint import CheckpointManager
from gpuflow.tasks.training.distributed.checkpoint import DcpCheckpointer
from gpuflow.tasks.training.parallel import Checkpointer, OnCommit
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload


class GangParallel:
    """This rank's share of the batch, the ranks' agreement and checkpoints; subclasses
    say how the model is held (``wrap``, and ``prepare`` before a restore)."""

    def __init__(self, device: torch.device, staging: Path) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device, self.staging = device, staging
        # Async checkpoint writes talk on their own group, never inside a training step's.
        self._checkpoint_group = dist.new_group(backend="gloo")

    @property
    def primary(self) -> bool:
        return self.rank == 0

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError

    def prepare(self, w: Workload) -> None:
        """Lay the workload out before a checkpoint is loaded into it (nothing to do for a
        unit whose ranks each hold the whole model)."""

    def shard(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        per = len(x) // self.world_size
        lo = self.rank * per
        return x[lo : lo + per], y[lo : lo + per]

    def mean(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self._collective_device)
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    def agree(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._collective_device)
        return box[0]

    @property
    def _collective_device(self) -> torch.device:
        return torch.device("cpu") if dist.get_backend() == "gloo" else self.device

    def checkpointer(self, manager: CheckpointManager, on_commit: OnCommit | None) -> Checkpointer:
        return DcpCheckpointer(
            manager,
            self.staging / manager.job_id,
            self.rank,
            self._checkpoint_group,
            on_commit,
            prepare=self.prepare,
        )


class DataParallel(GangParallel):
    """Every rank holds the whole model; DDP all-reduces the gradients."""

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.device.type == "cpu":
            return DistributedDataParallel(model)
        return DistributedDataParallel(model, device_ids=[self.device])
