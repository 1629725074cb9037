"""A multi-modal job's checkpoints: every part's weights and optimizer state, in the same
storage and under the same manifest as every other job (tasks/training/checkpoint.py).

A checkpoint does not depend on the layout: one file per part (``vision``, ``text``,
``head``, each {"model", "optimizer"}) and ``progress`` (the step), whichever rank held
the part. The parts travel to rank 0 (gather_object on the gang's communicator), which
commits them with its lease's fencing token; a restore goes the other way (rank 0 reads
and verifies the newest checkpoint, each rank takes its parts). So a job checkpointed in
one layout resumes in the other. Gathering to one rank suits these model sizes (the
largest is ~0.6 GB of weights and Adam state); beyond that the parts would be written by
their own ranks with torch.distributed.checkpoint, as the `train` flow's gangs do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from gpuflow.tasks.multimodal.model import PARTS, ClipConfig, ClipModel
from gpuflow.tasks.training.checkpoint import CheckpointManager

MODEL, OPTIMIZER, PROGRESS, STEP = "model", "optimizer", "progress", "step"


def _cpu(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.detach().cpu()
    if isinstance(state, dict):
        return {k: _cpu(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(_cpu(v) for v in state)
    return state


def save_parts(
    manager: CheckpointManager,
    parts: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
    step: int,
    meta: dict[str, Any],
) -> str | None:
    """Collective: every rank gives its parts; rank 0 commits. Returns the id on rank 0."""
    mine = {
        p: {MODEL: _cpu(parts[p].state_dict()), OPTIMIZER: _cpu(optimizers[p].state_dict())}
        for p in parts
    }
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    if dist.get_rank() != 0:
        return None
    state = {p: s for held in gathered for p, s in held.items()}
    missing = [p for p in PARTS if p not in state]
    if missing:
        raise RuntimeError(f"checkpoint at step {step}: no rank holds parts {missing}")
    return manager.save({**state, PROGRESS: {STEP: step}}, step, meta)


def restore_parts(
    manager: CheckpointManager,
    parts: dict[str, torch.nn.Module],
    optimizers: dict[str, torch.optim.Optimizer],
) -> tuple[str | None, int]:
    """Collective: (the checkpoint id, its step) loaded into this rank's parts; (None, 0)
    when the job has none."""
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        loaded = manager.latest()
        if loaded is not None:
            box[0] = (loaded.checkpoint_id, loaded.state)
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        return None, 0
    checkpoint_id, state = box[0]
    for part, module in parts.items():
        module.load_state_dict(state[part][MODEL])
        optimizers[part].load_state_dict(state[part][OPTIMIZER])
    return checkpoint_id, int(state[PROGRESS][STEP])


def load_model(
    manager: CheckpointManager, config: ClipConfig, text_int8: bool = False
) -> tuple[ClipModel, int] | None:
    """The whole model from the job's newest checkpoint, for evaluation; None if none."""
    loaded = manager.latest()
    if loaded is None:
        return None
    model = ClipModel.build(config, 0, text_int8=text_int8)
    for part in PARTS:
        model.part(part).load_state_dict(loaded.state[part][MODEL])
    return model, loaded.step
