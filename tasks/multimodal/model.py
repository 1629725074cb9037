"""A CLIP-style dual encoder: a vision transformer, a causal text transformer, projection
heads into one embedding space, and a contrastive head with a learnable temperature.

The model is three parts (``PARTS``) that the branch layout puts on different ranks: the
two towers are parallel branches (neither needs the other's output), and the head couples
every image of a batch with every caption of it (symmetric InfoNCE), so it needs both
towers' features of the whole batch. Each part is built from its own seed
(``build_part``): a rank that builds only the text tower gets exactly the weights the
single-device model has, which is what makes the two layouts' gradients comparable.

Gradient checkpointing (``VisionTower.checkpointing``) recomputes each vision block in
the backward pass instead of keeping its activations (torch.utils.checkpoint, the
non-reentrant variant). The 8-bit text branch (``quantize_text_int8``) is weight-only
int8 of the text transformer's linear layers: those weights are frozen (int8 values and a
per-output-channel fp32 scale, buffers), while the token and position embeddings, layer
norms, the linear layers' biases and the text projection keep training.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from gpuflow.tasks.multimodal.memory import ActivationMeter
from torch import nn
from torch.utils.checkpoint import checkpoint

VISION, TEXT, HEAD = "vision", "text", "head"
PARTS = (VISION, TEXT, HEAD)
EOS_TOKEN = 2  # the tokenizer's end-of-sequence id: the text tower reads its features there
_PART_SEED_OFFSET = {VISION: 0, TEXT: 1, HEAD: 2}


@dataclass(frozen=True)
class ClipConfig:
    """Sizes of one model; ``vocab_size`` and ``context_length`` come from the tokenizer."""

    embed_dim: int = 32
    image_size: int = 32
    patch_size: int = 8
    channels: int = 1
    vision_width: int = 64
    vision_layers: int = 2
    vision_heads: int = 4
    vocab_size: int = 64
    context_length: int = 16
    text_width: int = 64
    text_layers: int = 2
    text_heads: int = 4
    mlp_ratio: int = 4
    init_temperature: float = 0.07

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}"
            )
        for width, heads, what in (
            (self.vision_width, self.vision_heads, "vision"),
            (self.text_width, self.text_heads, "text"),
        ):
            if width % heads:
                raise ValueError(f"{what}_width {width} does not split into {heads} heads")

    def fingerprint(self, text_int8: bool = False) -> str:
        """Names the architecture in checkpoints: another size (or an int8 text tower,
        whose weights are stored differently) cannot load them."""
        text = json.dumps({**asdict(self), "text_int8": text_int8}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()


# From tests (tiny: a step in milliseconds on one core) to one that fills a GPU's memory
# at a large batch (large: ~150 M parameters, ViT-B/16-like widths on 64x64 inputs).
SIZES: dict[str, dict[str, int]] = {
    "clip-tiny": {},
    "clip-small": {
        "embed_dim": 128,
        "vision_width": 192,
        "vision_layers": 6,
        "vision_heads": 6,
        "text_width": 192,
        "text_layers": 4,
        "text_heads": 6,
    },
    "clip-large": {
        "embed_dim": 512,
        "image_size": 64,
        "vision_width": 768,
        "vision_layers": 12,
        "vision_heads": 12,
        "text_width": 512,
        "text_layers": 12,
        "text_heads": 8,
    },
}


def clip_config(size: str, *, vocab_size: int, context_length: int) -> ClipConfig:
    if size not in SIZES:
        raise ValueError(f"model size {size!r} is not one of: {', '.join(SIZES)}")
    return replace(ClipConfig(**SIZES[size]), vocab_size=vocab_size, context_length=context_length)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, w = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, w // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=self.causal
        )
        return self.out(y.transpose(1, 2).reshape(b, n, w))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, width: int, heads: int, mlp_ratio: int, causal: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads, causal)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class VisionTower(nn.Module):
    """Patches -> [CLS] + blocks -> projected features of the [CLS] token."""

    def __init__(self, c: ClipConfig) -> None:
        super().__init__()
        patches = (c.image_size // c.patch_size) ** 2
        self.patch = nn.Conv2d(c.channels, c.vision_width, c.patch_size, c.patch_size)
        self.cls = nn.Parameter(torch.randn(c.vision_width) * 0.02)
        self.pos = nn.Parameter(torch.randn(patches + 1, c.vision_width) * 0.02)
        self.blocks = nn.ModuleList(
            Block(c.vision_width, c.vision_heads, c.mlp_ratio, causal=False)
            for _ in range(c.vision_layers)
        )
        self.ln = nn.LayerNorm(c.vision_width)
        self.proj = nn.Linear(c.vision_width, c.embed_dim, bias=False)
        self.checkpointing = False

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], 1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                ActivationMeter.keep(x)  # what the checkpoint holds for the recomputation
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.proj(self.ln(x[:, 0]))


class TextTower(nn.Module):
    """Tokens -> causal blocks -> projected features at the end-of-sequence token."""

    def __init__(self, c: ClipConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(c.vocab_size, c.text_width)
        self.pos = nn.Parameter(torch.randn(c.context_length, c.text_width) * 0.01)
        self.blocks = nn.ModuleList(
            Block(c.text_width, c.text_heads, c.mlp_ratio, causal=True)
            for _ in range(c.text_layers)
        )
        self.ln = nn.LayerNorm(c.text_width)
        self.proj = nn.Linear(c.text_width, c.embed_dim, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        # Causal attention: the EOS position has read every word and no padding after it.
        eos = (tokens == EOS_TOKEN).int().argmax(dim=1)
        return self.proj(self.ln(x[torch.arange(x.shape[0]), eos]))


class ContrastiveHead(nn.Module):
    """Symmetric InfoNCE over the whole batch: every other sample is a negative."""

    def __init__(self, c: ClipConfig) -> None:
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1.0 / c.init_temperature)))

    def forward(self, image_features: torch.Tensor, text_features: torch.Tensor) -> torch.Tensor:
        return clip_loss(image_features, text_features, self.logit_scale)


def clip_loss(
    image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor
) -> torch.Tensor:
    img = F.normalize(image_features, dim=-1)
    txt = F.normalize(text_features, dim=-1)
    # CLIP clamps the learned scale at 100 so the logits cannot blow up.
    logits = logit_scale.exp().clamp(max=100.0) * img @ txt.t()
    target = torch.arange(logits.shape[0], device=logits.device)
    return (F.cross_entropy(logits, target) + F.cross_entropy(logits.t(), target)) / 2


class Int8Linear(nn.Module):
    """A frozen linear layer stored as int8 with a per-output-channel scale; bias trains.

    Weight-only quantisation: the product runs in the input's dtype after dequantising
    (what it saves is the weights' memory and their gradients and optimizer state)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        self.register_buffer("weight_int8", torch.round(w / scale[:, None]).to(torch.int8))
        self.register_buffer("scale", scale.float())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight_int8.to(x.dtype) * self.scale.to(x.dtype)[:, None]
        return F.linear(x, weight, self.bias)


def quantize_text_int8(text: TextTower) -> TextTower:
    """Every linear layer of the text tower's blocks as Int8Linear (the projection stays)."""
    for block in text.blocks:
        for parent in block.modules():
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Int8Linear(child))
    return text


