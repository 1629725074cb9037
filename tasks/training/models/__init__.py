"""Training workloads: a Llama-style decoder and the ResNet family, and their registry."""

from gpuflow.tasks.training.models.llama import Llama, LlamaConfig, lm_loss
from gpuflow.tasks.training.models.registry import (
    MODELS,
    ModelSpec,
    build_model,
    model_config,
    model_spec,
)
from gpuflow.tasks.training.models.resnet import BasicBlock, Bottleneck, ResNet, resnet

__all__ = [
    "MODELS",
    "BasicBlock",
    "Bottleneck",
    "Llama",
    "LlamaConfig",
    "ModelSpec",
    "ResNet",
    "build_model",
    "lm_loss",
    "model_config",
    "model_spec",
    "resnet",
]
