"""The reference arm of `gpuflow bench train`: the plain block of DESIGN.md section 5.

A pre-norm transformer LM built from torch's own ``nn.TransformerEncoderLayer``
(``norm_first=True``: LayerNorm, no RoPE but a learned position embedding, a GELU MLP of
4*d): d=256, 4 heads, 4 layers, seq 128, batch 16, AdamW 3e-4, on the byte corpus the
byte-lm trains on (CPython's pydoc_data topics). Nothing of ours (RMSNorm, RoPE, SwiGLU,
the loop) is in it, so its fp32-vs-bf16 speedup says what autocast buys this CPU on a
block of that size; measured in the same run as the byte-lm, the two are comparable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gpuflow.tasks.training.data import build_dataset, eval_batches, make_sampler


@dataclass(frozen=True)
class ReferenceConfig:
    """The plain block's shape and training settings (DESIGN.md section 5)."""

    vocab_size: int = 256
    dim: int = 256
    n_heads: int = 4
    n_layers: int = 4
    seq_len: int = 128
    batch_size: int = 16
    lr: float = 3e-4
    eval_batches: int = 8


class PlainBlockLM(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab): embeddings, pre-norm encoder layers with a
    causal mask, a final LayerNorm and a linear head."""

    def __init__(self, config: ReferenceConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.dim)
        self.pos = nn.Embedding(config.seq_len, config.dim)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                config.dim,
                config.n_heads,
                4 * config.dim,
                dropout=0.0,
                activation="gelu",
                batch_first=True,
                norm_first=True,
            )
            for _ in range(config.n_layers)
        )
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        mask = nn.Transformer.generate_square_subsequent_mask(config.seq_len)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        h = self.tok(tokens) + self.pos(torch.arange(seq, device=tokens.device))
        mask = self.causal_mask[:seq, :seq]
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.head(self.norm(h))


def train_reference(
    precision: str, *, steps: int, seed: int, config: ReferenceConfig | None = None
) -> dict[str, Any]:
    """Train the plain block for ``steps`` in ``precision`` ("fp32" or "bf16" autocast).

    Returns the time inside steps (``train_time_s``), the whole run's (``wall_time_s``,
    building and eval included), each step's time and the final fp32 eval loss.
    """
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"the reference arm runs fp32 or bf16, not {precision!r}")
    cfg = config or ReferenceConfig()
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = PlainBlockLM(cfg)
    # The same AdamW construction as the training loop's on CPU, so the two arms differ
    # in their model only.
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=True)
    dataset = build_dataset("pydoc-topics", seed=seed)
    sampler = make_sampler(dataset, batch_size=cfg.batch_size, seed=seed, seq_len=cfg.seq_len)
    evals = eval_batches(
        dataset, batch_size=cfg.batch_size, seq_len=cfg.seq_len, max_batches=cfg.eval_batches
    )
    reduced = precision == "bf16"
    step_times: list[float] = []
    loss = torch.zeros(())
    for _ in range(steps):
        x, y = next(sampler)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=reduced):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - t0)
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():  # in fp32, as the loop's evaluate does
        for x, y in evals:
            total += float(F.cross_entropy(model(x).flatten(0, 1), y.flatten())) * len(x)
            n += len(x)
    return {
        "policy": precision,
        "seed": seed,
        "steps": steps,
        "train_time_s": sum(step_times),
        "wall_time_s": time.perf_counter() - started,
        "step_times_s": step_times,
        "final_loss": loss.item(),
        "eval_loss": total / max(n, 1),
    }
