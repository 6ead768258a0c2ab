"""torchvision ResNets, randomly initialised, returning pooled features (the classifier replaced by Identity)."""

from __future__ import annotations

import torch
import torchvision

from pipeline.errors import PipelineError

BACKBONES = {
    "resnet18": (torchvision.models.resnet18, 512),
    "resnet34": (torchvision.models.resnet34, 512),
    "resnet50": (torchvision.models.resnet50, 2048),
}
SMALL_STEM_MAX_SIZE = 64  # at or below this, the ImageNet stem (stride 4 before layer1) throws away most pixels


def uses_small_stem(small_stem: str, image_size: int) -> bool:
    if small_stem == "auto":
        return image_size <= SMALL_STEM_MAX_SIZE
    return small_stem == "on"


def min_image_size(small: bool) -> int:
    """Smallest side that still leaves layer4 at least 1x1: total stride 8 with the small stem, 32 without."""
    return 8 if small else 32


def build_backbone(name: str, small_stem: bool) -> tuple[torch.nn.Module, int]:
    """(backbone, feature dim). weights=None: random init, never a download."""
    if name not in BACKBONES:
        raise PipelineError(f"unknown backbone {name!r}: use {', '.join(BACKBONES)}")
    ctor, dim = BACKBONES[name]
    net = ctor(weights=None)
    if small_stem:
        # CIFAR-style stem (SimCLR App. B.9): 3x3 stride-1 conv, no max-pool.
        net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        torch.nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = torch.nn.Identity()
    net.fc = torch.nn.Identity()
    return net, dim
