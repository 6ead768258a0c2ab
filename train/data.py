"""Datasets by SPEC, decoded once into one uint8 tensor.

SPECs: `photos` (patches of ten photographs bundled in scikit-learn, matplotlib and scikit-image, train/photos.py:
the no-download default), `digits` (scikit-learn's bundled 8 x 8 digits), `folder:PATH` (class subfolders, or a
flat folder for label-free pretraining), `cifar10:PATH` / `cifar100:PATH` (the python-pickle batches as
distributed), `synthetic:N` (generated, labelled, for tests).

Every image is decoded once, converted to RGB correctly (EXIF rotation, alpha, CMYK, 16-bit) and stored square at
`store_size`; augmentation and evaluation crop from that tensor. This keeps epochs free of JPEG decoding and lets
the whole set live on the training device. A file that cannot be decoded is skipped and listed, never fatal.
What can be checked without decoding (a missing or empty folder, no image in it) is train/data_spec.py's, torch-free.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from core.errors import PipelineError
from train import photos
from train.data_spec import (cifar_files, cifar_root, folder_files, no_usable_images, parse_spec, split_counts,
                             synthetic_count)


@dataclass
class ImageData:
    images: torch.Tensor  # uint8, N x 3 x S x S
    labels: torch.Tensor | None  # int64 N, None for an unlabelled folder
    classes: list[str]
    sources: list[str]  # one id per image: a file path, or "<spec>#<index>"
    spec: str
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    fixed_val: np.ndarray | None = None  # bool mask of the dataset's own test set (CIFAR), else None

    def __len__(self) -> int:
        return self.images.shape[0]


def store_size_for(spec: str, image_size: int, store_size: int = 0) -> int:
    """The side images are kept at: `store_size` when set; folders 8/7 x the image size (room for the evaluation's
    center crop, as ImageNet's 256 -> 224); array sets at the image size. Every reader of a run's images uses this."""
    if store_size:
        return store_size
    return round(image_size * 8 / 7) if spec.startswith("folder:") else image_size


def load_data(spec: str, store_size: int, seed: int = 0) -> ImageData:
    """Load a SPEC at `store_size` pixels square. Raises PipelineError for anything a user can get wrong."""
    kind, arg = parse_spec(spec)
    if kind == "digits":
        data = _load_digits(store_size)
    elif kind == "photos":
        data = _load_photos(store_size)
    elif kind == "synthetic":
        data = make_synthetic(synthetic_count(arg), store_size, seed)
    elif kind in ("cifar10", "cifar100"):
        data = _load_cifar(kind, Path(arg), store_size)
    else:
        data = _load_folder(Path(arg), store_size)
    data.spec = spec
    if len(data) == 0:  # every file failed to decode (train/data_spec.check_folder already refused folders without one)
        raise no_usable_images(spec, Path(arg), data.skipped)
    return data


def count_train_images(spec: str, val_fraction: float) -> int:
    """How many images the train split of `spec` will hold, without decoding any: what the recipe choice reads
    (train/recipes.py). Counts files, so an undecodable one still counts; 0 when the SPEC cannot be read yet
    (load_data then says why)."""
    kind, arg = parse_spec(spec)
    if kind in ("cifar10", "cifar100"):
        return 50_000  # both keep their own 10,000-image test batch as val
    if kind == "photos":
        return photos.train_count()  # its own val patches, as CIFAR's
    if kind == "synthetic":
        n = int(arg) if arg.isdigit() else 0
        counts = np.bincount(np.arange(n) % 4) if n else np.zeros(0, dtype=np.int64)
    elif kind == "digits":
        from sklearn.datasets import load_digits

        counts = np.bincount(load_digits().target)
    else:
        root = Path(arg)
        if not root.is_dir():
            return 0
        classes, files, labels, _ = folder_files(root)
        counts = (np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes)) if labels is not None
                  else np.array([len(files)], dtype=np.int64))
    if not 0.0 <= val_fraction < 1.0:
        return int(counts.sum())  # make_split reports the bad fraction
    return sum(split_counts(counts.tolist(), val_fraction)[0])


def _resize_square(arr: np.ndarray, size: int) -> torch.Tensor:
    """N x H x W x 3 uint8 -> N x 3 x size x size uint8, antialiased, only when the size differs."""
    t = torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2)
    if t.shape[-1] == size and t.shape[-2] == size:
        return t.contiguous()
    out = torch.nn.functional.interpolate(t.float(), size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def _load_digits(store_size: int) -> ImageData:
    from sklearn.datasets import load_digits

    d = load_digits()
    gray = (d.images * (255.0 / 16.0)).round().astype(np.uint8)  # values are 0..16
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    n = len(gray)
    return ImageData(
        images=_resize_square(rgb, store_size),
        labels=torch.as_tensor(d.target, dtype=torch.int64),
        classes=[str(c) for c in range(10)],
        sources=[f"digits#{i}" for i in range(n)],
        spec="digits",
    )


def _load_photos(store_size: int) -> ImageData:
    images, labels, is_val, classes, sources = photos.build(store_size)
    return ImageData(
        images=torch.from_numpy(images).permute(0, 3, 1, 2).contiguous(),
        labels=torch.from_numpy(labels),
        classes=classes,
        sources=sources,
        spec="photos",
        fixed_val=is_val,
    )


def make_synthetic(n: int, size: int, seed: int = 0) -> ImageData:
    """Four classes of textures (horizontal/vertical stripes, checkerboard, disc) with random colours, phase,
    frequency and noise: learnable, but not by colour alone."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    labels = np.arange(n) % 4
    rng.shuffle(labels)
    imgs = np.empty((n, size, size, 3), dtype=np.uint8)
    for i, c in enumerate(labels):
        freq = rng.uniform(2, 5)
        phase = rng.uniform(0, 1)
        if c == 0:
            m = np.sin(2 * np.pi * (yy * freq + phase)) > 0
        elif c == 1:
            m = np.sin(2 * np.pi * (xx * freq + phase)) > 0
        elif c == 2:
            m = (np.sin(2 * np.pi * (xx * freq + phase)) > 0) ^ (np.sin(2 * np.pi * (yy * freq + phase)) > 0)
        else:
            cx, cy, r = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), rng.uniform(0.15, 0.35)
            m = (xx - cx) ** 2 + (yy - cy) ** 2 < r * r
        fg, bg = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        img = np.where(m[..., None], fg, bg) + rng.normal(0, 12, (size, size, 3))
        imgs[i] = np.clip(img, 0, 255).astype(np.uint8)
    return ImageData(
        images=torch.from_numpy(imgs).permute(0, 3, 1, 2).contiguous(),
        labels=torch.as_tensor(labels, dtype=torch.int64),
        classes=["hstripes", "vstripes", "checker", "disc"],
        sources=[f"synthetic#{i}" for i in range(n)],
        spec=f"synthetic:{n}",
    )


