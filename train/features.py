"""Frozen features for evaluation: the backbone in eval mode, fp32, on the deterministic evaluation view.

Every probe (linear, kNN, the online monitor) reads features made here, so the three ways an evaluation can be
inflated or skewed at this point are ruled out once: no augmentation (center crop / resize only), BatchNorm on its
running statistics (eval mode, so a batch's composition cannot change an image's feature), and no reduced
precision (autocast switched off explicitly, so an fp16/bf16 region around the call cannot leak in).
"""

from __future__ import annotations

import torch

from core.errors import PipelineError
from train.augment import center_views, normalize


@torch.no_grad()
def extract_features(backbone: torch.nn.Module, images: torch.Tensor, image_size: int, device: torch.device,
                     batch_size: int = 256) -> torch.Tensor:
    """uint8 N x 3 x S x S images -> float32 N x D features on the CPU. The backbone must already be on `device`;
    its train/eval mode (module by module) is restored afterwards, so the pretraining monitor can call this."""
    if batch_size < 1:
        raise PipelineError(f"feature batch size must be >= 1, got {batch_size}")
    dtypes = {p.dtype for p in backbone.parameters()}
    if dtypes != {torch.float32}:
        raise PipelineError(f"evaluation needs an fp32 backbone, got parameters in {sorted(map(str, dtypes))}")
    modes = {m: m.training for m in backbone.modules()}
    backbone.eval()
    out = []
    try:
        with torch.autocast(device.type, enabled=False):
            for start in range(0, images.shape[0], batch_size):
                x = normalize(center_views(images[start : start + batch_size], image_size), device)
                f = backbone(x)
                if f.dtype != torch.float32:  # a backbone that casts internally would make fp32 a lie
                    raise PipelineError(f"backbone returned {f.dtype} features; evaluation is fp32 only")
                out.append(f.cpu())
    finally:
        for m, training in modes.items():
            m.train(training)
    if not out:
        raise PipelineError("no images to extract features from")
    return torch.cat(out)
