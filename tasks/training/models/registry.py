"""Named models: what each one is, what it trains on, and how to build it (seeded).

``MODELS`` maps a name to a ModelSpec; ``build_model(name, seed=..., **overrides)`` builds it.
The recommended batch size, learning rate and sequence length are the defaults a training
run starts from; "byte-lm" is the configuration of the team's fp32-vs-bf16 measurement
(DESIGN.md section 5: 4 pre-norm layers, d=256, 4 heads, seq 128, batch 16, AdamW 3e-4).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import torch
from gpuflow.tasks.training.models.llama import Llama, LlamaConfig
from gpuflow.tasks.training.models.resnet import RESNET_LAYOUTS, resnet
from torch import nn

Task = Literal["lm", "image"]
Family = Literal["llama", "resnet"]

_RESNET_OPTIONS = ("num_classes", "in_channels", "stem", "width", "zero_init_residual")


@dataclass(frozen=True)
class ModelSpec:
    """Metadata of a named model and the training defaults recommended for it.

    ``dataset`` names a dataset that tasks.training.data.build_dataset knows, or None when no
    offline dataset fits (the ImageNet-shaped ResNets, used for slicing and serving).
    ``input_shape`` is one example's shape: (seq_len,) for an LM, (C, H, W) for an image model.
    """

    name: str
    family: Family
    task: Task
    description: str
    dataset: str | None
    batch_size: int
    lr: float
    optimizer: Literal["adamw", "sgd"]
    weight_decay: float
    input_shape: tuple[int, ...]
    seq_len: int | None = None
    num_classes: int | None = None
    vocab_size: int | None = None
    config: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


def _lm(
    name: str, description: str, *, batch_size: int, lr: float, seq_len: int, **config: Any
) -> ModelSpec:
    cfg = LlamaConfig(max_seq_len=seq_len, **config)
    return ModelSpec(
        name=name,
        family="llama",
        task="lm",
        description=description,
        dataset="pydoc-topics",
        batch_size=batch_size,
        lr=lr,
        optimizer="adamw",
        weight_decay=0.1,
        input_shape=(seq_len,),
        seq_len=seq_len,
        vocab_size=cfg.vocab_size,
        config=dataclasses.asdict(cfg),
    )


def _image(
    name: str,
    layout: str,
    description: str,
    *,
    dataset: str | None,
    batch_size: int,
    lr: float,
    optimizer: Literal["adamw", "sgd"],
    weight_decay: float,
    image_size: int,
    in_channels: int = 3,
    num_classes: int = 1000,
    stem: str = "imagenet",
    width: int = 64,
) -> ModelSpec:
    return ModelSpec(
        name=name,
        family="resnet",
        task="image",
        description=description,
        dataset=dataset,
        batch_size=batch_size,
        lr=lr,
        optimizer=optimizer,
        weight_decay=weight_decay,
        input_shape=(in_channels, image_size, image_size),
        num_classes=num_classes,
        config={
            "layout": layout,
            "num_classes": num_classes,
            "in_channels": in_channels,
            "stem": stem,
            "width": width,
            "zero_init_residual": False,
        },
    )


_SPECS = (
    _lm(
        "llama-tiny",
        "Llama-style, ~0.1M parameters: for tests, a step takes milliseconds on a CPU",
        batch_size=4,
        lr=1e-3,
        seq_len=32,
        dim=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        multiple_of=16,
    ),
    _lm(
        "byte-lm",
        "byte-level LM of the fp32-vs-bf16 measurement: 4 pre-norm layers, d=256, 4 heads",
        batch_size=16,
        lr=3e-4,
        seq_len=128,
        dim=256,
        n_layers=4,
        n_heads=4,
    ),
    _lm(
        "llama-small",
        "Llama-style, ~6M parameters, grouped-query attention: CPU or a small GPU slice",
        batch_size=16,
        lr=6e-4,
        seq_len=256,
        dim=256,
        n_layers=6,
        n_heads=8,
        n_kv_heads=4,
        ffn_hidden_dim=1024,
    ),
    _lm(
        "llama-100m",
        "Llama-style, ~100M parameters, grouped-query attention: for GPUs",
        batch_size=32,
        lr=3e-4,
        seq_len=512,
        dim=768,
        n_layers=16,
        n_heads=12,
        n_kv_heads=4,
        ffn_hidden_dim=2048,
    ),
    _image(
        "resnet18",
        "resnet18",
        "ResNet-18, ImageNet stem, 224x224, 1000 classes",
        dataset=None,
        batch_size=256,
        lr=0.1,
        optimizer="sgd",
        weight_decay=1e-4,
        image_size=224,
    ),
    _image(
        "resnet50",
        "resnet50",
        "ResNet-50 (v1.5), ImageNet stem, 224x224, 1000 classes, 25.6M parameters",
        dataset=None,
        batch_size=256,
        lr=0.1,
        optimizer="sgd",
        weight_decay=1e-4,
        image_size=224,
    ),
    _image(
        "resnet152",
        "resnet152",
        "ResNet-152 (v1.5), ImageNet stem, 224x224, 1000 classes, 60.2M parameters",
        dataset=None,
        batch_size=256,
        lr=0.1,
        optimizer="sgd",
        weight_decay=1e-4,
        image_size=224,
    ),
    _image(
        "resnet18-digits",
        "resnet18",
        "ResNet-18 layout at base width 32, small stem, 1x8x8 digits, 10 classes",
        dataset="digits",
        batch_size=64,
        lr=1e-3,
        optimizer="adamw",
        weight_decay=1e-4,
        image_size=8,
        in_channels=1,
        num_classes=10,
        stem="small",
        width=32,
    ),
)

MODELS: Mapping[str, ModelSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})


def model_spec(name: str) -> ModelSpec:
    """The spec of a named model; ValueError listing the known names for an unknown one."""
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def model_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The constructor settings of a named model with overrides applied and checked."""
    spec = model_spec(name)
    config = dict(spec.config)
    allowed = set(config) - {"layout"}
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(
            f"model {name!r} has no setting {', '.join(unknown)}; "
            f"settings: {', '.join(sorted(allowed))}"
        )
    config.update(overrides)
    if spec.family == "llama":
        LlamaConfig(**config)  # validates before anything is built
    return config


def build_model(name: str, *, seed: int | None = None, **overrides: Any) -> nn.Module:
    """Build a named model; the same seed gives the same weights, without touching global RNG.

    Overrides replace settings of the spec's config (e.g. ``n_layers=2``, ``num_classes=10``);
    an unknown setting raises ValueError before anything is built.
    """
    spec = model_spec(name)
    config = model_config(name, **overrides)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError(f"seed must be an int or None, got {seed!r}")

    def construct() -> nn.Module:
        if spec.family == "llama":
            return Llama(LlamaConfig(**config))
        layout = config.pop("layout")
        assert layout in RESNET_LAYOUTS
        return resnet(layout, **{k: config[k] for k in _RESNET_OPTIONS})

    if seed is None:
        return construct()
    # fork_rng restores the caller's CPU RNG afterwards, so building a model does not shift
    # the random stream of the training loop that builds it.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return construct()
