"""One training step of the dual encoder, on whichever parts this rank holds.

    vision rank:  images ─ vision ─ features ──send──┐            ┌──recv── d loss/d features ─ backward
    text rank:    tokens ─ text   ─ features ──send──┼─ head rank ┤
                                                     └ loss over ─┘──send── d loss/d features ─ backward
                                                       the batch

The towers compute at the same time (they are parallel branches: neither needs the
other's output). The head receives both towers' features of the whole batch, computes the
symmetric InfoNCE loss and its gradients with respect to the features, and sends each
tower its gradient; each tower then backpropagates that into its own weights. Features
and their gradients travel point to point on the gang's communicator (gloo on CPUs; NCCL,
device to device, on GPUs). A part on the same rank as the head skips the wire.

Micro-batching is gradient caching (GradCache, Gao et al. 2021): a tower computes the
features of each micro-batch without keeping a graph, the head still takes the loss over
the whole batch, and the tower then recomputes each micro-batch with a graph and
backpropagates its slice of the feature gradients. The negatives stay full-batch; a
pipeline that took a loss per micro-batch would silently train on fewer negatives.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist
from gpuflow.tasks.multimodal.model import HEAD, TEXT, VISION
from gpuflow.tasks.multimodal.spec import Layout
from torch import nn

TOWER_INPUT = {VISION: "image", TEXT: "tokens"}
_TAG = {VISION: 1, TEXT: 2}  # gloo matches messages by tag; NCCL by call order per pair


def tower_forward(
    tower: nn.Module, inputs: torch.Tensor, micro_batches: int
) -> tuple[torch.Tensor, Callable[[torch.Tensor], None]]:
    """(features without a graph, a function that backpropagates their gradient)."""
    if micro_batches == 1:
        out = tower(inputs)
        return out.detach(), lambda grad: out.backward(grad)
    pieces = inputs.chunk(micro_batches)
    with torch.no_grad():
        features = torch.cat([tower(p) for p in pieces])

    def backward(grad: torch.Tensor) -> None:
        for piece, piece_grad in zip(pieces, grad.chunk(micro_batches), strict=True):
            tower(piece).backward(piece_grad)

    return features, backward


@contextlib.contextmanager
def _timed(timing: dict[str, float], part: str) -> Iterator[None]:
    began = time.perf_counter()
    try:
        yield
    finally:
        timing[part] = timing.get(part, 0.0) + time.perf_counter() - began


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


def train_step(
    parts: dict[str, nn.Module],
    batch: dict[str, torch.Tensor],
    layout: Layout,
    rank: int,
    *,
    batch_size: int,
    embed_dim: int,
    micro_batches: int = 1,
    device: torch.device | None = None,
    compute_s: dict[str, float] | None = None,
) -> torch.Tensor | None:
    """Forward and backward of this rank's parts (gradients accumulate in them; the
    caller steps the optimizers). Returns the loss on the head's rank, None elsewhere.
    With every part on this rank (the single layout) nothing is sent: no process group
    is needed, and this is the single-device reference. ``compute_s`` gets the seconds
    each part computed (its waits for the others left out)."""
    timing = compute_s if compute_s is not None else {}
    mine = layout.roles[rank]
    head_rank = layout.rank_of(HEAD)
    device = device or torch.device("cpu")
    features: dict[str, torch.Tensor] = {}
    backward: dict[str, Callable[[torch.Tensor], None]] = {}
    for tower in (VISION, TEXT):
        if tower in mine:
            with _timed(timing, tower):
                features[tower], backward[tower] = tower_forward(
                    parts[tower], batch[TOWER_INPUT[tower]], micro_batches
                )

    # Features to the head.
    requests = []
    remote = [t for t in (VISION, TEXT) if t not in mine]
    if HEAD in mine:
        for tower in remote:
            features[tower] = torch.empty(batch_size, embed_dim, device=device)
            requests.append(dist.irecv(features[tower], layout.rank_of(tower), tag=_TAG[tower]))
    else:
        for tower in features:
            requests.append(dist.isend(features[tower].contiguous(), head_rank, tag=_TAG[tower]))
    _wait(requests)

    # The loss over the whole batch, and its gradients back to the towers.
    loss = None
    grads: dict[str, torch.Tensor] = {}
    requests = []
    if HEAD in mine:
        leaves = {t: features[t].requires_grad_() for t in (VISION, TEXT)}
        with _timed(timing, HEAD):
            loss = parts[HEAD](leaves[VISION], leaves[TEXT])
            loss.backward()
        grads = {t: leaves[t].grad for t in leaves}
        for tower in remote:
            requests.append(dist.isend(grads[tower], layout.rank_of(tower), tag=_TAG[tower]))
    else:
        for tower in backward:
            grads[tower] = torch.empty(batch_size, embed_dim, device=device)
            requests.append(dist.irecv(grads[tower], head_rank, tag=_TAG[tower]))
    _wait(requests)
    for tower, run_backward in backward.items():
        with _timed(timing, tower):
            run_backward(grads[tower])
    return None if loss is None else loss.detach()
