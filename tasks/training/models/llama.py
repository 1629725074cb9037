"""A Llama-style decoder-only language model, written out in plain torch.

Pre-norm blocks with RMSNorm, rotary position embeddings (RoPE), grouped-query attention
(n_kv_heads <= n_heads) through ``F.scaled_dot_product_attention`` and a SwiGLU MLP; the
token embedding and the output projection may share one matrix. Written out here rather than
taken from a library so that the same code runs on CPU, CUDA and ROCm (Hygon DCU) builds of
torch and stays exportable.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a Llama-style model. ``ffn_hidden_dim`` None: Llama's 2/3 * 4 * dim rule."""

    vocab_size: int = 256
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    ffn_hidden_dim: int | None = None
    multiple_of: int = 32
    max_seq_len: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for field in ("vocab_size", "dim", "n_layers", "n_heads", "multiple_of", "max_seq_len"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"LlamaConfig.{field} must be a positive int, got {value!r}")
        if self.n_kv_heads is not None and (
            not isinstance(self.n_kv_heads, int) or self.n_kv_heads <= 0
        ):
            raise ValueError(
                f"LlamaConfig.n_kv_heads must be a positive int or None, got {self.n_kv_heads!r}"
            )
        if self.ffn_hidden_dim is not None and (
            not isinstance(self.ffn_hidden_dim, int) or self.ffn_hidden_dim <= 0
        ):
            raise ValueError(
                "LlamaConfig.ffn_hidden_dim must be a positive int or None, "
                f"got {self.ffn_hidden_dim!r}"
            )
        if self.dim % self.n_heads:
            raise ValueError(
                f"LlamaConfig.dim ({self.dim}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"LlamaConfig.n_heads ({self.n_heads}) must be a multiple of "
                f"n_kv_heads ({self.kv_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(
                f"LlamaConfig head_dim (dim/n_heads = {self.head_dim}) must be even for RoPE"
            )
        if not self.norm_eps > 0:
            raise ValueError(f"LlamaConfig.norm_eps must be > 0, got {self.norm_eps!r}")
        if not self.rope_theta > 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta!r}")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden_dim is not None:
            return self.ffn_hidden_dim
        # Llama's rule: SwiGLU has three matrices instead of two, so 2/3 of the usual 4*dim
        # keeps the MLP's parameter count; rounded up to a multiple for kernel-friendly shapes.
        hidden = int(2 * 4 * self.dim / 3)
        return self.multiple_of * math.ceil(hidden / self.multiple_of)

    def num_parameters(self) -> int:
        """Trainable parameters, computed from the shape (no model needs to be built)."""
        d, hd = self.dim, self.head_dim
        attention = d * self.n_heads * hd * 2 + d * self.kv_heads * hd * 2
        mlp = 3 * d * self.hidden_dim
        per_layer = attention + mlp + 2 * d  # two RMSNorm weights
        embeddings = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return embeddings + self.n_layers * per_layer + d  # final norm


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (no mean subtraction, no bias), through ``F.rms_norm``.

    One ATen op (``_fused_rms_norm`` on CPU and CUDA in torch >= 2.8, with its own backward)
    instead of five elementwise kernels and their five backward kernels. The residual stream
    it normalises stays fp32 under autocast (the sums promote), so the mean of squares is
    taken in fp32 as before; a reduced-precision input is upcast inside the op.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)


