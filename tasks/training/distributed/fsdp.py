"""ShardedParallel: this rank's view of a gang training with FSDP2 (``parallel="fsdp"``).

Each rank holds 1/W of every parameter, gradient and optimizer state (DTensors sharded on
dim 0 of a 1-D DeviceMesh over the gang). ``fully_shard`` goes on every block of the model
(a transformer block, a residual block) and then on the root, which keeps the rest: the
embedding with the output projection tied to it (they must stay in one group), the
norms, a ResNet's stem and head. Before a block runs, its parameters are all-gathered;
after its backward, the gradients are reduce-scattered, averaged over the ranks like DDP's,
so a step of W ranks on their shares of a global batch is one process's step on it (up to
the order of float sums). Batch shares, the loss mean, rank 0's decisions and checkpoints
are the same as under DDP (ddp.py's GangParallel).

Precision. FSDP2 fixes the dtype it gathers parameters in when the model is sharded,
while the loop's precision policy (precision.py) chooses an autocast dtype step by step:

* ``bf16``: ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: parameters are
  gathered and computed in bf16, gradients reduced in fp32, the shards (what the optimizer
  steps) stay fp32. The policy is fixed: when the numeric guard falls back to "fp32" for a
  while, autocast is off but the parameters still arrive in bf16; ``auto`` is the policy
  whose fp32 is real.
* ``fp32``, ``auto``, ``fp16``: no FSDP policy (fp32 shards, gathered and reduced in fp32)
  and the loop's autocast on top, switching as it does under DDP. In fp16 the GradScaler
  sees DTensor gradients; DTensor's handler of the scaler's inf/NaN check takes the max
  over the ranks, so every rank skips the same steps.

BatchNorm statistics (the ResNets) stay per rank: FSDP2 shards parameters only and, unlike
DDP, does not broadcast buffers before each forward. Training steps use batch statistics;
eval runs on each rank's own, and a checkpoint keeps one rank's.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from gpuflow.tasks.training.distributed.ddp import GangParallel
from gpuflow.tasks.training.models import BasicBlock, Bottleneck
from gpuflow.tasks.training.models.llama import TransformerBlock
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload

# The repeated units of the registry's models: one all-gather / reduce-scatter group each.
BLOCKS: tuple[type[torch.nn.Module], ...] = (TransformerBlock, BasicBlock, Bottleneck)


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that get their own ``fully_shard`` before the root does (FSDP2 groups
    bottom-up): each outermost block; a block inside another stays in its parent's group."""
    units: list[torch.nn.Module] = []
    for module in model.modules():
        if module is model or not isinstance(module, BLOCKS):
            continue
        if not any(module in u.modules() for u in units):
            units.append(module)
    return units


def mixed_precision(policy: str) -> MixedPrecisionPolicy:
    """FSDP2's policy for the job's precision policy (see the module docstring)."""
    if policy == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()  # fp32 shards, gathered and reduced as they are


class ShardedParallel(GangParallel):
    """FSDP2 over the whole gang: the model is sharded in ``prepare``, before a restore
    (so DCP loads each rank's shards), and ``wrap`` hands the sharded model back."""

    def __init__(self, device: torch.device, staging: Path, precision: str) -> None:
        super().__init__(device, staging)
        self.mp_policy = mixed_precision(precision)
        # "cpu" on the twin (gloo), "cuda" on GPUs and DCUs: the device FSDP2 gathers on.
        self.mesh = init_device_mesh(device.type, (self.world_size,))

    def prepare(self, w: Workload) -> None:
        if isinstance(w.model, FSDPModule):
            return
        if w.optimizer.state:
            raise RuntimeError("FSDP2 shards a model before its optimizer has stepped")
        before = dict(w.model.named_parameters())
        for unit in shard_units(w.model):
            fully_shard(unit, mesh=self.mesh, mp_policy=self.mp_policy)
        fully_shard(w.model, mesh=self.mesh, mp_policy=self.mp_policy)
        # fully_shard puts new (DTensor) Parameters on the modules; the loop built its
        # optimizer on the old ones, so point its groups at the shards (no state yet).
        after = dict(w.model.named_parameters())
        moved = {id(p): after[name] for name, p in before.items()}
        for group in w.optimizer.param_groups:
            group["params"] = [moved[id(p)] for p in group["params"]]

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        # The loop restores (and so prepares) before it wraps; a model that is not sharded
        # here has an optimizer on parameters FSDP2 would replace.
        if not isinstance(model, FSDPModule):
            raise RuntimeError(
                "ShardedParallel.wrap: the model is not sharded; prepare(workload) first "
                "(the checkpointer's restore does), so the optimizer steps the shards"
            )
        return model
