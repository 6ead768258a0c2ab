"""MoCo v3 (Chen, Xie, He 2021): momentum encoder, projector + predictor, symmetric InfoNCE; optionally a ring
buffer of past keys as extra negatives, for batches too small to hold enough negatives."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from core.views import ViewRecipe
from train import distributed
from train.backbones import freeze_patch_projection
from train.heads import at_least_fp32, cosine_momentum, ema_update, frozen_copy, mlp, online_and_momentum
from train.method_spec import MethodSpec, Recipe

# The paper's ResNet defaults (and its main_moco.py): 3-layer projector and 2-layer predictor (4096 hidden,
# 256 out, BN at the end), temperature 1.0, momentum 0.99 rising to 1 on a cosine, LARS lr 0.6 x batch/256,
# weight decay 1e-6. queue 0: the paper uses in-batch negatives only; a queue helps batches of a few hundred.
DEFAULTS = {"temperature": 1.0, "proj_dim": 256, "proj_hidden_dim": 4096, "pred_hidden_dim": 4096,
            "momentum_base": 0.99, "optimizer": "lars", "lr": 0.6, "weight_decay": 1e-6, "queue_size": 0, "pred_lr": 1.0}


def info_nce(q: torch.Tensor, k: torch.Tensor, temperature: float, queue: torch.Tensor | None = None,
             first_positive: int = 0) -> torch.Tensor:
    """MoCo v3's contrastive loss: row i of q matches row first_positive + i of k; other keys (and queued keys)
    are negatives. k may hold more rows than q: every rank's keys, with this rank's starting at first_positive.
    Scaled by 2 * temperature as in the paper. fp32 (fp64 in an fp64 run) with logsumexp (cross_entropy): no overflow."""
    q = F.normalize(at_least_fp32(q), dim=1)
    k = F.normalize(at_least_fp32(k), dim=1)
    logits = q @ k.T
    if queue is not None and queue.numel():
        logits = torch.cat([logits, q @ queue.T], dim=1)
    targets = torch.arange(q.shape[0], device=q.device) + first_positive
    return F.cross_entropy(logits / temperature, targets) * (2 * temperature)


class KeyQueue(nn.Module):
    """Preallocated ring buffer of normalised keys: `push` overwrites the oldest rows in place (no torch.cat
    growth, constant memory); `keys` is the filled part."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("buffer", torch.zeros(size, dim))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))
        self._full = False  # host-side: once full, a ring stays full

    def _load_from_state_dict(self, *args, **kwargs):
        self._full = False  # the loaded count decides again
        super()._load_from_state_dict(*args, **kwargs)

    def push(self, keys: torch.Tensor) -> None:
        size = self.buffer.shape[0]
        with torch.no_grad():  # a block, not a decorator: mutmut (`make mutation`) skips decorated functions
            keys = F.normalize(at_least_fp32(keys.detach()), dim=1)[-size:]
            idx = (self.ptr + torch.arange(keys.shape[0], device=keys.device)) % size
            self.buffer.index_copy_(0, idx, keys)
            self.ptr.copy_((self.ptr + keys.shape[0]) % size)
            self.filled.copy_(torch.clamp(self.filled + keys.shape[0], max=size))

    def keys(self) -> torch.Tensor:
        """The filled rows. Reading the count from the device waits for the GPU, so it is read only until the
        ring is full (the first size / keys-per-step steps); from then on every row is a key and no read is due."""
        if not self._full:
            n = int(self.filled)
            if n < self.buffer.shape[0]:
                return self.buffer[:n]
            self._full = True
        return self.buffer


