"""Whether a run's BatchNorm running statistics are what its evaluation features lack: the trained backbone and
its random init, each evaluated as stored and again after its BatchNorm statistics are recomputed on the run's
train images (reset, then one pass in train mode with a cumulative average: momentum None), on the run's own split.

    PYTHONPATH=. python benchmarks/bn_recalibration.py RUN

Prints, per backbone, the mean cosine between the L2-normalised features of 500 train images, the weighted kNN
top-1 (k 200, T 0.1) and the linear probe's top-1 (train/probe.py: C chosen on the train rows, as linear-eval
does) on the val split. Why it exists: torchvision's MobileNetV3 builds its BatchNorms with momentum 0.01 (an
ImageNet-length run's), so after a few hundred steps the running statistics still held (0.99 ** steps) of their
initial (0, 1) and the eval-mode features shared one direction; this measured it, and the backbone builder now sets
0.1 (docs/recipes.md). It still tells whether any run's stored statistics are what its features lack.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from stages.linear_eval import load_trained_backbone, random_backbone
from train.augment import center_views, normalize
from train.data import load_data
from train.features import extract_features
from train.knn import weighted_knn_top1
from train.probe import choose_c, fit_probe
from train.runspec import read_split, store_size_for

CPU = torch.device("cpu")


@torch.no_grad()
def recalibrate(backbone: torch.nn.Module, images: torch.Tensor, image_size: int, batch: int = 256) -> None:
    """Every BatchNorm's running mean and variance recomputed as the plain average over `images` (center views)."""
    for m in backbone.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None
    backbone.train()
    for start in range(0, len(images), batch):
        backbone(normalize(center_views(images[start: start + batch], image_size), CPU))
    backbone.eval()


def evaluate(backbone, data, train_idx, val_idx, image_size: int) -> str:
    x = extract_features(backbone, data.images[train_idx], image_size, CPU)
    v = extract_features(backbone, data.images[val_idx], image_size, CPU)
    y, yv = data.labels[train_idx], data.labels[val_idx]
    n = F.normalize(x[:500], dim=1)
    knn = weighted_knn_top1(x, y, v, yv, len(data.classes))
    probe = fit_probe(x.numpy(), y.numpy(), choose_c(x.numpy(), y.numpy(), 0.2, 0)["c"])
    linear = float((probe.predict(v.numpy()) == yv.numpy()).mean())
    return f"mean cosine {(n @ n.T).mean().item():.3f}  kNN top-1 {100 * knn:.1f} %  linear top-1 {100 * linear:.1f} %"


def main(run: Path) -> None:
    trained, cfg, _ = load_trained_backbone(run)
    data = load_data(cfg.data, store_size_for(cfg))
    split = read_split(run)
    train_idx, val_idx = torch.as_tensor(split["train"]), torch.as_tensor(split["val"])
    for name, backbone in (("trained", trained), ("random init", random_backbone(cfg))):
        print(f"{name + ', as stored:':30s}{evaluate(backbone, data, train_idx, val_idx, cfg.image_size)}", flush=True)
        recalibrate(backbone, data.images[train_idx], cfg.image_size)
        print(f"{name + ', BN recalibrated:':30s}{evaluate(backbone, data, train_idx, val_idx, cfg.image_size)}", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
