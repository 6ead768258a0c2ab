"""The `photos` data SPEC: square patches of the ten colour photographs that ship inside the project's own required
dependencies (scikit-learn's china and flower, matplotlib's grace_hopper, scikit-image's astronaut, chelsea, coffee,
rocket, retina, immunohistochemistry and the left view of its stereo motorcycle), so `make all` trains on real
photographs with no download.

Classes: one per photograph (10). Each patch is 64-128 px of its picture (a piece that still shows a scene: an eye
and a paw, a cup's rim, a rocket's flank), resized to the run's size. Held-out patches share no pixel with training
ones: train patches lie in each picture's left three quarters and val patches in its right quarter (as
benchmarks/recipe_datasets.py cuts its photo sets), and the set marks them as its own fixed val split, as CIFAR's
test batch is. Telling the pictures apart from the other side of each one is what the learned features must carry
over; colour alone gives a random init about half of it.

Torch-free and deterministic: the patches are drawn with one fixed seed, so every run (any --seed) sees the same
set, and the seed spread of a recipe measures its training alone.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

TRAIN_SHARE = 0.75  # left part of each picture for train patches, the rest for val
# Patch side in source pixels, capped by the region it is cut from (chelsea's val strip is 113 px): over 40-64 px
# the patches were texture and the linear gain over random init half as steady (docs/recipes.md).
PATCH_RANGE = (64, 128)
TRAIN_PER_CLASS = 240  # 2,400 train images: 18 steps of 128 an epoch
VAL_PER_CLASS = 60
SET_SEED = 0  # one set for every run
# scikit-image's photographs by their loader's name: the bundled files, never its downloadable ones
SKIMAGE = ("astronaut", "chelsea", "coffee", "rocket", "retina", "immunohistochemistry")
CLASSES = ("china", "flower", "grace_hopper", *SKIMAGE, "motorcycle")  # one per photograph, in label order


def photographs() -> dict[str, np.ndarray]:
    """name -> H x W x 3 uint8, read from the installed wheels (never a download), in class order."""
    import matplotlib.cbook
    import skimage.data
    from sklearn.datasets import load_sample_image

    pics = {"china": load_sample_image("china.jpg"), "flower": load_sample_image("flower.jpg")}
    with matplotlib.cbook.get_sample_data("grace_hopper.jpg") as f:
        pics["grace_hopper"] = np.asarray(Image.open(f).convert("RGB"))
    pics.update({name: getattr(skimage.data, name)() for name in SKIMAGE})
    pics["motorcycle"] = skimage.data.stereo_motorcycle()[0]
    return {name: np.ascontiguousarray(pics[name][..., :3]) for name in CLASSES}


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
    return list(CLASSES)


def build(size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], list[str]]:
    """(images N x size x size x 3 uint8, labels N, is_val N bool, class names in class_names() order, sources N:
    where each patch lies in its photograph, `chelsea@x,y,side`)."""
    rng = np.random.default_rng(SET_SEED)
    names = class_names()
    images, labels, is_val, sources = [], [], [], []
    for name, pic in photographs().items():
        cut = int(pic.shape[1] * TRAIN_SHARE)
        for val, n, (x0, x1) in ((False, TRAIN_PER_CLASS, (0, cut)), (True, VAL_PER_CLASS, (cut, pic.shape[1]))):
            for img, (x, y, s) in patches(pic, n, x0, x1, rng, size):
                images.append(img)
                labels.append(names.index(name))
                is_val.append(val)
                sources.append(f"{name}@{x},{y},{s}")
    return np.stack(images), np.asarray(labels, dtype=np.int64), np.asarray(is_val, dtype=bool), names, sources


def train_count() -> int:
    return TRAIN_PER_CLASS * len(class_names())
