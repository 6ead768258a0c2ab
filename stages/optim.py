"""Optimizers and the learning-rate schedule used by pretraining."""

from __future__ import annotations

import math

import torch


class LARS(torch.optim.Optimizer):
    """Layer-wise adaptive rate scaling (You et al. 2017), as SimCLR, BYOL and MoCo v3 train ResNets.
    torch ships no LARS, hence this one. 1-d parameters (biases, BatchNorm) get neither weight decay nor the
    trust ratio, as in those papers."""

    def __init__(self, params, lr: float, momentum: float = 0.9, weight_decay: float = 0.0, eta: float = 0.001):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, eta=eta))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad
                if p.ndim > 1:
                    d = d.add(p, alpha=group["weight_decay"])
                    p_norm, d_norm = torch.linalg.vector_norm(p), torch.linalg.vector_norm(d)
                    trust = torch.where((p_norm > 0) & (d_norm > 0), group["eta"] * p_norm / d_norm, torch.ones_like(p_norm))
                    d = d.mul(trust)
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = d.clone()
                else:
                    state["momentum_buffer"].mul_(group["momentum"]).add_(d)
                p.add_(state["momentum_buffer"], alpha=-group["lr"])
        return loss


def build_optimizer(name: str, params, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    params = [p for p in params if p.requires_grad]
    if name == "lars":
        return LARS(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(name)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak, then cosine decay to 0 at total_steps (all three papers' schedule)."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
