"""Training recipes by scale: the papers' (ImageNet: 1.28M images, 224 px, 30k+ steps) and small-data ones (the
CIFAR-size benchmarks: thousands to tens of thousands of images, 32 px, a few thousand steps).

A recipe is data: per method, the config values it sets and the changes it makes to the paper's views. `choose`
picks one for a run's scale; `fill` puts its values into every option the user left unset, so a flag or a --config
value always wins over the recipe. The paper recipes are the methods' DEFAULTS, unchanged.

Loss scale matters when a value is carried over from another code base: plain SGD moves weights by lr x gradient, so
a loss twice as large is a learning rate twice as large. This project's losses, against lightly's CIFAR-10 benchmark
(the anchor of the small recipes):
- SimCLR: NT-Xent averaged over the 2N views, the same as lightly's NTXentLoss: same lr and weight decay.
- BYOL: (2 - 2 cos) summed over both directions, 4x lightly's 0.5 x (-cos) summed: lr / 4 and weight decay x 4 make
  exactly lightly's SGD trajectory (buffer and step both scale away).
- MoCo v3: the paper's InfoNCE x 2 tau summed over both directions, at tau 0.2: 0.4x the per-logit gradient of
  lightly's MoCo (0.5 x its InfoNCE at tau 0.1), so lightly's lr 0.12 is 0.3 here.
"""

from __future__ import annotations

import dataclasses

from train import augment
from train.backbones import BACKBONES
from train.methods import METHODS

# auto picks the papers' recipe only for a run the papers tuned it on: ImageNet-like images, sets and step counts
# (SimCLR's shortest ImageNet schedule, 100 epochs at batch 4096, is ~31k steps). Anything smaller gets the small
# recipe: on this project's own runs the papers' LARS recipes stayed near or below random init for a few thousand
# steps (docs/recipes.md), and the CIFAR benchmarks all train small images with other settings.
PAPER_MIN_IMAGES = 100_000  # ImageNet-100 (126k) is the smallest set solo-learn trains with the papers' LARS recipes
PAPER_MIN_STEPS = 30_000
PAPER_MIN_SIZE = 65  # above the CIFAR-size stem limit (train/backbones.SMALL_STEM_MAX_SIZE = 64)


# Warm-up: the papers' 10 epochs (SimCLR, BYOL, MoCo v3 on ImageNet; solo-learn's CIFAR runs too), but never more
# than a tenth of the run, which is what 10 epochs are of the papers' shortest (100-epoch) schedules. One epoch is
# 2 to 8 steps at full rate from a random init on the recipe sets; a tenth took MoCo v3 on digits from 10 points below
# random init to 8 above, and on digits-sizes from +41 to +52 (docs/recipes.md, the H200 sweep of optimizers and
# warm-up).
WARMUP_EPOCHS = 10.0
WARMUP_SHARE = 0.1


# Vision Transformers, in either recipe: MoCo v3's ViT settings (Chen, Xie, He 2021, "An Empirical Study of Training
# Self-Supervised Vision Transformers"; its code's facebookresearch/moco-v3 CONFIG.md, ViT-S and ViT-B:
# --optimizer=adamw --lr=1.5e-4 --weight-decay=.1 --moco-t=.2 --warmup-epochs=40 of 300 --stop-grad-conv1): AdamW at
# 1.5e-4 x batch/256 with weight decay 0.1 on every parameter (main_moco.py), and for MoCo v3 temperature 0.2 and
# the frozen random patch projection (train/backbones.freeze_patch_projection, applied by train/methods/mocov3.py).
# SimCLR and BYOL take the same optimiser settings and keep their own temperature: their papers trained no ViT, and
# AdamW is what self-supervised ViT recipes use (MoCo v3, DINO). Not tuned by measurement on the small sets yet:
# the paper's values as they are, in both recipes.
VIT_VALUES = {name: dict(optimizer="adamw", lr=1.5e-4, weight_decay=0.1,
                         **({"temperature": 0.2} if name == "mocov3" else {})) for name in METHODS}
