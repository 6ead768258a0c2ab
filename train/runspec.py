"""A run's pretraining config, from the flags and files that make it to what every later stage reads back.

The one home of what several stages share about a run: resolving a config against its recipe and checking its
bounds, the side its images are stored at, seeding, rebuilding the method's model, and reading a run directory
back (`read_run`: config.yaml, checked against the checkpoint; `recorded_split`: split.json, checked against the
images). Stages import this module and read the run directory; they never import each other.
"""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import numpy as np
import torch

from core import rundir
from core.config import check_ranges, load_config, to_dict
from core.errors import PipelineError
from core.views import view_side
from train import recipes
from train import backbones
from train.configs import PretrainConfig
from train.data import ImageData, count_train_images
from train.data import store_size_for as data_store_size
from train.methods import METHODS

# What must agree between config.yaml and the checkpoint's own record: the things that decide the architecture.
ARCHITECTURE_KEYS = ("method", "backbone", "image_size", "small_stem")
SPLIT_KEYS = ("num_images", "train", "val", "train_sources", "val_sources")  # what pretrain writes into split.json


def chosen_recipe(cfg: PretrainConfig) -> tuple[str, str]:
    """(recipe, why) for this run's scale: train images (counted from the SPEC without decoding), steps, image size."""
    n_train = count_train_images(cfg.data, cfg.val_fraction)
    steps = n_train // cfg.batch_size * cfg.epochs
    return recipes.choose(cfg.recipe, n_train, steps, cfg.image_size)


def resolve(cfg: PretrainConfig) -> PretrainConfig:
    """Fill every None the method uses with the chosen recipe's value (train/recipes.py), so config.yaml records
    what actually ran; `recipe` itself stays as asked (run() records the one chosen)."""
    name, _ = chosen_recipe(cfg)
    # an option the method does not use (BYOL's temperature) stays None; every method crops
    values = {**recipes.view_values(name, cfg.method), "warmup_epochs": recipes.warmup_epochs(cfg.epochs, cfg.backbone),
              **recipes.values(name, cfg.method, cfg.backbone)}
    filled = {k: (values[k] if getattr(cfg, k) is None and k in values else getattr(cfg, k)) for k in to_dict(cfg)}
    return PretrainConfig(**filled)


def validate(cfg: PretrainConfig) -> None:
    check_ranges(cfg)  # each option's own bounds, declared on it (train/configs.py); what follows spans options
    backbones.check_run_side(cfg.backbone, cfg.small_stem, cfg.image_size)
    if cfg.store_size and cfg.store_size < cfg.image_size:
        raise PipelineError(f"store_size {cfg.store_size} is smaller than image_size {cfg.image_size}")
    for other in METHODS.values():
        for key in other.own_options:
            if other.name != cfg.method and getattr(cfg, key):
                raise PipelineError(f"{key} is a {other.title} option; method is {cfg.method}")
    check_view_sides(cfg)


def check_view_sides(cfg: PretrainConfig) -> None:
    """Each view of the method at its own side (a multi-crop method's local views are smaller than the run's image)
    must fit the backbone: a ViT is built for one side, a convnet for sides down to its total stride."""
    small = small_stem(cfg)
    for side in sorted({view_side(v, cfg.image_size) for v in METHODS[cfg.method].views} - {cfg.image_size}):
        if backbones.row(cfg.backbone).family == "vit":
            raise PipelineError(f"{cfg.method} makes {side} px views beside its {cfg.image_size} px ones, and "
                                f"{cfg.backbone} is built for one image side: use a convnet backbone")
        try:
            backbones.check_image_size(cfg.backbone, small, side)
        except PipelineError as e:
            raise PipelineError(f"{cfg.method}'s {side} px views: {e}") from None


def store_size_for(cfg: PretrainConfig) -> int:
    return data_store_size(cfg.data, cfg.image_size, cfg.store_size)


def peak_lr(cfg: PretrainConfig) -> float:
    ratio = cfg.batch_size / 256
    return cfg.lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[cfg.lr_scaling]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def small_stem(cfg: PretrainConfig) -> bool:
    """Whether the run's backbone has the small stem: --small-stem auto|on|off against the image size, by the one
    rule in train/backbones.uses_small_stem."""
    return backbones.uses_small_stem(cfg.small_stem, cfg.image_size)


def backbone_args(cfg: PretrainConfig) -> dict:
    """The run's backbone builder arguments (what encoder.pt records)."""
    return backbones.backbone_args(cfg.backbone, small_stem(cfg), cfg.image_size)


def build_model(cfg: PretrainConfig) -> tuple[torch.nn.Module, int]:
    """The method's module around a fresh backbone; later stages rebuild it from the stored config."""
    backbone, feat_dim = backbones.build_from_args(cfg.backbone, backbone_args(cfg))
    return METHODS[cfg.method].build(backbone, feat_dim, cfg), feat_dim


