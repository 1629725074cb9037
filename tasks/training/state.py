"""What a checkpoint holds, by named key (torchtitan style): everything a step depends on.

The model and optimizer are tensors (sharded by torch.distributed.checkpoint in a gang);
the rest is small and replicated (the precision policy, the sampler's position, the RNGs,
the step), written once. ``Workload`` is tasks.training.loop's; its ``model`` here is the
plain module, never a DDP wrapper, so a checkpoint does not depend on how many ranks
wrote it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuflow.tasks.training.rng import capture_rng_state, restore_rng_state

if TYPE_CHECKING:
    from gpuflow.tasks.training.loop import Workload

MODEL, OPTIMIZER = "model", "optimizer"
PRECISION, SAMPLER, RNG, PROGRESS = "precision", "sampler", "rng", "progress"


def extra_state(w: Workload, step: int) -> dict[str, Any]:
    """The replicated, non-tensor part: the same on every rank."""
    return {
        PRECISION: w.precision.state_dict(),
        SAMPLER: w.sampler.state_dict(),
        RNG: capture_rng_state(),
        PROGRESS: {"step": step},
    }


def restore_extra(w: Workload, state: dict[str, Any]) -> int:
    """Restore the replicated part; returns the step it was saved at."""
    w.precision.load_state_dict(state[PRECISION])
    w.sampler.load_state_dict(state[SAMPLER])
    restore_rng_state(state[RNG])
    return int(state[PROGRESS]["step"])


def full_state(w: Workload, step: int) -> dict[str, Any]:
    return {
        MODEL: w.model.state_dict(),
        OPTIMIZER: w.optimizer.state_dict(),
        **extra_state(w, step),
    }


def restore_full(w: Workload, state: dict[str, Any]) -> int:
    w.model.load_state_dict(state[MODEL])
    w.optimizer.load_state_dict(state[OPTIMIZER])
    return restore_extra(w, state)
