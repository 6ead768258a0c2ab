"""SimCLR (Chen et al. 2020): projection MLP and the NT-Xent loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from stages import distributed
from stages.methods.heads import mlp

# The paper's defaults (the config may override each): 2-layer projector to 128-d, temperature 0.5 for
# CIFAR-size batches (0.1 is for the 4096-image ImageNet batch), LARS lr 0.3 x batch/256, weight decay 1e-6.
DEFAULTS = {"temperature": 0.5, "proj_dim": 128, "proj_hidden_dim": 2048, "optimizer": "lars", "lr": 0.3, "weight_decay": 1e-6}


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """NT-Xent over 2N embeddings; each row's positive is its other view. Computed in fp32 with logsumexp
    (cross_entropy) so large logits never overflow, even when the inputs came out of fp16/bf16.

    With several processes, z1/z2 are this rank's share of the global batch: its rows are scored against every
    rank's embeddings (gathered with gradients), so the mean of the ranks' losses is the one-process loss of the
    global batch, and so is the gradient once DDP averages it."""
    z = F.normalize(torch.cat([z1, z2]).float(), dim=1)
    n = z1.shape[0]
    rank, world = distributed.rank(), distributed.world_size()
    everything = z if world == 1 else torch.cat([distributed.gather_with_grad(z[:n]), distributed.gather_with_grad(z[n:])])
    logits = z @ everything.T / temperature
    i = torch.arange(n, device=z.device)  # made on the device: a host index would stall the GPU queue each step
    own = torch.cat([i, i + n * world]) + rank * n  # each row's own column in `everything`
    # A view is not its own negative. A mask and masked_fill, not `logits[rows, own] = -inf`: that indexed write
    # turns the Python -inf into a device tensor by a copy that waits for the GPU, twice a step (forward and
    # backward), which left an H200 idle for a third of every 32 px step.
    own_column = own[:, None] == torch.arange(logits.shape[1], device=z.device)[None, :]
    logits = logits.masked_fill(own_column, float("-inf"))
    targets = torch.cat([own[n:], own[:n]])
    return F.cross_entropy(logits, targets)


class SimCLR(nn.Module):
    def __init__(self, backbone: nn.Module, feat_dim: int, cfg):
        super().__init__()
        self.backbone = backbone
        self.projector = mlp(feat_dim, cfg.proj_hidden_dim, cfg.proj_dim)
        self.temperature = cfg.temperature

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, precision) -> torch.Tensor:
        with precision.backbone():
            h = self.backbone(torch.cat([x1, x2]))
        with precision.heads():
            z = self.projector(h.float() if precision.head_dtype is None else h)
        z1, z2 = z.chunk(2)
        return nt_xent(z1, z2, self.temperature)

    def after_step(self, progress: float) -> None:
        pass
