"""What a submission must hold for every stage of its chain to succeed, checked before it is accepted.

Each option's own bounds and choices are checked by core/config.py from the declarations in train/configs.py, as
for `pipeline pretrain`. Here is what spans options, the machine and the data, each rule the one a stage would fail
on later: the device `pipeline doctor` finds usable, the image size its backbone and stem allow, and images enough that
pretraining fills a batch, linear-eval has two classes to tell apart and validate two held-out images to compare.
Images are counted as train/data.py would load them, by its own rules (train/data_spec.py, torch-free): the files
folder_files finds, decodable ones only, held out per class by split_counts.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from core.errors import PipelineError
from train.backbones import check_run_side
from train.data_spec import folder_files, split_counts

# scikit-learn's bundled digits per class (1797 scans), and CIFAR's own split: fixed facts of published sets, checked
# against the libraries by tests/pipeline/test_serve_door.py
DIGITS_PER_CLASS = (178, 182, 177, 183, 181, 182, 181, 179, 174, 180)
CIFAR = {"cifar10": (10, 5000, 1000), "cifar100": (100, 500, 100)}  # classes, train and test images per class
SYNTHETIC_CLASSES = 4  # train/data.make_synthetic labels image i with i % 4
MIN_VALIDATE = 2  # validate's retrieval agreement compares each held-out image's neighbours: at least two
MIN_PER_CLASS = 2  # linear-eval chooses its C on images held out of each class's train part


class Refused(ValueError):
    """A submission that could not succeed; the message says why and what to change."""


@dataclass
class Images:
    per_class: list[int]  # decodable images per class (one group when unlabelled)
    labelled: bool
    fixed: tuple[list[int], list[int]] | None = None  # (train, val) per class of a set with its own test split
    files: int = 0  # files looked at
    undecodable: str | None = None  # one file that did not decode, to name in a refusal

    def split(self, val_fraction: float) -> tuple[list[int], list[int]]:
        """(train, val) images per class, as train/data.make_split holds them out."""
        return self.fixed if self.fixed is not None else split_counts(self.per_class, val_fraction)


def decodes(path: Path) -> bool:
    """The file is an image PIL decodes whole (a truncated one fails here as in the data stage). JPEGs are decoded at
    a reduced scale: every coefficient is still read, at a fraction of the time."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            if im.format == "JPEG":
                im.draft("RGB", (64, 64))
            im.load()
        return True
    except Exception:  # PIL raises many types for non-images and damaged files
        return False


def folder_images(root: Path) -> Images:
    """A folder as train/data.py's folder loader sees it: the files folder_files gives it, each class's decodable."""
    root = Path(root)
    classes, files, labels, _ = folder_files(root)
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:  # PIL releases the GIL
        ok = list(pool.map(decodes, files))
    per_class = [0] * max(len(classes), 1)  # a flat folder is one group
    for good, label in zip(ok, labels or [0] * len(files)):
        per_class[label] += good
    bad = next((f for f, good in zip(files, ok) if not good), None)
    return Images(per_class=per_class, labelled=labels is not None, files=len(files),
                  undecodable=str(bad.relative_to(root)) if bad else None)


def spec_images(spec: str) -> Images | None:
    """A data SPEC the server allows, counted without loading it; None for a kind counted here by no rule."""
    kind, _, arg = spec.partition(":")
    if kind == "synthetic" and arg.isdigit():
        n = int(arg)
        return Images([n // SYNTHETIC_CLASSES + (c < n % SYNTHETIC_CLASSES) for c in range(SYNTHETIC_CLASSES)], True)
    if kind == "digits":
        return Images(list(DIGITS_PER_CLASS), True)
    if kind in CIFAR:
        classes, train, test = CIFAR[kind]
        return Images([train + test] * classes, True, fixed=([train] * classes, [test] * classes))
    if kind == "folder" and Path(arg).is_dir():
        return folder_images(Path(arg))
    return None


def check_images(images: Images, batch_size: int, val_fraction: float) -> None:
    """Refused unless pretraining fills a batch, validate has held-out images to compare and, with labels,
    linear-eval has classes to tell apart; the message says what to change."""
    total = sum(images.per_class)
    if total == 0:
        example = f" (e.g. {images.undecodable!r})" if images.undecodable else ""
        raise Refused(f"none of the {images.files} file(s) is an image that can be decoded{example}: "
                      "upload JPEG, PNG or other image files")
    train, val = images.split(val_fraction)
    if sum(train) < batch_size:
        raise Refused(f"{sum(train)} training image(s) after holding out {sum(val)} of {total} (val_fraction "
                      f"{val_fraction:g}): batch_size {batch_size} needs at least {batch_size}; lower batch_size or "
                      "add images")
    if sum(val) < MIN_VALIDATE:
        raise Refused(f"{sum(val)} held-out image(s) of {total} at val_fraction {val_fraction:g}: validating the "
                      f"exported model needs at least {MIN_VALIDATE}; raise val_fraction or add images")
    if images.labelled:
        present = [t for t, n in zip(train, images.per_class) if n]
        if len(present) < 2:
            raise Refused(f"{len(present)} class folder(s) hold images: linear evaluation needs at least 2 (or upload "
                          "a flat zip, with no class folders, to skip it)")
        if min(present) < MIN_PER_CLASS:
            raise Refused(f"a class has {min(present)} training image(s): linear evaluation needs at least "
                          f"{MIN_PER_CLASS} per class; add images to it or remove its folder")


def check_machine(cfg, described: dict) -> str:
    """The device the job runs on (`auto` resolved as `pipeline doctor` reports it), refused where it is not
    usable here, with the options that depend on it; raises Refused."""
    usable = described["devices"]
    device = described["auto_device"] if cfg.device == "auto" else cfg.device
    if device not in usable:
        raise Refused(f"`device` {cfg.device} is not usable on this server (usable: {', '.join(usable)}, or auto)")
    if cfg.cuda_graphs == "on" and device != "cuda":  # train/training.use_cuda_graphs's rule for one process
        raise Refused("`cuda_graphs` on needs device cuda")
    if cfg.sync_bn and device != "cuda":
        raise Refused("`sync_bn` needs device cuda")
    if cfg.preprocess == "coreml" and not described.get("coreml_predicts"):
        raise Refused("`preprocess` coreml needs Core ML, which cannot run on this server: use auto or torch")
    return device


def check_options(cfg, described: dict) -> None:
    """What train/runspec.py's validate checks across options, with the same torch-free backbone rules and the
    methods' own options as the pipeline describes them."""
    try:
        check_run_side(cfg.backbone, cfg.small_stem, cfg.image_size)
    except PipelineError as e:
        raise Refused(f"`image_size`: {e}") from None
    if cfg.store_size and cfg.store_size < cfg.image_size:
        raise Refused(f"`store_size` {cfg.store_size} is smaller than `image_size` {cfg.image_size}")
    for name, own in described["own_options"].items():
        for key in own["options"]:
            if name != cfg.method and getattr(cfg, key):
                raise Refused(f"`{key}` is a {own['title']} option; method is {cfg.method}")
