"""MLP heads shared by the methods (projector / predictor)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def mlp(in_dim: int, hidden_dim: int, out_dim: int, layers: int = 2, last_bn: bool = False) -> nn.Sequential:
    """Linear-BN-ReLU blocks then a final Linear (optionally BN without affine, as MoCo v3's projector)."""
    mods: list[nn.Module] = []
    dim = in_dim
    for _ in range(layers - 1):
        mods += [nn.Linear(dim, hidden_dim, bias=False), nn.BatchNorm1d(hidden_dim), nn.ReLU(inplace=True)]
        dim = hidden_dim
    mods.append(nn.Linear(dim, out_dim, bias=not last_bn))
    if last_bn:
        mods.append(nn.BatchNorm1d(out_dim, affine=False))
    return nn.Sequential(*mods)


def frozen_copy(module: nn.Module) -> nn.Module:
    """A momentum (target) network: same weights, never trained by gradients."""
    target = copy.deepcopy(module)
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def ema_update(target: nn.Module, online: nn.Module, momentum: float) -> None:
    """target <- m * target + (1 - m) * online, for parameters and float buffers (BN statistics copied as-is).
    Multi-tensor ops: two launches in all rather than one per tensor from Python (the per-tensor loop was a
    noticeable share of a small-image step's host time on a GPU). no_grad as a block, not a decorator: mutmut
    (`make mutation`) skips decorated functions."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), [o.detach() for o in online.parameters()], 1.0 - momentum)
        buffers = list(target.buffers())
        if buffers:  # a ViT has none, and _foreach_copy_ refuses an empty list
            torch._foreach_copy_(buffers, list(online.buffers()))


def cosine_momentum(base: float, progress: float) -> float:
    """BYOL's schedule: base at the start, 1 at the end (progress in [0, 1])."""
    import math

    return 1.0 - (1.0 - base) * (math.cos(math.pi * progress) + 1.0) / 2.0


def head_input(h: torch.Tensor, precision) -> torch.Tensor:
    """Backbone features as the heads take them: in the weights' type (fp32, or fp64), unless the precision runs
    the heads in a lower type too."""
    return h.to(precision.param_dtype) if precision.head_dtype is None else h


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """x as the losses compute: fp32 (fp16/bf16 logits and normalisations overflow), or fp64 when it already is
    (a `--precision fp64` run stays float64 to the loss)."""
    return x if x.dtype == torch.float64 else x.float()


def through(x: torch.Tensor, precision, backbone: nn.Module, heads: tuple) -> torch.Tensor:
    """x through the backbone (in the backbone's precision), then through `heads` in order (in the heads')."""
    with precision.backbone():
        h = backbone(x)
    with precision.heads():
        z = head_input(h, precision)
        for head in heads:
            z = head(z)
    return z


def online_and_momentum(x1: torch.Tensor, x2: torch.Tensor, precision, backbone: nn.Module, heads: tuple,
                        momentum_backbone: nn.Module, momentum_heads: tuple):
    """Both views through the online branch (backbone, then `heads` in order) and, without gradients, the momentum
    branch: ((online view 1, online view 2), (momentum view 1, momentum view 2)). BYOL and MoCo v3 share it."""
    x = torch.cat([x1, x2])
    z = through(x, precision, backbone, heads)
    with torch.no_grad():
        zk = through(x, precision, momentum_backbone, momentum_heads)
    return z.chunk(2), zk.chunk(2)
