"""How a method is declared: each method file ends with one MethodSpec, and train.methods builds its registry from
them. Config resolution (train/recipes.py, train/runspec.py), augmentation (train/augment.py) and the export
metadata read only the spec, so adding a method is one file ending in a spec and one line in train/methods."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from core.views import ViewRecipe


@dataclass(frozen=True)
class Recipe:
    values: dict  # PretrainConfig fields the recipe sets when the user did not
    views: dict = field(default_factory=dict)  # ViewRecipe fields changed on both views (empty: the paper's views)
    source: str = ""  # where the values come from and what was changed here


@dataclass(frozen=True)
class MethodSpec:
    name: str  # the --method value
    title: str  # as the paper writes it (model metadata, Xcode's model view)
    build: Callable  # (backbone, feat_dim, resolved config) -> the method's nn.Module
    paper: Recipe  # the paper's ImageNet hyper-parameters, unchanged
    small: Recipe  # the CIFAR-size benchmarks' (train/recipes.py says when each is chosen)
    views: tuple[ViewRecipe, ViewRecipe]  # the paper's two views
