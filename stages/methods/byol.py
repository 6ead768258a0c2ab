"""BYOL (Grill et al. 2020): online backbone+projector+predictor, EMA target backbone+projector, symmetric loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stages.methods.heads import cosine_momentum, ema_update, frozen_copy, mlp

# The paper's defaults: projector/predictor 4096 -> 256, target EMA 0.99 rising to 1 on a cosine, LARS lr 0.2 x
# batch/256 with weight decay 1.5e-6.
DEFAULTS = {"proj_dim": 256, "proj_hidden_dim": 4096, "pred_hidden_dim": 4096, "momentum_base": 0.99,
            "optimizer": "lars", "lr": 0.2, "weight_decay": 1.5e-6}


def byol_loss(p: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """2 - 2 cos(p, z), averaged over the batch; z is the target's output (no gradient)."""
    return (2 - 2 * F.cosine_similarity(p.float(), z.detach().float(), dim=-1)).mean()


class BYOL(nn.Module):
    def __init__(self, backbone: nn.Module, feat_dim: int, cfg):
        super().__init__()
        self.backbone = backbone
        self.projector = mlp(feat_dim, cfg.proj_hidden_dim, cfg.proj_dim)
        self.predictor = mlp(cfg.proj_dim, cfg.pred_hidden_dim, cfg.proj_dim)
        self.target_backbone = frozen_copy(backbone)
        self.target_projector = frozen_copy(self.projector)
        self.momentum_base = cfg.momentum_base
        self.momentum = cfg.momentum_base

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, precision) -> torch.Tensor:
        x = torch.cat([x1, x2])
        with precision.backbone():
            h = self.backbone(x)
        with precision.heads():
            h = h.float() if precision.head_dtype is None else h
            p1, p2 = self.predictor(self.projector(h)).chunk(2)
        with torch.no_grad():
            with precision.backbone():
                ht = self.target_backbone(x)
            with precision.heads():
                ht = ht.float() if precision.head_dtype is None else ht
                z1, z2 = self.target_projector(ht).chunk(2)
        return byol_loss(p1, z2) + byol_loss(p2, z1)

    def after_step(self, progress: float) -> None:
        """EMA of the target after each optimizer step; progress = finished steps / total steps. (ema_update
        runs under no_grad; no decorator here, which mutmut would skip.)"""
        self.momentum = cosine_momentum(self.momentum_base, progress)
        ema_update(self.target_backbone, self.backbone, self.momentum)
        ema_update(self.target_projector, self.projector, self.momentum)
