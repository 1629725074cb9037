"""One step in one process: micro-batching as gradient caching keeps the full-batch
negatives (the branch layout's step across processes is in test_job.py)."""

from __future__ import annotations

import torch
from gpuflow.tasks.multimodal.data import CaptionedDigits, StepBatchSampler, make_loader
from gpuflow.tasks.multimodal.model import PARTS, ClipModel, clip_config
from gpuflow.tasks.multimodal.spec import layout_for
from gpuflow.tasks.multimodal.step import train_step

CONFIG = clip_config("clip-tiny", vocab_size=39, context_length=16)
BATCH = 24


def _batch() -> dict[str, torch.Tensor]:
    data = CaptionedDigits("train", seed=0)
    return next(
        iter(
            make_loader(
                data, StepBatchSampler(len(data), BATCH, 0, steps=1), workers=0, pin_memory=False
            )
        )
    )


def _step(micro_batches: int) -> tuple[float, dict[str, torch.Tensor]]:
    model = ClipModel.build(CONFIG, seed=0)
    parts = {p: model.part(p) for p in PARTS}
    timing: dict[str, float] = {}
    loss = train_step(
        parts,
        _batch(),
        layout_for("single"),
        0,
        batch_size=BATCH,
        embed_dim=CONFIG.embed_dim,
        micro_batches=micro_batches,
        compute_s=timing,
    )
    assert set(timing) == set(PARTS) and all(t > 0 for t in timing.values())
    return float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_micro_batches_give_the_full_batch_loss_and_gradients() -> None:
    loss, grads = _step(1)
    for micro in (2, 4):
        loss_m, grads_m = _step(micro)
        assert abs(loss_m - loss) < 1e-5
        worst = max(float((grads[n] - grads_m[n]).abs().max()) for n in grads)
        print(f"micro-batches {micro}: max |grad difference| {worst:.2e}")
        assert worst < 1e-5


def test_a_loss_per_micro_batch_would_change_the_negatives() -> None:
    """What the step avoids: InfoNCE taken per micro-batch sees a quarter of the
    negatives, and its loss and gradients are another function."""
    model = ClipModel.build(CONFIG, seed=0)
    batch = _batch()
    with torch.no_grad():
        whole = float(model(batch["image"], batch["tokens"]))
        pieces = zip(batch["image"].chunk(4), batch["tokens"].chunk(4), strict=True)
        per_piece = sum(float(model(i, t)) for i, t in pieces) / 4
    assert abs(whole - per_piece) > 0.5  # log(24) vs log(6) at init: about 1.4 apart
