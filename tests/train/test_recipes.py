"""Recipes by scale: auto's choice, what fills the unset options, what always wins, what a run records."""

import dataclasses

import numpy as np
import pytest
import yaml
from PIL import Image

from core import rundir
from core.errors import PipelineError
from train import augment, recipes
from stages import pretrain
from train.data import count_train_images, load_data, make_split
from train.methods import byol, mocov3, simclr
from train.configs import PretrainConfig
from train.method_spec import Recipe
from train.runspec import config_for_run, resolve
from tests.tiny_run import TINY


@pytest.mark.parametrize("n_train, steps, size, expected", [
    (1_281_167, 31_000, 224, "paper"),  # ImageNet, SimCLR's shortest schedule
    (126_000, 100_000, 224, "paper"),  # ImageNet-100
    (7_200, 1_400, 32, "small"),  # the held-out set at batch 512, 100 epochs
    (50_000, 195_000, 32, "small"),  # CIFAR-10 for 1000 epochs: many steps, but CIFAR-size images
    (9_469, 40_000, 128, "small"),  # Imagenette: too few images for the papers' recipes
    (1_281_167, 3_000, 224, "small"),  # ImageNet for a couple of epochs
])
def test_auto_picks_paper_only_at_imagenet_scale(n_train, steps, size, expected):
    name, why = recipes.choose("auto", n_train, steps, size)
    assert name == expected
    assert why.startswith("auto: ") and f"{n_train:,}" in why


@pytest.mark.parametrize("asked", ["small", "paper"])
def test_an_asked_recipe_is_taken_at_any_scale(asked):
    for scale in [(100, 10, 16), (10**6, 10**6, 224)]:
        assert recipes.choose(asked, *scale) == (asked, f"--recipe {asked}")


def test_paper_recipes_are_the_methods_paper_defaults():
    for method, defaults in [("simclr", simclr.DEFAULTS), ("byol", byol.DEFAULTS), ("mocov3", mocov3.DEFAULTS)]:
        assert recipes.values("paper", method) == defaults
        assert recipes.views_for("paper", method, 32) == augment.recipes_for(method, 32)
        cfg = resolve(PretrainConfig(method=method, recipe="paper"))
        assert {k: getattr(cfg, k) for k in defaults} == defaults


def test_small_recipes_change_values_and_views_only_through_the_table():
    for method in ("simclr", "byol", "mocov3"):
        cfg = resolve(PretrainConfig(method=method, recipe="small"))
        assert {k: getattr(cfg, k) for k in recipes.SMALL[method].values} == recipes.SMALL[method].values
        assert cfg.optimizer == "sgd"
    v1, v2 = recipes.views_for("small", "simclr", 32)
    assert (v1.brightness, v1.contrast, v1.saturation, v1.hue) == (0.4, 0.4, 0.4, 0.1) and v1 == v2
    assert v1.blur_p == 0.0 and recipes.views_for("small", "simclr", 96)[0].blur_p == 0.5  # blur kept above 64 px
    # BYOL's small views are the paper's (blur dropped at 32 px) cropping from 25 % instead of 8 %
    assert recipes.views_for("small", "byol", 32) == tuple(dataclasses.replace(v, crop_scale=(0.25, 1.0))
                                                           for v in augment.recipes_for("byol", 32))