# What --resume may not change, besides each method's own (MethodSpec.fixed_on_resume): what decides the backbone,
# the split, the draws and the batch.
FIXED_ON_RESUME = ("method", "recipe", "backbone", "image_size", "small_stem", "data", "batch_size", "seed", "val_fraction")


def fixed_on_resume() -> tuple[str, ...]:
    """Every option a resume refuses to change: the run's own, then every method's (another method's are None)."""
    return tuple(dict.fromkeys([*FIXED_ON_RESUME, *(key for spec in METHODS.values() for key in spec.fixed_on_resume)]))


def check_max_steps(cfg: PretrainConfig, n_train: int) -> None:
    """--max-steps cuts a run short and never stretches it: the learning-rate schedule spans the epochs, so steps
    past them would train on at a rate already decayed to zero."""
    per_epoch = n_train // cfg.batch_size
    total = per_epoch * cfg.epochs
    if per_epoch and cfg.max_steps > total:
        raise PipelineError(f"--max-steps {cfg.max_steps} is more than the {total} steps of {cfg.epochs} epochs "
                            f"({per_epoch} per epoch: {n_train} train images in batches of {cfg.batch_size}): "
                            f"raise --epochs to {math.ceil(cfg.max_steps / per_epoch)}, or lower --max-steps")


def config_for_run(config_file, overrides: dict, run_dir: Path, resume: bool, overwrite: bool = False) -> PretrainConfig:
    """A resumed run starts from its own config.yaml; flags may still change e.g. max_steps or epochs, but not
    what would make the checkpoint meaningless."""
    rundir.check_out(run_dir, resume, overwrite)
    saved = run_dir / rundir.CONFIG
    if resume:
        cfg = load_config(PretrainConfig, config_file or saved, overrides)
        old = load_config(PretrainConfig, saved)
        # A config.yaml written before an option existed trained with what the method's spec says (before_option),
        # whatever its recipe says now; evaluation and export read config.yaml as written, where None means the same.
        for key, meant in METHODS[old.method].before_option.items():
            if getattr(old, key) is None:
                old = dataclasses.replace(old, **{key: meant})
                if getattr(cfg, key) is None:  # a flag or a --config value is kept, and refused below if it differs
                    cfg = dataclasses.replace(cfg, **{key: meant})
        for key in fixed_on_resume():
            if getattr(cfg, key) is not None and getattr(old, key) is not None and getattr(cfg, key) != getattr(old, key):
                raise PipelineError(f"--resume: `{key}` is {getattr(old, key)!r} in {saved}, cannot change it to {getattr(cfg, key)!r}")
    else:
        cfg = load_config(PretrainConfig, config_file, overrides)
    cfg = resolve(cfg)
    validate(cfg)  # a bad value fails here, before a process is launched or a file written
    check_max_steps(cfg, count_train_images(cfg.data, cfg.val_fraction))
    return cfg



def read_run(run_dir: Path, ckpt: dict | None = None) -> PretrainConfig:
    """RUN/config.yaml (every value resolved by pretraining); with the run's checkpoint, checked against the config
    the checkpoint was saved with, so a checkpoint copied in from another run is refused."""
    path = run_dir / rundir.CONFIG
    if not path.is_file():
        raise PipelineError(f"no {rundir.CONFIG} in {run_dir}: the run directory is incomplete (re-run `pipeline pretrain`)")
    cfg = load_config(PretrainConfig, path)
    saved = (ckpt or {}).get(rundir.CKPT_CONFIG) or {}
    for key in ARCHITECTURE_KEYS:
        if key in saved and saved[key] != getattr(cfg, key):
            raise PipelineError(f"{run_dir / rundir.LAST_CHECKPOINT} was trained with {key}={saved[key]!r} but {path} says "
                                f"{getattr(cfg, key)!r}: the checkpoint belongs to another run")
    return cfg


def read_split(run_dir: Path) -> dict:
    """RUN/split.json as pretraining wrote it (indices and source ids of train and val), unchecked against images."""
    path = run_dir / rundir.SPLIT
    split = rundir.load_json(path, "split")
    if not isinstance(split, dict) or not set(SPLIT_KEYS) <= set(split):
        raise PipelineError(f"{path} is not a split written by `pipeline pretrain`: re-run pretraining")
    return split


def recorded_split(run_dir: Path, data: ImageData, instead: str = "") -> dict:
    """RUN/split.json, once its recorded indices are checked to still point at the recorded source files / ids of
    `data` (the run's images as they are now): evaluation on a changed folder would leak or mislabel. `instead`
    is the caller's way out, added to the error."""
    path = run_dir / rundir.SPLIT
    split = read_split(run_dir)
    same = split["num_images"] == len(data)
    for part in ("train", "val"):
        idx, src = split[part], split[f"{part}_sources"]
        same = same and len(idx) == len(src) and all(0 <= i < len(data) and data.sources[i] == s for i, s in zip(idx, src))
    if not same:
        raise PipelineError(f"the images of {data.spec} are no longer those recorded in {path}: restore them"
                            f"{', or ' + instead if instead else ''}")
    return split