def _unpickle(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="bytes")
    except Exception as e:
        raise PipelineError(f"{path} is not a CIFAR python batch ({type(e).__name__})") from None


def _load_cifar(kind: str, root: Path, store_size: int) -> ImageData:
    root = cifar_root(kind, root)
    *train_files, test_file, meta_file = cifar_files(kind)
    test_files = [test_file]
    label_key, names_key = (b"labels", b"label_names") if kind == "cifar10" else (b"fine_labels", b"fine_label_names")
    parts, labels, is_val = [], [], []
    for names, val in ((train_files, False), (test_files, True)):
        for name in names:
            batch = _unpickle(root / name)
            x = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            parts.append(x)
            labels.extend(batch[label_key])
            is_val.extend([val] * len(x))
    classes = [c.decode() for c in _unpickle(root / meta_file)[names_key]]
    arr = np.concatenate(parts)
    return ImageData(
        images=_resize_square(arr, store_size),
        labels=torch.as_tensor(labels, dtype=torch.int64),
        classes=classes,
        sources=[f"{kind}#{i}" for i in range(len(arr))],
        spec=kind,
        fixed_val=np.asarray(is_val, dtype=bool),
    )


def decode_image(path: Path, size: int) -> np.ndarray:
    """Decode any PIL-readable file to size x size x 3 uint8 RGB: EXIF orientation applied, alpha composited on
    white, CMYK/palette/16-bit converted by value (not truncated), then resized (shorter side) and center-cropped."""
    with Image.open(path) as im:
        im.load()  # forces the full decode: truncated files fail here, not later in training
        im = ImageOps.exif_transpose(im)
        if im.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
            a = np.asarray(im, dtype=np.float64)
            scale = 257.0 if (im.mode.startswith("I;16") or a.max() > 255) else 1.0
            im = Image.fromarray(np.clip(np.round(a / scale), 0, 255).astype(np.uint8), "L")
        if im.mode in ("P", "PA", "LA", "La", "RGBa") or (im.mode == "P" and "transparency" in im.info):
            im = im.convert("RGBA")
        if im.mode == "RGBA":
            white = Image.new("RGBA", im.size, (255, 255, 255, 255))
            im = Image.alpha_composite(white, im)
        im = im.convert("RGB")
        im = ImageOps.fit(im, (size, size), Image.Resampling.BICUBIC)
        return np.asarray(im, dtype=np.uint8)


