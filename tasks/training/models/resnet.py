"""ResNet (He et al. 2016) in plain torch, no torchvision.

The layout matches torchvision's (v1.5: the stride sits on the 3x3 conv of a bottleneck), so
parameter counts agree with the published ones (resnet50 25,557,032; resnet152 60,192,808).
The top level has named stages ``stem``, ``layer1``..``layer4``, ``head``, and each layer is a
Sequential of blocks: ``cut_points()`` lists the single-tensor boundaries (between blocks)
where a model can be split across devices. Only plain ops, so it exports with torch.onnx.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

Stem = Literal["imagenet", "small"]
STAGE_NAMES = ("stem", "layer1", "layer2", "layer3", "layer4", "head")


def _conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 3, stride=stride, padding=1, bias=False)


def _conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """Two 3x3 convs with a skip connection (ResNet-18/34)."""

    expansion = 1

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv3x3(in_planes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carries the stride), 1x1 expand by 4, with a skip (ResNet-50+)."""

    expansion = 4

    def __init__(
        self, in_planes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = _conv1x1(in_planes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = _conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = _conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


Block = type[BasicBlock] | type[Bottleneck]


class ResNet(nn.Module):
    """Images (batch, in_channels, H, W) -> logits (batch, num_classes).

    stem "imagenet": 7x7/2 conv + 3x3/2 max-pool, for 224x224 inputs.
    stem "small": one 3x3/1 conv and no pooling, for 8x8 or 32x32 inputs (digits, CIFAR),
    where the ImageNet stem would shrink the image to nothing before layer1.
    ``width`` is the channel count of layer1 (64 in the paper); the stages double it.
    """

    def __init__(
        self,
        block: Block,
        layers: tuple[int, int, int, int],
        num_classes: int = 1000,
        in_channels: int = 3,
        stem: Stem = "imagenet",
        width: int = 64,
        zero_init_residual: bool = False,
    ) -> None:
        super().__init__()
        if block not in (BasicBlock, Bottleneck):
            raise ValueError(f"block must be BasicBlock or Bottleneck, got {block!r}")
        if len(layers) != 4 or any(not isinstance(n, int) or n < 1 for n in layers):
            raise ValueError(f"layers must be four positive ints, got {layers!r}")
        for name, value in (
            ("num_classes", num_classes),
            ("in_channels", in_channels),
            ("width", width),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ResNet {name} must be a positive int, got {value!r}")
        if stem not in ("imagenet", "small"):
            raise ValueError(f"ResNet stem must be 'imagenet' or 'small', got {stem!r}")
        self.block = block
        self.layer_counts = tuple(layers)
        self.num_classes = num_classes
        self.in_channels = in_channels
        self.stem_kind: Stem = stem

        if stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        else:
            self.stem = nn.Sequential(
                _conv3x3(in_channels, width), nn.BatchNorm2d(width), nn.ReLU(inplace=True)
            )
        self._planes = width
        self.layer1 = self._make_layer(block, width, layers[0], stride=1)
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d((1, 1)),
            nn.Flatten(1),
            nn.Linear(width * 8 * block.expansion, num_classes),
        )
        self._init_weights(zero_init_residual)

    def _make_layer(self, block: Block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        out_planes = planes * block.expansion
        if stride != 1 or self._planes != out_planes:
            downsample = nn.Sequential(
                _conv1x1(self._planes, out_planes, stride), nn.BatchNorm2d(out_planes)
            )
        modules: list[nn.Module] = [block(self._planes, planes, stride, downsample)]
        self._planes = out_planes
        modules.extend(block(self._planes, planes) for _ in range(1, blocks))
        return nn.Sequential(*modules)

    def _init_weights(self, zero_init_residual: bool) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if zero_init_residual:
            # Each residual branch starts as the identity (Goyal et al. 2017): helps large batches.
            for module in self.modules():
                if isinstance(module, Bottleneck):
                    nn.init.zeros_(module.bn3.weight)
                elif isinstance(module, BasicBlock):
                    nn.init.zeros_(module.bn2.weight)

    def stages(self) -> list[tuple[str, nn.Module]]:
        """The six named stages in execution order."""
        return [(name, getattr(self, name)) for name in STAGE_NAMES]

    def cut_points(self) -> list[tuple[str, nn.Module]]:
        """Stem, every residual block by qualified name ("layer3.7"), head, in execution order.

        Running them one after another equals forward(); the tensor between two consecutive
        entries is the only live activation there, so each boundary is a legal cut.
        """
        units: list[tuple[str, nn.Module]] = [("stem", self.stem)]
        for layer_name in STAGE_NAMES[1:5]:
            layer = getattr(self, layer_name)
            units.extend((f"{layer_name}.{i}", blk) for i, blk in enumerate(layer))
        units.append(("head", self.head))
        return units

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        return self.head(x)


RESNET_LAYOUTS: dict[str, tuple[Block, tuple[int, int, int, int]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
    "resnet152": (Bottleneck, (3, 8, 36, 3)),
}


def resnet(
    depth_name: str,
    *,
    num_classes: int = 1000,
    in_channels: int = 3,
    stem: Stem = "imagenet",
    width: int = 64,
    zero_init_residual: bool = False,
) -> ResNet:
    """Build a ResNet by layout name ("resnet18", "resnet50", "resnet152", ...)."""
    if depth_name not in RESNET_LAYOUTS:
        raise ValueError(
            f"unknown ResNet layout {depth_name!r}; known: {', '.join(sorted(RESNET_LAYOUTS))}"
        )
    block, layers = RESNET_LAYOUTS[depth_name]
    return ResNet(
        block,
        layers,
        num_classes=num_classes,
        in_channels=in_channels,
        stem=stem,
        width=width,
        zero_init_residual=zero_init_residual,
    )


def resnet18(**kwargs: object) -> ResNet:
    return resnet("resnet18", **kwargs)  # type: ignore[arg-type]


def resnet50(**kwargs: object) -> ResNet:
    return resnet("resnet50", **kwargs)  # type: ignore[arg-type]


def resnet152(**kwargs: object) -> ResNet:
    return resnet("resnet152", **kwargs)  # type: ignore[arg-type]
