"""The help says what an unset option becomes: every option the recipe fills names each recipe's value, and those
values are train/recipes.py's (configs.py types them because importing the recipes would load torch)."""

from __future__ import annotations

import re

import pytest

from core.config import _fields
from train import recipes
from train.configs import PretrainConfig
from tests.cli_helpers import cli

VIEW_KEYS = ("crop_min_scale", "solarize_p")


def recipe_values(name: str, key: str) -> dict:
    """method -> what recipe `name` sets `key` to (methods that do not use the option are absent)."""
    out = {}
    for method in recipes.METHODS:
        values = recipes.view_values(name, method) if key in VIEW_KEYS else recipes.values(name, method)
        if values.get(key) is not None:
            out[method] = values[key]
    return out


FILLED = sorted({key for name in recipes.RECIPES for method in recipes.METHODS
                 for key in recipes.values(name, method)} | set(VIEW_KEYS))


def parse(part: str) -> dict:
    """'simclr 0.12, byol 0.03' -> {simclr: 0.12, byol: 0.03}; a bare 'sgd (momentum 0.9)' is every method's."""
    items = [item.strip() for item in part.split(",")]
    if len(items) == 1 and items[0].split()[0] not in recipes.METHODS:
        return dict.fromkeys(recipes.METHODS, items[0].split()[0])
    out = {}
    for item in items:
        method, value = item.split()
        out[method] = value
    return out


def same(help_value: str, value) -> bool:
    return float(help_value) == float(value) if isinstance(value, (int, float)) else help_value == str(value)


@pytest.mark.parametrize("key", FILLED)
def test_help_names_each_recipes_value(key):
    why = _fields(PretrainConfig)[key].metadata["why"]
    m = re.search(r"small: (.*?); paper: (.*?)(;|$)", why)
    assert m, f"--{key}'s help does not say what each recipe sets: {why!r}"
    for name, part in (("small", m.group(1)), ("paper", m.group(2))):
        said, meant = parse(part), recipe_values(name, key)
        assert set(said) == set(meant) and all(same(said[k], meant[k]) for k in meant), (key, name, said, meant)


def test_nothing_claims_the_paper_recipe_as_the_default():
    """auto picks small for anything below ImageNet scale: no option's help may say an unset value is the paper's."""
    out = cli("pretrain", "--help").output
    assert "paper optimizer (LARS)" not in out and "paper value" not in out and "method's paper" not in out
    assert "small: sgd" in " ".join(out.split())


def test_the_recipe_rule_in_the_help_is_the_code_s():
    why = " ".join(_fields(PretrainConfig)["recipe"].metadata["why"].split())
    for threshold in (f"{recipes.PAPER_MIN_IMAGES:,} train images", f"{recipes.PAPER_MIN_STEPS:,} steps",
                      f"{recipes.PAPER_MIN_SIZE} px"):
        assert threshold in why
