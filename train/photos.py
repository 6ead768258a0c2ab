"""The `photos` data SPEC: square patches of the three photographs that ship inside the project's own required
dependencies (scikit-learn's china.jpg and flower.jpg, matplotlib's grace_hopper.jpg), so `make all` trains on real
photographs with no download.

Classes: each photograph is cut into a 2 x 2 grid and each cell is one class (12 classes, e.g. `china-top-left`):
three classes alone would leave a random init little to lose (colour tells the three pictures apart), while
neighbouring cells of one picture share its colours and light, so telling them apart takes what the patch shows.
Held-out patches share no pixel with training ones: in every cell, train patches lie in its left three quarters and
val patches in its right quarter (as benchmarks/recipe_datasets.py cuts its photo sets), and the set marks them as
its own fixed val split, as CIFAR's test batch is.

Torch-free and deterministic: the patches are drawn with one fixed seed, so every run (any --seed) sees the same
set, and the seed spread of a recipe measures its training alone.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

GRID = (2, 2)  # cells across, down: 12 classes from 3 photographs
CELL_NAMES = {(0, 0): "top-left", (1, 0): "top-right", (0, 1): "bottom-left", (1, 1): "bottom-right"}
TRAIN_SHARE = 0.75  # left part of each cell for train patches, the rest for val
PATCH_RANGE = (40, 64)  # patch side in source pixels; 64 is the narrowest val strip (grace_hopper's cells)
TRAIN_PER_CLASS = 200
VAL_PER_CLASS = 50
SET_SEED = 0  # one set for every run


def photographs() -> dict[str, np.ndarray]:
    """name -> H x W x 3 uint8, read from the installed wheels (never a download)."""
    import matplotlib.cbook
    from sklearn.datasets import load_sample_image

    pics = {"china": load_sample_image("china.jpg"), "flower": load_sample_image("flower.jpg")}
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        pics["grace_hopper"] = np.asarray(Image.open(f).convert("RGB"))
    return {k: np.ascontiguousarray(v[..., :3]) for k, v in pics.items()}


def patches(pic: np.ndarray, n: int, x0: int, x1: int, rng: np.random.Generator, out_size: int,
            patch_range: tuple[int, int] = PATCH_RANGE):
    """n (patch, (x, y, side)) pairs: square patches lying wholly in columns [x0, x1) of pic, each patch_range px
    (capped by the region), resized to out_size (Lanczos)."""
    h = pic.shape[0]
    hi = min(patch_range[1], h, x1 - x0)
    for _ in range(n):
        s = int(rng.integers(min(patch_range[0], hi), hi + 1))
        y = int(rng.integers(0, h - s + 1))
        x = int(rng.integers(x0, x1 - s + 1))
        crop = Image.fromarray(pic[y: y + s, x: x + s]).resize((out_size, out_size), Image.Resampling.LANCZOS)
        yield np.asarray(crop), (x, y, s)


def class_names() -> list[str]:
    return [f"{name}-{CELL_NAMES[(cx, cy)]}" for name in ("china", "flower", "grace_hopper")
            for cy in range(GRID[1]) for cx in range(GRID[0])]


def build(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], list[str]]:
    """(images N x size x size x 3 uint8, labels N, is_val N bool, class names in class_names() order, sources N:
    where each patch lies in its photograph, `china.jpg@x,y,side`)."""
    rng = np.random.default_rng(SET_SEED)
    pics = photographs()
    names = class_names()
    images, labels, is_val, sources = [], [], [], []
    for name, pic in pics.items():
        h, w = pic.shape[:2]
        for cy in range(GRID[1]):
            for cx in range(GRID[0]):
                label = names.index(f"{name}-{CELL_NAMES[(cx, cy)]}")
                left, right = w * cx // GRID[0], w * (cx + 1) // GRID[0]
                top, bottom = h * cy // GRID[1], h * (cy + 1) // GRID[1]
                cell = pic[top:bottom, left:right]
                cut = int(cell.shape[1] * TRAIN_SHARE)
                for val, n, (x0, x1) in ((False, TRAIN_PER_CLASS, (0, cut)), (True, VAL_PER_CLASS, (cut, cell.shape[1]))):
                    for img, (x, y, s) in patches(cell, n, x0, x1, rng, size):
                        images.append(img)
                        labels.append(label)
                        is_val.append(val)
                        sources.append(f"{name}.jpg@{left + x},{top + y},{s}")
    return np.stack(images), np.asarray(labels, dtype=np.int64), np.asarray(is_val, dtype=bool), names, sources


def train_count() -> int:
    return TRAIN_PER_CLASS * len(class_names())