def _try_decode(path: Path, size: int):
    try:
        return decode_image(path, size), None
    except UnidentifiedImageError:
        return None, "not an image Pillow reads"
    except Exception as e:  # PIL raises many types for damaged and truncated files
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return None, f"{type(e).__name__}: {msg}"


def _load_folder(root: Path, store_size: int) -> ImageData:
    classes, files, labels, skipped = folder_files(root)
    workers = min(16, (os.cpu_count() or 1) * 2)  # PIL releases the GIL while decoding
    with ThreadPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(lambda f: _try_decode(f, store_size), files))
    keep_imgs, keep_labels, sources = [], [], []
    for i, (f, (arr, err)) in enumerate(zip(files, results)):
        if err is not None:
            skipped.append((str(f), err))
            continue
        keep_imgs.append(arr)
        sources.append(str(f))
        if labels is not None:
            keep_labels.append(labels[i])
    images = (torch.from_numpy(np.stack(keep_imgs)).permute(0, 3, 1, 2).contiguous() if keep_imgs
              else torch.empty(0, 3, store_size, store_size, dtype=torch.uint8))
    return ImageData(
        images=images,
        labels=torch.as_tensor(keep_labels, dtype=torch.int64) if labels is not None else None,
        classes=classes,
        sources=sources,
        spec=f"folder:{root}",
        skipped=skipped,
    )


def make_split(data: ImageData, val_fraction: float, seed: int) -> dict:
    """Deterministic train/val indices. CIFAR keeps its own test set as val; labelled sets are split per class
    so every class is in both halves; an unlabelled folder is split at random."""
    n = len(data)
    if data.fixed_val is not None:
        val = np.flatnonzero(data.fixed_val)
        train = np.flatnonzero(~data.fixed_val)
    else:
        if not 0.0 <= val_fraction < 1.0:
            raise PipelineError(f"val_fraction must be in [0, 1), got {val_fraction}")
        rng = np.random.default_rng(seed)
        groups = [np.arange(n)] if data.labels is None else [np.flatnonzero(data.labels.numpy() == c) for c in np.unique(data.labels.numpy())]
        val_parts, train_parts = [], []
        for g, k in zip(groups, split_counts([len(g) for g in groups], val_fraction)[1]):
            g = rng.permutation(g)
            val_parts.append(g[:k])
            train_parts.append(g[k:])
        val = np.sort(np.concatenate(val_parts))
        train = np.sort(np.concatenate(train_parts))
    return {
        "spec": data.spec,
        "seed": seed,
        "val_fraction": val_fraction,
        "num_images": n,
        "train": train.tolist(),
        "val": val.tolist(),
        "train_sources": [data.sources[i] for i in train],
        "val_sources": [data.sources[i] for i in val],
    }
