"""How a method is declared: each file of train/methods/ ends with one MethodSpec, which holds everything the rest
of the pipeline knows about the method. Config resolution and checks (train/recipes.py, train/runspec.py), views
(train/augment.py), the export metadata and the report read only the spec, so adding a method is one file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from core.views import ViewRecipe


@dataclass(frozen=True)
class Recipe:
    values: dict  # PretrainConfig fields the recipe sets when the user did not
    # ViewRecipe fields changed on every view (empty: the paper's views); crop_scale on those at the run's size only
    views: dict = field(default_factory=dict)
    source: str = ""  # where the values come from and what was changed here


@dataclass(frozen=True)
class MethodSpec:
    name: str  # the --method value: its file's name in train/methods/
    title: str  # as the paper writes it (model metadata, Xcode's model view)
    build: Callable  # (backbone, feat_dim, resolved config) -> the method's nn.Module
    paper: Recipe  # the paper's ImageNet hyper-parameters, unchanged
    small: Recipe  # the CIFAR-size benchmarks' (train/recipes.py says when each is chosen)
    # The paper's views, in the order forward(views, precision) receives them: two for SimCLR, BYOL and MoCo v3, more
    # for a multi-crop method, whose smaller ones carry their `size`. At least one is at the run's size (size 1).
    views: tuple[ViewRecipe, ...]
    summary: Callable[[dict], list[str]]  # config.yaml's values -> its items on the report's run card
    # PretrainConfig options that shape its modules or their optimiser groups: --resume refuses to change them
    fixed_on_resume: tuple[str, ...] = ()
    # options no other method reads: another method given one (non-zero) refuses it by name
    own_options: tuple[str, ...] = ()
    # option -> what a config.yaml written before the option existed trained with: a resumed older run keeps it
    before_option: dict = field(default_factory=dict)

    def __post_init__(self):
        if not any(v.size == 1.0 for v in self.views):  # the export's input size, and the CUDA-graphed batch's
            raise ValueError(f"method {self.name}: no view at the run's image size (a ViewRecipe with size 1)")
