"""What a view is, shared by every augmentation backend: the recipe of one view, the normalisation statistics, the
blur kernel rule and the meaning of the jitter codes.

A leaf on purpose: it imports nothing of this project (nor torch), so the CPU path (train/augment.py), the device
path (train/device_augment.py), the per-image pixel ops (train/preprocess.py), the Core ML preprocessing models
(train/preprocess_models.py) and the methods that declare their views can all read it without an import loop.
"""

from __future__ import annotations

from dataclasses import dataclass

# ImageNet statistics: what every torchvision ResNet recipe normalises with; stored in checkpoints and exports.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)

# The colour-jitter ops by code: augment.sample_params' `jitter_order` is a permutation of these indices.
JITTER_OPS = ("brightness", "contrast", "saturation", "hue")
HUE = JITTER_OPS.index("hue")  # the one jitter op that is no blend of the image with its grey (an HSV round trip)


@dataclass(frozen=True)
class ViewRecipe:
    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.2
    hue: float = 0.1
    gray_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    # The view's side as a share of the run's image size: 1 for the views every method has; a multi-crop method's
    # local crops are smaller (DINO's 96 px of a 224 px run: 96 / 224).
    size: float = 1.0


def view_side(recipe: ViewRecipe, image_size: int) -> int:
    """The side in pixels of a view made by `recipe` in a run of image_size px."""
    return image_size if recipe.size == 1.0 else max(1, round(recipe.size * image_size))


def blur_kernel_size(image_size: int) -> int:
    """10% of the image side, odd (SimCLR's choice: 23 px at 224)."""
    k = int(0.1 * image_size)
    return max(3, k + 1 - k % 2)