def test_flags_and_config_values_win_over_the_recipe(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("method: byol\nlr: 0.5\nmomentum_base: 0.996\n")
    cfg = config_for_run(cfg_file, {"weight_decay": 1e-4, "optimizer": "lars"}, tmp_path / "run", False)
    assert (cfg.lr, cfg.momentum_base, cfg.weight_decay, cfg.optimizer) == (0.5, 0.996, 1e-4, "lars")
    small = recipes.SMALL["byol"].values
    assert (cfg.proj_hidden_dim, cfg.pred_hidden_dim) == (small["proj_hidden_dim"], small["pred_hidden_dim"])


def test_a_run_states_and_records_the_recipe_it_chose(tmp_path, tiny_overrides):
    said = []
    out = tmp_path / "run"
    cfg = config_for_run(None, {**tiny_overrides, "method": "mocov3", "max_steps": 1}, out, False)
    assert cfg.recipe == "auto"
    pretrain.run(cfg, out, say=said.append)
    assert said[0].startswith("recipe small (auto: 44 train images, 10 steps, 16 px: below ImageNet scale (< 100,000 "
                              "images, < 30,000 steps, < 65 px))")
    text = (out / rundir.CONFIG).read_text()
    assert "# recipe small: auto: 44 train images" in text
    saved = yaml.safe_load(text)
    assert saved["recipe"] == "small" and saved["optimizer"] == "sgd" and saved["temperature"] == 0.2
    assert saved["momentum_base"] == 0.9 and saved["crop_min_scale"] == 0.25
    # The recorded config, used again, gives the same run settings.
    again = config_for_run(out / rundir.CONFIG, {}, tmp_path / "again", False)
    assert dataclasses.asdict(again) == {**dataclasses.asdict(cfg), "recipe": "small"}
    # A resumed run keeps its recipe (the views depend on it): asking for another is refused.
    with pytest.raises(PipelineError, match="`recipe` is 'small'"):
        config_for_run(None, {"recipe": "paper"}, out, True)


def test_a_run_names_the_values_it_sets_over_its_recipe(tmp_path, tiny_overrides):
    """configs/default.yaml sets temperature 0.2 over the `small` recipe's 0.5: the recipe line must not leave the
    reader believing the recipe's value ran."""
    said = []
    over = {**tiny_overrides, "method": "simclr", "recipe": "small", "temperature": 0.2, "max_steps": 1}
    pretrain.run(config_for_run(None, over, tmp_path / "run", False), tmp_path / "run", say=said.append)
    line = said[0].split("; set over it: ")
    assert line[0].endswith(recipes.source("small", "simclr")) and "T 0.5" in line[0]
    assert set(line[1].split(", ")) == {"temperature 0.2", f"proj_dim {TINY['proj_dim']}",
                                        f"proj_hidden_dim {TINY['proj_hidden_dim']}"}


def test_train_count_matches_the_split(tmp_path):
    rng = np.random.default_rng(0)
    for c, n in (("a", 7), ("b", 12)):
        (tmp_path / c).mkdir()
        for i in range(n):
            Image.fromarray(rng.integers(0, 255, (10, 10, 3), dtype=np.uint8)).save(tmp_path / c / f"{i}.png")
    for spec in ("digits", "photos", "synthetic:50", f"folder:{tmp_path}"):
        for fraction in (0.1, 0.25):
            split = make_split(load_data(spec, 8), fraction, seed=0)
            assert count_train_images(spec, fraction) == len(split["train"]), (spec, fraction)
    assert count_train_images(f"folder:{tmp_path / 'missing'}", 0.1) == 0


def test_crop_min_scale_comes_from_the_recipe_and_a_flag_wins(tmp_path):
    assert resolve(PretrainConfig(method="mocov3", recipe="small")).crop_min_scale == 0.25
    assert resolve(PretrainConfig(method="byol", recipe="small")).crop_min_scale == 0.25
    assert resolve(PretrainConfig(method="simclr", recipe="small")).crop_min_scale == 0.08
    assert resolve(PretrainConfig(method="mocov3", recipe="paper")).crop_min_scale == 0.08
    for v in recipes.views_for("small", "mocov3", 32):
        assert v.crop_scale == (0.25, 1.0)
    assert recipes.views_for("small", "byol", 32, 0.5)[1].crop_scale == (0.5, 1.0)
    cfg = config_for_run(None, {"method": "mocov3", "crop_min_scale": 0.6}, tmp_path / "run", False)
    assert cfg.crop_min_scale == 0.6
    with pytest.raises(PipelineError, match="crop_min_scale"):
        config_for_run(None, {"crop_min_scale": 1.5}, tmp_path / "run2", False)


def test_a_multi_crop_methods_local_views_keep_their_own_crop_scale(monkeypatch):
    """The recipe's crop scale and --crop-min-scale are the views' at the run's size; smaller (local) views keep the
    scale their method gave them, the rest of the recipe's changes reach them, and blur goes by each view's side."""
    local = augment.ViewRecipe(crop_scale=(0.05, 0.4), size=0.25, blur_p=0.5)
    four = (*byol.SPEC.views, local, local)
    monkeypatch.setattr(byol, "SPEC", dataclasses.replace(byol.SPEC, views=four))
    assert augment.view_sizes("byol", 256) == (256, 256, 64, 64)
    for min_scale, crop in ((None, (0.25, 1.0)), (0.5, (0.5, 1.0))):  # the small recipe crops from 25 %
        views = recipes.views_for("small", "byol", 256, min_scale, 0.3)
        assert [v.crop_scale for v in views] == [crop, crop, (0.05, 0.4), (0.05, 0.4)]
        assert [v.blur_p for v in views] == [1.0, 0.1, 0.0, 0.0]  # the 64 px local views lose their blur
        assert [v.solarize_p for v in views] == [0.0, 0.3, 0.0, 0.0]
    monkeypatch.setitem(recipes.SMALL, "byol", Recipe({}, views=dict(brightness=0.7)))  # other changes: every view
    assert [v.brightness for v in recipes.views_for("small", "byol", 256)] == [0.7] * 4


def test_a_method_needs_a_view_at_the_runs_size():
    with pytest.raises(ValueError, match="no view at the run's image size"):
        dataclasses.replace(byol.SPEC, views=(augment.ViewRecipe(size=0.5),) * 2)


def _views_drawn(monkeypatch, field: str) -> list:
    """What pretraining hands its view batches: `field` of each of the two views, one entry per run."""
    seen = []
    real = pretrain.view_batches

    def spy(mode, images, views, *a, **k):
        seen.append([getattr(v, field) for v in views])
        return real(mode, images, views, *a, **k)

    monkeypatch.setattr(pretrain, "view_batches", spy)
    return seen


def test_the_run_crops_at_its_recorded_min_scale(tmp_path, tiny_overrides, monkeypatch):
    """The views pretraining draws use crop_min_scale (the recipe's, or the flag's), not the paper's 8 %."""
    seen = _views_drawn(monkeypatch, "crop_scale")
    for scale in (None, 0.4):
        over = {**tiny_overrides, "method": "mocov3", "max_steps": 1, **({"crop_min_scale": scale} if scale else {})}
        pretrain.run(config_for_run(None, over, tmp_path / str(scale), False), tmp_path / str(scale), say=lambda *_: None)
    assert seen == [[(0.25, 1.0)] * 2, [(0.4, 1.0)] * 2]


@pytest.mark.parametrize("epochs, expected", [(1000, 10.0), (100, 10.0), (20, 2.0), (5, 0.5)])
def test_warm_up_is_the_papers_ten_epochs_at_most_a_tenth_of_the_run(epochs, expected):
    for method in ("simclr", "byol", "mocov3"):
        for recipe in ("small", "paper"):
            assert resolve(PretrainConfig(method=method, recipe=recipe, epochs=epochs)).warmup_epochs == expected
    assert resolve(PretrainConfig(epochs=epochs, warmup_epochs=0.5)).warmup_epochs == 0.5  # a flag wins


def test_byol_small_centres_its_projections_and_speeds_its_predictor(tmp_path):
    """BYOL's small recipe: BN on the projector's output, the predictor at 10 x the rate, EMA from 0.9 and crops from
    25 % (docs/recipes.md: the H200 sweeps); the paper recipe keeps the paper's plain projector, one rate, EMA 0.99
    and crops from 8 %; methods without the option leave it unset; a flag wins, and the run records what it trained
    with."""
    small = resolve(PretrainConfig(method="byol", recipe="small"))
    assert (small.proj_last_bn, small.pred_lr, small.momentum_base, small.crop_min_scale) == ("on", 10.0, 0.9, 0.25)
    paper = resolve(PretrainConfig(method="byol", recipe="paper"))
    assert (paper.proj_last_bn, paper.pred_lr, paper.momentum_base, paper.crop_min_scale) == ("off", 1.0, 0.99, 0.08)
    assert resolve(PretrainConfig(method="mocov3")).pred_lr == 1.0
    assert resolve(PretrainConfig(method="simclr")).proj_last_bn is None
    assert resolve(PretrainConfig(method="mocov3")).proj_last_bn is None
    cfg = config_for_run(None, {"method": "byol", "proj_last_bn": "off", "pred_lr": 3.0}, tmp_path / "run", False)
    assert (cfg.proj_last_bn, cfg.pred_lr) == ("off", 3.0)
    with pytest.raises(PipelineError, match="pred_lr"):
        config_for_run(None, {"method": "byol", "pred_lr": 0.0}, tmp_path / "run2", False)


def test_solarization_is_the_papers_second_views_unless_a_flag_sets_it(tmp_path, tiny_overrides, monkeypatch):
    """--solarize-p: unset, the paper's second view (BYOL and MoCo v3 0.2, SimCLR 0), recorded in config.yaml; set, the
    second view's chance in the views training draws, the first view never solarized (the papers' asymmetry)."""
    for method, paper in (("byol", 0.2), ("mocov3", 0.2), ("simclr", 0.0)):
        for recipe in ("small", "paper"):
            assert resolve(PretrainConfig(method=method, recipe=recipe)).solarize_p == paper
    v1, v2 = recipes.views_for("small", "byol", 32, solarize=0.0)
    assert (v1.solarize_p, v2.solarize_p) == (0.0, 0.0) and v2.crop_scale == (0.25, 1.0) and v2.blur_p == 0.0
    assert recipes.views_for("small", "simclr", 32, 0.5, 0.7)[1].solarize_p == 0.7
    with pytest.raises(PipelineError, match="solarize_p"):
        config_for_run(None, {"solarize_p": 1.5}, tmp_path / "bad", False)
    seen = _views_drawn(monkeypatch, "solarize_p")
    for p in (None, 0.0, 1.0):
        out = tmp_path / str(p)
        over = {**tiny_overrides, "method": "byol", "max_steps": 1, **({"solarize_p": p} if p is not None else {})}
        pretrain.run(config_for_run(None, over, out, False), out, say=lambda *_: None)
        assert yaml.safe_load((out / rundir.CONFIG).read_text())["solarize_p"] == (0.2 if p is None else p)
    assert seen == [[0.0, 0.2], [0.0, 0.0], [0.0, 1.0]]
