"""The training loop of one rank of a multi-modal job, read top to bottom.

Every rank runs it in a joined process group (world size 1 for the single layout): build
this rank's parts from the seed, restore the newest checkpoint, then per step load this
rank's modality of the batch (DataLoader worker processes preprocess it; every rank's
sampler draws the same rows, so the vision rank's images and the text rank's captions are
the same pairs), run the step (step.py), step the optimizers, and checkpoint every
``checkpoint_interval`` steps and at the end (checkpoint.py, a collective).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from gpuflow.tasks.multimodal.checkpoint import restore_parts, save_parts
from gpuflow.tasks.multimodal.data import CaptionedDigits, StepBatchSampler, Tokenizer, make_loader
from gpuflow.tasks.multimodal.memory import ActivationMeter, memory_report
from gpuflow.tasks.multimodal.model import TEXT, VISION, build_part, clip_config, trainable
from gpuflow.tasks.multimodal.spec import Layout, MultimodalSpec
from gpuflow.tasks.multimodal.step import train_step
from gpuflow.tasks.training.checkpoint import CheckpointManager

MODALITY = {(VISION,): "image", (TEXT,): "text", (VISION, TEXT): "both"}


@dataclass
class MultimodalStep:
    """What rank 0 tells its step hooks (the CLI's progress bar reads step, loss and
    precision, as for the `train` flow's StepInfo)."""

    step: int
    loss: float
    step_time_s: float
    samples_per_s: float
    precision: str = "fp32"


def model_config(spec: MultimodalSpec) -> Any:
    tokenizer = Tokenizer()
    return clip_config(
        spec.size, vocab_size=tokenizer.vocab_size, context_length=tokenizer.context_length
    )


def fingerprint(spec: MultimodalSpec) -> str:
    return model_config(spec).fingerprint(spec.text_int8)


def build_optimizer(spec: MultimodalSpec, module: torch.nn.Module) -> torch.optim.AdamW:
    """AdamW with CLIP's betas and eps; no decay on gains, biases and the temperature."""
    params = trainable(module)
    decay = [p for p in params if p.ndim >= 2]
    other = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": spec.weight_decay}]
    if other:
        groups.append({"params": other, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, lr=spec.lr, betas=(0.9, 0.98), eps=1e-6)


def learning_rate(spec: MultimodalSpec, step: int) -> float:
    """Linear warm-up, then constant: a function of the step, so a resume needs no state."""
    if spec.warmup_steps == 0:
        return spec.lr
    return spec.lr * min(1.0, (step + 1) / spec.warmup_steps)


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def _steady_mean(values: list[float]) -> float:
    """The mean without the first step, which pays for start-up (workers, allocator)."""
    steady = values[1:] or values
    return sum(steady) / max(len(steady), 1)


def train_rank(
    spec: MultimodalSpec,
    store: Any,  # CheckpointStore
    layout: Layout,
    rank: int,
    device: torch.device,
    *,
    fencing_token: int | None = None,
    hooks: Sequence[Callable[[MultimodalStep], None]] = (),
    probe: Any = None,  # DeviceUtilization of this rank's unit (the twin's load), or None
    record_gradients: bool = False,
) -> dict[str, Any]:
    """Train this rank's parts to ``spec.steps``; returns this rank's figures."""
    mine = layout.roles[rank]
    config = model_config(spec)
    parts = {
        p: build_part(
            p, config, spec.seed, checkpointing=spec.checkpointing, text_int8=spec.text_int8
        ).to(device)
        for p in mine
    }
    optimizers = {p: build_optimizer(spec, m) for p, m in parts.items()}
    manager = CheckpointManager(
        store,
        spec.job_id,
        keep_last=spec.keep_last,
        expected_model=config.fingerprint(spec.text_int8),
        fencing_token=fencing_token,
    )
    restored, start = restore_parts(manager, parts, optimizers)

    towers = tuple(t for t in (VISION, TEXT) if t in mine)
    batches: Any = iter(())
    if towers:
        dataset = CaptionedDigits(
            "train", seed=spec.seed, image_size=config.image_size, modality=MODALITY[towers]
        )
        sampler = StepBatchSampler(
            len(dataset), spec.batch_size, spec.seed, start_step=start, steps=spec.steps - start
        )
        loader = make_loader(
            dataset, sampler, workers=spec.workers, pin_memory=device.type == "cuda"
        )
        batches = iter(loader)

    meter = ActivationMeter()
    losses: list[float] = []
    step_times: list[float] = []
    compute_times: list[float] = []
    by_part: dict[str, list[float]] = {p: [] for p in mine}
    gradients: dict[str, dict[str, torch.Tensor]] = {}
    last_checkpoint = restored
    for step in range(start, spec.steps):
        began = time.perf_counter()
        batch = _to(next(batches), device) if towers else {}
        for optimizer in optimizers.values():
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(spec, step)
        compute_s: dict[str, float] = {}
        with meter.step():
            loss = train_step(
                parts,
                batch,
                layout,
                rank,
                batch_size=spec.batch_size,
                embed_dim=config.embed_dim,
                micro_batches=spec.micro_batches,
                device=device,
                compute_s=compute_s,
            )
        if record_gradients and step == start:
            gradients = {
                p: {
                    n: q.grad.detach().cpu().clone()
                    for n, q in m.named_parameters()
                    if q.grad is not None
                }
                for p, m in parts.items()
            }
        for optimizer in optimizers.values():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        busy = sum(compute_s.values())
        for part, seconds in compute_s.items():
            by_part[part].append(seconds)
        if probe is not None:
            probe.pace(busy)  # the twin's device time beyond the host's
            probe.observe_step(busy, time.perf_counter() - began)
        done = step + 1
        if done % spec.checkpoint_interval == 0 or done == spec.steps:
            meta = {"model_name": spec.size, "model_fingerprint": manager.expected_model}
            last_checkpoint = save_parts(manager, parts, optimizers, done, meta) or last_checkpoint
        wall = time.perf_counter() - began
        step_times.append(wall)
        compute_times.append(busy)
        if loss is not None:
            losses.append(float(loss))
            info = MultimodalStep(done, float(loss), wall, spec.batch_size / wall)
            for hook in hooks:
                hook(info)

    # The first step pays for start-up (workers, allocator): rates leave it out.
    steady = step_times[1:] or step_times
    result: dict[str, Any] = {
        "rank": rank,
        "role": layout.role_name(rank),
        "steps_done": spec.steps,
        "resumed_from_step": start,
        "last_checkpoint": last_checkpoint,
        "losses": losses,
        "final_loss": losses[-1] if losses else None,
        # None when the job had no step left to run (its checkpoint was at spec.steps).
        "step_time_s": sum(steady) / len(steady) if steady else None,
        "compute_s_per_step": _steady_mean(compute_times),
        "compute_s_by_part": {p: _steady_mean(t) for p, t in by_part.items()},
        "samples_per_s": spec.batch_size * len(steady) / sum(steady) if steady else None,
        "memory": memory_report(device, parts.values(), optimizers.values(), meter),
    }
    if record_gradients:
        result["gradients"] = gradients
    return result