class MoCoV3(nn.Module):
    def __init__(self, backbone: nn.Module, feat_dim: int, cfg):
        super().__init__()
        freeze_patch_projection(backbone)  # a ViT's random patch projection never trains (the paper's Sec. 4)
        self.backbone = backbone
        self.projector = mlp(feat_dim, cfg.proj_hidden_dim, cfg.proj_dim, layers=3, last_bn=True)
        self.predictor = mlp(cfg.proj_dim, cfg.pred_hidden_dim, cfg.proj_dim, layers=2, last_bn=True)
        self.momentum_backbone = frozen_copy(backbone)
        self.momentum_projector = frozen_copy(self.projector)
        self.temperature = cfg.temperature
        self.momentum_base = cfg.momentum_base
        self.momentum = cfg.momentum_base
        self.queue = KeyQueue(cfg.queue_size, cfg.proj_dim) if cfg.queue_size > 0 else None

    @property
    def loss_capturable(self) -> bool:
        """train/training.LossGraph may capture forward without a key queue: the queue reads its count of keys
        from the device while it fills, which a CUDA graph cannot do."""
        return self.queue is None

    def forward(self, views: list[torch.Tensor], precision) -> torch.Tensor:
        x1, x2 = views
        (q1, q2), (k1, k2) = online_and_momentum(x1, x2, precision, self.backbone, (self.projector, self.predictor),
                                                 self.momentum_backbone, (self.momentum_projector,))
        # Negatives: every rank's keys (the paper's concat_all_gather); this rank's positives start at rank * n.
        first = distributed.rank() * q1.shape[0]
        k1, k2 = distributed.gather_with_grad(k1), distributed.gather_with_grad(k2)
        queued = self.queue.keys().clone() if self.queue is not None else None
        loss = (info_nce(q1, k2, self.temperature, queued, first)
                + info_nce(q2, k1, self.temperature, queued, first))
        if self.queue is not None and self.training:
            self.queue.push(torch.cat([k1, k2]))  # all ranks' keys, so every rank's queue stays identical
        return loss

    def after_step(self, progress: float) -> None:
        """As BYOL's: the momentum encoder's EMA (under no_grad in ema_update; no decorator, which mutmut skips)."""
        self.momentum = cosine_momentum(self.momentum_base, progress)
        ema_update(self.momentum_backbone, self.backbone, self.momentum)
        ema_update(self.momentum_projector, self.projector, self.momentum)


def summary(c: dict) -> list[str]:
    return [f"temperature {c.get('temperature')}", f"momentum {c.get('momentum_base')} → 1", f"queue {c.get('queue_size')}"]


# The paper trains with BYOL's augmentation (Chen, Xie, He 2021, Sec. 5; Grill et al. 2020, Table 6): blur always on
# view 1, solarize on view 2. Written out here rather than imported, so that no method file depends on another.
VIEWS = (ViewRecipe(blur_p=1.0, solarize_p=0.0), ViewRecipe(blur_p=0.1, solarize_p=0.2))

# The small recipe: solo-learn's CIFAR recipe (scripts/pretrain/cifar/mocov3.yaml: temperature 0.2, heads 4096 -> 256,
# asymmetric views without blur), with lightly's CIFAR optimiser (SGD, wd 5e-4) instead of LARS at trust 0.02; lr 0.3
# per 256 is lightly's MoCo step in this loss's units (train/recipes.py's docstring). SGD, wd 5e-4 and temperature
# 0.2 gained 6 points over the paper recipe at 1,400 steps. Two changes from the H200 sweeps in docs/recipes.md:
# EMA from 0.9 instead of solo-learn's 0.99 (a key encoder averaging ~10 steps, not ~100, keeps up with a
# run of a few hundred steps: +13 points on digits-sizes) and crops from 25 % of the image, not 8 % (+12 more there).
SPEC = MethodSpec(
    name="mocov3", title="MoCo v3", build=MoCoV3,
    paper=Recipe(dict(DEFAULTS), source="MoCo v3 (Chen, Xie, He 2021), ResNet settings"),
    small=Recipe(
        dict(optimizer="sgd", lr=0.3, weight_decay=5e-4, temperature=0.2, proj_dim=256, proj_hidden_dim=4096,
             pred_hidden_dim=4096, momentum_base=0.9, queue_size=0, pred_lr=1.0),
        views=dict(crop_scale=(0.25, 1.0)),
        source="solo-learn's CIFAR MoCo v3 (temperature 0.2, 4096 -> 256 heads) with lightly's CIFAR SGD (wd 5e-4, "
               "lr 0.3 = its MoCo step in this loss's units); EMA from 0.9 and crops from 25 %, measured here"),
    views=VIEWS,
    summary=summary,
    fixed_on_resume=("proj_dim", "proj_hidden_dim", "pred_hidden_dim", "queue_size", "pred_lr"),
    own_options=("queue_size",),
    before_option={"pred_lr": 1.0, "crop_min_scale": 0.08},  # runs from before these options: the papers' values
)