def build_part(
    part: str,
    config: ClipConfig,
    seed: int,
    *,
    checkpointing: bool = False,
    text_int8: bool = False,
) -> nn.Module:
    """One part, its weights a function of (config, seed, part) alone."""
    if part not in PARTS:
        raise ValueError(f"part {part!r} is not one of: {', '.join(PARTS)}")
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed * 3 + _PART_SEED_OFFSET[part])
        if part == VISION:
            module: nn.Module = VisionTower(config)
            module.checkpointing = checkpointing
        elif part == TEXT:
            module = TextTower(config)
            if text_int8:
                quantize_text_int8(module)
        else:
            module = ContrastiveHead(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return module


class ClipModel(nn.Module):
    """The three parts in one module: the single-device layout, and evaluation."""

    def __init__(self, parts: dict[str, nn.Module]) -> None:
        super().__init__()
        self.vision, self.text, self.head = parts[VISION], parts[TEXT], parts[HEAD]

    @classmethod
    def build(cls, config: ClipConfig, seed: int, **options: Any) -> ClipModel:
        return cls({p: build_part(p, config, seed, **options) for p in PARTS})

    def part(self, name: str) -> nn.Module:
        return {VISION: self.vision, TEXT: self.text, HEAD: self.head}[name]

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        return self.vision(images)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.text(tokens)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.vision(images), self.text(tokens))


def trainable(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def parameter_count(module: nn.Module) -> dict[str, int]:
    """Trained and frozen (int8 buffers count as frozen weights) element counts."""
    frozen = sum(b.numel() for n, b in module.named_buffers() if n.endswith("weight_int8"))
    return {"trained": sum(p.numel() for p in trainable(module)), "frozen": frozen}
