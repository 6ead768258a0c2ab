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
        """The update of the papers, per parameter p with gradient g (matrices: ndim > 1):
            d = g + wd * p;  d *= eta * |p| / |d| (matrices, both norms > 0);  buf = m * buf + d;  p -= lr * buf
        written with torch's multi-tensor (_foreach) ops: a handful of kernel launches for the whole model instead
        of ~10 per parameter from Python, which on a GPU made the optimizer the host-side bottleneck of small-image
        steps (docs/benchmarks.md). Same arithmetic in the same order as the per-parameter loop (tests/train/test_optim.py)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            grads = [p.grad for p in params]
            mats = [i for i, p in enumerate(params) if p.ndim > 1]
            if mats:
                mp = [params[i] for i in mats]
                md = torch._foreach_add([grads[i] for i in mats], mp, alpha=group["weight_decay"])
                p_norm = torch.stack(torch._foreach_norm(mp))
                d_norm = torch.stack(torch._foreach_norm(md))
                trust = torch.where((p_norm > 0) & (d_norm > 0), group["eta"] * p_norm / d_norm, torch.ones_like(p_norm))
                torch._foreach_mul_(md, list(trust.unbind()))
                for i, d in zip(mats, md):
                    grads[i] = d
            # A new buffer starts at zero, so the first update leaves it equal to d, as the papers' first step.
            for p in params:
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            torch._foreach_mul_(bufs, group["momentum"])
            torch._foreach_add_(bufs, grads)
            torch._foreach_add_(params, bufs, alpha=-group["lr"])
        return loss


def param_groups(model: torch.nn.Module, pred_lr: float | None) -> list[dict]:
    """The model's trainable parameters as optimizer groups: one, unless the predictor (BYOL, MoCo v3) learns at
    pred_lr times the rest's rate (its own group, lr_mult; build_optimizer applies it). One group otherwise, so a
    checkpoint written before the option resumes as it was."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    predictor = getattr(model, "predictor", None)
    if predictor is None or pred_lr in (None, 1.0):
        return [{"params": trainable}]
    ids = {id(p) for p in predictor.parameters()}
    return [{"params": [p for p in trainable if id(p) not in ids]},
            {"params": [p for p in trainable if id(p) in ids], "lr_mult": pred_lr}]


def fused_for(device: torch.device) -> bool:
    """Whether torch's fused SGD and AdamW update the parameters: on CUDA, where one C++ call updates every
    parameter in one kernel. torch's default there, the multi-tensor update, gathers the tensors in Python, allocates
    a weight-decayed copy of each gradient and launches four passes every step: host time beside a small-image step
    whose loss is one graph (docs/benchmarks.md, "torch's fused optimizer, with the whole loss in one graph").
    Elsewhere torch's default stays: the CPU's per-parameter loop is what the pinned numbers hold, and the fused
    kernels were never run on MPS here."""
    return device.type == "cuda"


def build_optimizer(name: str, groups: list[dict], lr: float, weight_decay: float,
                    lars_eta: float, fused: bool = False) -> torch.optim.Optimizer:
    """groups: param_groups' (a group's lr is lr x its lr_mult; the schedule scales each group alike). fused:
    torch's fused SGD or AdamW (fused_for); LARS is this module's own multi-tensor update either way."""
    params = [{**g, "lr": lr * g.get("lr_mult", 1.0)} for g in groups]
    kernel = {"fused": True} if fused else {}  # not fused=False: torch reads that as "no multi-tensor default" too
    if name == "lars":
        return LARS(params, lr=lr, momentum=0.9, weight_decay=weight_decay, eta=lars_eta)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, **kernel)
    if name == "adamw":
        # What ViTs train with (the recipes' ViT rule, train/recipes.py): weight decay on every trainable parameter
        # and torch's default betas, as MoCo v3's main_moco.py; a frozen patch projection is in no group at all.
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, **kernel)
    raise ValueError(name)


IMPLEMENTATION = ("fused", "foreach")  # the group options that choose torch's kernels, not the arithmetic


def load_optimizer(optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """optimizer.load_state_dict(saved), keeping this run's kernels: torch restores every group option as saved, so
    a CUDA run's checkpoint resumed on the CPU would bring its fused update along (and a CPU run's, resumed on
    CUDA, the default). The saved groups take this optimizer's choice before loading, which is also what decides
    where AdamW's step count is put (on the parameter's device for the fused update). Groups that do not pair up
    load as saved, for torch to refuse."""
    groups = saved["param_groups"]
    if len(groups) == len(optimizer.param_groups):
        groups = [{**g, **{k: now[k] for k in IMPLEMENTATION if k in now}}
                  for g, now in zip(groups, optimizer.param_groups)]
    optimizer.load_state_dict({**saved, "param_groups": groups})


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak, then cosine decay to 0 at total_steps (all three papers' schedule)."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
