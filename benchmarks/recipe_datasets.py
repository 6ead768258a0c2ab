"""Real, offline, labelled image sets for judging pretraining recipes, written as `folder:` datasets.

    python benchmarks/recipe_datasets.py OUT [--per-class N] [--eval-per-class N] [--seed S]

writes OUT/<name>/train/<class>/*.png and OUT/<name>/eval/<class>/*.png (32 x 32 PNG) for four sets from three
packages' bundled images, each with a held-out eval split that shares no source pixels with its train split:

- digits: scikit-learn's 1,797 handwritten 8x8 digits, each scaled to fill the 32 px square (10 classes); eval = a
  fifth of the digits of each class (stratified, seeded);
- digits-sizes: the same digits drawn at 12, 20 and 28 px at a random place on a black 32 px square (3 images per
  digit); eval = the same held-out fifth, so no digit is in both splits;
- textures: grayscale patches of ten of scikit-image's bundled photographs and textures (brick, grass, gravel,
  camera, coins, moon, page, text, cell, hubble deep field), one class per picture, each patch 24-64 px square at a
  random place, resized to 32; train patches come from the left three quarters of each picture, eval patches from
  the right quarter, so no pixel is in both;
- photos: colour patches of ten photographs bundled with scikit-image (astronaut, chelsea, coffee, rocket, retina,
  immunohistochemistry, motorcycle), scikit-learn (china, flower) and matplotlib (grace_hopper), split the same way.

No downloads: every source ships inside its wheel (scikit-image is among the project's dependencies). Deterministic
for a seed. Default sizes keep each set near 4,300-4,500 train images: 8 steps an epoch at batch 512, so the whole
GPU grid of benchmarks/recipes_gpu.sh fits in about 12 minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from train import photos  # the patch cutter the `photos` SPEC uses (run from the repository root, or installed)

SIZE = 32
DIGIT_SIZES = (12, 20, 28)
PATCH_RANGE = (24, 64)  # patch side in source pixels before resizing to 32
TRAIN_SHARE = 0.75  # left part of each picture for train patches, the rest for eval


def _write(root: Path, split: str, cls: str, index: int, img: Image.Image) -> None:
    d = root / split / cls
    d.mkdir(parents=True, exist_ok=True)
    img.save(d / f"{index:05d}.png")


def _digits_heldout(rng: np.random.Generator):
    from sklearn.datasets import load_digits

    d = load_digits()
    gray = (d.images * (255.0 / 16.0)).round().astype(np.uint8)
    is_eval = np.zeros(len(gray), dtype=bool)
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(d.target == c))
        is_eval[idx[: round(len(idx) * 0.2)]] = True
    return gray, d.target, is_eval


def build_digits(root: Path, rng: np.random.Generator) -> None:
    gray, target, is_eval = _digits_heldout(rng)
    for i, (g, c) in enumerate(zip(gray, target)):
        img = Image.fromarray(g, "L").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        _write(root, "eval" if is_eval[i] else "train", str(c), i, img)


def build_digits_sizes(root: Path, rng: np.random.Generator) -> None:
    gray, target, is_eval = _digits_heldout(rng)
    for i, (g, c) in enumerate(zip(gray, target)):
        for j, s in enumerate(DIGIT_SIZES):
            canvas = Image.new("L", (SIZE, SIZE), 0)
            digit = Image.fromarray(g, "L").resize((s, s), Image.Resampling.BILINEAR)
            x, y = rng.integers(0, SIZE - s + 1, size=2)
            canvas.paste(digit, (int(x), int(y)))
            _write(root, "eval" if is_eval[i] else "train", str(c), i * len(DIGIT_SIZES) + j, canvas)


def _texture_sources() -> dict[str, np.ndarray]:
    import skimage.data as sk

    pics = {n: getattr(sk, n)() for n in ("brick", "grass", "gravel", "camera", "coins", "moon", "page", "text", "cell")}
    hubble = sk.hubble_deep_field()
    pics["hubble"] = (hubble[..., :3].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)).round().astype(np.uint8)
    return pics


def build_patches(root: Path, pics: dict[str, np.ndarray], per_class: int, eval_per_class: int,
                  rng: np.random.Generator) -> None:
    for name, pic in pics.items():
        cut = int(pic.shape[1] * TRAIN_SHARE)
        for split, n, (x0, x1) in (("train", per_class, (0, cut)), ("eval", eval_per_class, (cut, pic.shape[1]))):
            for i, (img, _) in enumerate(photos.patches(pic, n, x0, x1, rng, SIZE, PATCH_RANGE)):
                _write(root, split, name, i, Image.fromarray(img))


def build_all(out: Path, per_class: int = 450, eval_per_class: int = 100, seed: int = 0,
              names: tuple[str, ...] = ("digits", "digits-sizes", "textures", "photos")) -> list[Path]:
    """Write each set into out/<name> (replacing an older one atomically: built aside, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    builders = {
        "digits": lambda root, rng: build_digits(root, rng),
        "digits-sizes": lambda root, rng: build_digits_sizes(root, rng),
        "textures": lambda root, rng: build_patches(root, _texture_sources(), per_class, eval_per_class, rng),
        "photos": lambda root, rng: build_patches(root, photos.photographs(), per_class, eval_per_class, rng),
    }
    done = []
    for name in names:
        tmp = out / f".{name}.tmp{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        builders[name](tmp, np.random.default_rng(seed))
        final = out / name
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        done.append(final)
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--per-class", type=int, default=450, help="train patches per class (textures, photos)")
    ap.add_argument("--eval-per-class", type=int, default=100, help="eval patches per class (textures, photos)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="build only these sets")
    args = ap.parse_args()
    names = tuple(args.only) if args.only else ("digits", "digits-sizes", "textures", "photos")
    for root in build_all(args.out, args.per_class, args.eval_per_class, args.seed, names):
        counts = {s: sum(1 for _ in (root / s).rglob("*.png")) for s in ("train", "eval")}
        classes = len([d for d in (root / "train").iterdir() if d.is_dir()])
        print(f"{root}: {classes} classes, {counts['train']} train, {counts['eval']} eval images")


if __name__ == "__main__":
    main()