def rope_tables(
    head_dim: int, max_seq_len: int, theta: float = 10000.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables, each (max_seq_len, head_dim // 2), for positions 0..max_seq_len-1."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    positions = torch.arange(max_seq_len, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    return torch.cos(angles), torch.sin(angles)


def rope_full(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Half tables (..., head_dim/2) -> full-width (cat(cos, cos), cat(-sin, sin)) for ``rotate``."""
    return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)


def rotate(x: torch.Tensor, cos_full: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE with full-width tables: x * cos + swap_halves(x) * (-sin, sin).

    The halves are swapped by a flip of a (2, head_dim/2) view: its backward is a flip too,
    where slicing x into halves and concatenating would cost a zero-filled buffer and a copy
    per slice in backward, and twice the multiplies.
    """
    swapped = x.unflatten(-1, (2, x.shape[-1] // 2)).flip(-2).flatten(-2)
    return x * cos_full + swapped * sin_signed


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., head_dim) by position: pairs (i, i + head_dim/2) turn by angle_t,i.

    cos and sin are the half tables of ``rope_tables``, broadcasting against x's leading dims
    (e.g. (T, head_dim/2) for x (B, H, T, hd)). The half-split pairing (not interleaved)
    needs only a flip and elementwise ops, which every backend and the ONNX exporter
    handle; q·k then depends only on the position difference.
    """
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return rotate(x, *rope_full(cos, sin))


# Torch 2.13's CPU flash-attention kernel is slow in reduced precision: forward + backward
# of byte-lm's attention (16 x 4 heads x 128 x 64) take 15.8 ms in bf16 against 6.6 ms in
# fp32 (q, k, v cast up and the output back down included) on an AVX512-BF16 EPYC, while
# the matmuls around it gain 3-4x from bf16. So on CPU attention runs in fp32; CUDA and
# ROCm keep their reduced-precision kernels.
_CPU_UPCAST = (torch.bfloat16, torch.float16)


def attention_dtype(device_type: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype RoPE and attention run in for activations of ``dtype`` on ``device_type``."""
    return torch.float32 if device_type == "cpu" and dtype in _CPU_UPCAST else dtype


class Attention(nn.Module):
    """Causal grouped-query self-attention with RoPE on queries and keys.

    q, k and v come from one fused projection ``wqkv`` (rows: n_heads*hd of q, then
    n_kv_heads*hd of k, then of v): one matmul and, under autocast, one cast of the input
    instead of three; RoPE then turns q and k in one pass, as they sit side by side.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        qkv_out = (self.n_heads + 2 * self.n_kv_heads) * self.head_dim
        self.wqkv = nn.Linear(config.dim, qkv_out, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (B, T, dim); cos, sin: the full-width tables of ``rope_full``, (T, head_dim),
        in ``attention_dtype`` (``Llama.rope_tables_for`` gives them)."""
        batch, seq, _ = x.shape
        n_qk = self.n_heads + self.n_kv_heads
        qkv = self.wqkv(x).view(batch, seq, n_qk + self.n_kv_heads, self.head_dim)
        low = qkv.dtype
        upcast = attention_dtype(qkv.device.type, low) != low
        # Autocast off around the upcast: it would send SDPA back to the reduced dtype.
        with torch.autocast(qkv.device.type, enabled=False) if upcast else nullcontext():
            if upcast:
                qkv = qkv.float()  # one cast of q, k and v together
            # split, not slicing: its backward is one cat, not a zero-filled buffer per slice.
            qk, v = qkv.split((n_qk, self.n_kv_heads), dim=2)
            # (B, T, heads, hd) layout: the tables broadcast over heads as (T, 1, hd).
            qk = rotate(qk, cos.unsqueeze(1), sin.unsqueeze(1))
            q, k = (t.transpose(1, 2) for t in qk.split((self.n_heads, self.n_kv_heads), dim=2))
            v = v.transpose(1, 2)
            n_rep = self.n_heads // self.n_kv_heads
            if n_rep > 1:
                # Query head h reads kv head h // n_rep. Explicit repetition rather than
                # SDPA's enable_gqa, which older ROCm/CUDA torch builds on the fleet lack.
                k = k.repeat_interleave(n_rep, dim=1)
                v = v.repeat_interleave(n_rep, dim=1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # Back to the projections' dtype: autocast would cast for wo anyway, and bf16 weights
        # (FSDP's param_dtype, model.to(bf16)) need it.
        y = y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim).to(low)
        return self.wo(y)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), with w1 and w3 fused into one projection ``w13`` (w1's rows
    first): one matmul and one autocast cast of x instead of two."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(dim, 2 * hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.w2.in_features, dim=-1)
        return self.w2(F.silu(gate) * up)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then h + mlp(norm(h))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = SwiGLU(config.dim, config.hidden_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab_size)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        # Not persistent: the tables follow from the config, so checkpoints need not carry them.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # The tables in each compute dtype, cast once instead of twice per layer and forward.
        # A plain dict, not buffers: it stays out of state_dict and the fingerprint.
        self._rope_cache: dict[
            tuple[torch.dtype, torch.device, int], tuple[torch.Tensor, torch.Tensor]
        ] = {}
        self._init_weights()
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02), and the projections that write into the residual stream
        # scaled by 1/sqrt(2 * n_layers) so the stream's variance does not grow with depth.
        std = 0.02
        residual_std = std / math.sqrt(2 * self.config.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                last = name.rsplit(".", 1)[-1]
                nn.init.normal_(module.weight, 0.0, residual_std if last in ("wo", "w2") else std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)

    def _compute_dtype(self, h: torch.Tensor) -> torch.dtype:
        # The dtype RoPE meets: q and k leave their Linear in the autocast dtype, whatever
        # h is, and attention_dtype may upcast that again (CPU).
        device_type = h.device.type
        dtype = h.dtype
        if torch.is_autocast_enabled(device_type):
            dtype = torch.get_autocast_dtype(device_type)
        return attention_dtype(device_type, dtype)

    def rope_tables_for(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-width (max_seq_len, head_dim) RoPE tables (``rope_full``) in ``dtype``, cached.

        Built once per dtype and device instead of cast twice per layer and forward. Keyed
        by the buffer's storage too, so ``.to(device)``, ``.double()`` or new buffers never
        serve stale tables.
        """
        cos, sin = self.rope_cos, self.rope_sin
        if torch.compiler.is_compiling():
            # Traced (torch.compile, torch.export for ONNX): the cast is part of the graph,
            # made from the buffers. A cached tensor would be a lifted constant, which the
            # exporter's decomposition cannot place (IndexError in set_missing_meta_vals).
            return rope_full(cos.to(dtype), sin.to(dtype))
        key = (dtype, cos.device, cos.data_ptr())
        cached = self._rope_cache.get(key)
        if cached is None:
            if len(self._rope_cache) >= 8:  # stale keys after moves: keep the dict small
                self._rope_cache.clear()
            # Normal tensors even when first asked for under inference_mode or no_grad, so a
            # later training forward may save them for backward.
            with torch.inference_mode(False), torch.no_grad():
                cached = rope_full(cos.to(dtype), sin.to(dtype))
            self._rope_cache[key] = cached
        return cached

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, seq), got shape {tuple(tokens.shape)}")
        seq = tokens.shape[1]
        if seq > self.config.max_seq_len:
            raise ValueError(
                f"sequence length {seq} exceeds the model's max_seq_len {self.config.max_seq_len}"
            )
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope_tables_for(self._compute_dtype(h))
        cos, sin = cos[:seq], sin[:seq]
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of logits (B, T, V) against targets (B, T), in fp32."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} do not match"
        )
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