VIT_WARMUP_EPOCHS = 40.0  # of the paper's 300: the same cap by share as the convnets' 10 of 100
VIT_WARMUP_SHARE = VIT_WARMUP_EPOCHS / 300
VIT_SOURCE = "; ViT: MoCo v3's ViT settings (AdamW, lr 1.5e-4 x batch/256, wd 0.1, warm-up 40 of 300 epochs{})"


def is_vit(backbone: str | None) -> bool:
    return backbone in BACKBONES and BACKBONES[backbone].family == "vit"


def warmup_epochs(epochs: int, backbone: str | None = None) -> float:
    if is_vit(backbone):
        return min(VIT_WARMUP_EPOCHS, VIT_WARMUP_SHARE * epochs)
    return min(WARMUP_EPOCHS, WARMUP_SHARE * epochs)


# Each method's two recipes live in its own file (train/methods/*.py, its SPEC), with their sources.
PAPER = {name: spec.paper for name, spec in METHODS.items()}
SMALL = {name: spec.small for name, spec in METHODS.items()}
RECIPES = {"paper": PAPER, "small": SMALL}


def choose(requested: str, n_train: int, steps: int, image_size: int) -> tuple[str, str]:
    """(recipe name, why) for a run of n_train images, `steps` optimisation steps at image_size px."""
    if requested != "auto":
        return requested, f"--recipe {requested}"
    scale = f"auto: {n_train:,} train images, {steps:,} steps, {image_size} px"
    short = [what for what, low in ((f"< {PAPER_MIN_IMAGES:,} images", n_train < PAPER_MIN_IMAGES),
                                    (f"< {PAPER_MIN_STEPS:,} steps", steps < PAPER_MIN_STEPS),
                                    (f"< {PAPER_MIN_SIZE} px", image_size < PAPER_MIN_SIZE)) if low]
    if short:
        return "small", f"{scale}: below ImageNet scale ({', '.join(short)})"
    return "paper", (f"{scale}: ImageNet scale (>= {PAPER_MIN_IMAGES:,} images, {PAPER_MIN_STEPS:,} steps, "
                     f"{PAPER_MIN_SIZE} px)")


def values(name: str, method: str, backbone: str | None = None) -> dict:
    """The recipe's config values for the method, with the ViT rule on top for a ViT backbone."""
    return {**RECIPES[name][method].values, **(VIT_VALUES[method] if is_vit(backbone) else {})}


def source(name: str, method: str, backbone: str | None = None) -> str:
    """Where the recipe's values come from, the ViT rule included when it applies."""
    extra = VIT_SOURCE.format(", temperature 0.2, frozen patch projection" if method == "mocov3" else "")
    return RECIPES[name][method].source + (extra if is_vit(backbone) else "")


def view_values(name: str, method: str) -> dict:
    """The config values the recipe's views stand for, each the recipe's own change, else the paper's: the smallest
    crop area share of the views at the run's size (those of every method crop alike) and the second view's
    solarization chance (BYOL's and MoCo v3's 0.2 on view 2 only, SimCLR's 0)."""
    changes, paper = RECIPES[name][method].views, METHODS[method].views
    full = next(v for v in paper if v.size == 1.0)  # a spec has one (MethodSpec checks)
    return {"crop_min_scale": changes.get("crop_scale", full.crop_scale)[0],
            "solarize_p": changes.get("solarize_p", paper[1].solarize_p)}


def views_for(name: str, method: str, image_size: int, min_scale: float | None = None,
              solarize: float | None = None) -> tuple[augment.ViewRecipe, ...]:
    """The views of the method's paper (blur dropped at <= 64 px, augment.recipes_for) with the recipe's changes,
    the smallest crop set to min_scale when given (--crop-min-scale), and the second view's solarization chance set
    to `solarize` when given (--solarize-p; the first view keeps the paper's: none). The crop scale changes the
    views at the run's size only: a multi-crop method's smaller views keep their own, which is what makes them local."""
    changes = dict(RECIPES[name][method].views)
    if min_scale is not None:
        changes["crop_scale"] = (min_scale, 1.0)
    local = {k: v for k, v in changes.items() if k != "crop_scale"}
    views = [dataclasses.replace(v, **(changes if v.size == 1.0 else local)) for v in augment.recipes_for(method, image_size)]
    if solarize is not None:
        views[1] = dataclasses.replace(views[1], solarize_p=solarize)
    return tuple(views)
