"""`--resume` refuses every change that would make the checkpoint meaningless (docs/pretrain.md: method, backbone, image
size, batch size, data; and the other recorded fields that shape the model, the split or the draws), each named in
one line, before anything is trained or written. Changes that are fine (more epochs, a step limit) are accepted."""

import numpy as np
import pytest
import yaml
from PIL import Image

from core import rundir
from core.errors import PipelineError
from stages import pretrain
from train.methods import METHODS
from train.runspec import config_for_run
from tests.tiny_run import pretrain_tiny

REFUSED = [  # field, the run's value, a changed one
    ("method", "simclr", "byol"),
    ("backbone", "resnet18", "resnet34"),
    ("image_size", 16, 24),
    ("small_stem", "auto", "on"),
    ("batch_size", 8, 16),
    ("data", "synthetic:48", "synthetic:64"),
    ("seed", 0, 1),
    ("proj_dim", 16, 32),
    ("proj_hidden_dim", 32, 64),
    ("pred_hidden_dim", 32, 64),
    ("val_fraction", 0.1, 0.2),
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One step of the tiny run (conftest's tiny_overrides), with a checkpoint to resume from."""
    out = tmp_path_factory.mktemp("resume") / "run"
    over = dict(data="synthetic:48", backbone="resnet18", image_size=16, batch_size=8, epochs=2, proj_hidden_dim=32,
                proj_dim=16, pred_hidden_dim=32, device="cpu", num_workers=0, warmup_epochs=0.5, seed=0, max_steps=1)
    pretrain_tiny(out, **over)
    return out


def test_the_table_covers_the_recorded_values(trained):
    cfg = config_for_run(None, {}, trained, resume=True)
    for key, old, _ in REFUSED:
        assert getattr(cfg, key) == old, key


@pytest.mark.parametrize("key,old,new", REFUSED, ids=[k for k, _, _ in REFUSED])
def test_resume_refuses_a_changed_field(trained, key, old, new):
    before = (trained / rundir.LAST_CHECKPOINT).read_bytes()
    with pytest.raises(PipelineError, match=f"--resume: `{key}` is {old!r} in .*cannot change it to {new!r}"):
        config_for_run(None, {key: new}, trained, resume=True)
    assert (trained / rundir.LAST_CHECKPOINT).read_bytes() == before


def test_resume_refuses_a_changed_field_from_a_config_file(trained, tmp_path):
    saved = yaml.safe_load((trained / rundir.CONFIG).read_text())
    f = tmp_path / "c.yaml"
    f.write_text(yaml.safe_dump({**saved, "batch_size": 16}))
    with pytest.raises(PipelineError, match="`batch_size` is 8"):
        config_for_run(f, {}, trained, resume=True)


def test_mocov3_queue_size_change_is_refused(tmp_path, tiny_overrides):
    out = tmp_path / "run"
    pretrain_tiny(out, method="mocov3", queue_size=8, max_steps=1)
    with pytest.raises(PipelineError, match="`queue_size` is 8"):
        config_for_run(None, {"queue_size": 16}, out, resume=True)


def test_resume_accepts_what_does_not_change_the_model(trained):
    cfg = config_for_run(None, {"epochs": 3, "max_steps": 2, "log_every": 5}, trained, resume=True)
    assert (cfg.epochs, cfg.max_steps, cfg.log_every) == (3, 2, 5)


def test_resume_refuses_changed_images_under_the_same_spec(tmp_path, tiny_overrides):
    """The data SPEC is the same folder, but its images are not those the run trained on."""
    folder = tmp_path / "images"
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (folder / cls).mkdir(parents=True)
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(folder / cls / f"{i}.png")
    out = tmp_path / "run"
    over = {**tiny_overrides, "data": f"folder:{folder}", "max_steps": 1, "val_fraction": 0.2}
    pretrain_tiny(out, **over)
    before = (out / rundir.LAST_CHECKPOINT).read_bytes()
    (folder / "a" / "0.png").rename(folder / "a" / "renamed.png")
    with pytest.raises(PipelineError, match="--resume: the images of folder:.* changed"):
        pretrain.run(config_for_run(None, {"max_steps": 2}, out, True), out, resume=True, say=lambda *_: None)
    assert (out / rundir.LAST_CHECKPOINT).read_bytes() == before


def _run_from_before_the_options(out, method, **trained):
    """A one-step run with the papers' 8 % crops (and `trained`), its config.yaml then written as before
    --proj-last-bn, --pred-lr and --crop-min-scale existed: none of the three keys."""
    pretrain_tiny(out, method=method, crop_min_scale=0.08, max_steps=1, **trained)
    saved = yaml.safe_load((out / rundir.CONFIG).read_text())
    for key in ("proj_last_bn", "pred_lr", "crop_min_scale"):
        saved.pop(key, None)
    (out / rundir.CONFIG).write_text(yaml.safe_dump(saved))


def test_a_byol_run_from_before_its_new_options_resumes_as_it_trained(tmp_path):
    """A BYOL config.yaml written before --proj-last-bn, --pred-lr and --crop-min-scale existed has none of them:
    resumed, it keeps the plain projector, the one rate and the papers' 8 % crops it trained with (not what its
    recipe says now), and changing the projector or the rate is refused; a crop flag still wins."""
    out = tmp_path / "run"
    _run_from_before_the_options(out, "byol", proj_last_bn="off", pred_lr=1.0)
    for key, new in (("proj_last_bn", "on"), ("pred_lr", 10.0)):  # refused against what the old run meant
        with pytest.raises(PipelineError, match=f"--resume: `{key}` is {METHODS['byol'].before_option[key]!r}"):
            config_for_run(None, {key: new}, out, resume=True)
    assert config_for_run(None, {"crop_min_scale": 0.5}, out, resume=True).crop_min_scale == 0.5
    other = tmp_path / "other.yaml"  # a --config file's values count as flags do, not as the old run's
    other.write_text(yaml.safe_dump({**yaml.safe_load((out / rundir.CONFIG).read_text()), "crop_min_scale": 0.5,
                                     "pred_lr": 10.0}))
    with pytest.raises(PipelineError, match="--resume: `pred_lr` is 1.0"):
        config_for_run(other, {}, out, resume=True)
    other.write_text(other.read_text().replace("pred_lr: 10.0", "pred_lr: 1.0"))
    assert config_for_run(other, {}, out, resume=True).crop_min_scale == 0.5
    cfg = config_for_run(None, {"max_steps": 2}, out, resume=True)
    assert (cfg.proj_last_bn, cfg.pred_lr, cfg.crop_min_scale) == ("off", 1.0, 0.08)
    assert pretrain.run(cfg, out, resume=True, say=lambda *_: None)["step"] == 2


def test_a_byol_run_that_recorded_its_options_resumes_with_them(tmp_path):
    """A run of today's recipe (projector BN on, predictor at 10x) resumes with what it recorded, not the values a
    run from before the options meant."""
    out = tmp_path / "run"
    pretrain_tiny(out, method="byol", max_steps=1)
    cfg = config_for_run(None, {"max_steps": 2}, out, resume=True)
    assert (cfg.proj_last_bn, cfg.pred_lr, cfg.crop_min_scale) == ("on", 10.0, 0.25)
    assert pretrain.run(cfg, out, resume=True, say=lambda *_: None)["step"] == 2


@pytest.mark.parametrize("method, meant", [("mocov3", {"pred_lr": 1.0, "crop_min_scale": 0.08, "proj_last_bn": None}),
                                           ("simclr", {"pred_lr": None, "crop_min_scale": 0.08, "proj_last_bn": None})])
def test_other_methods_from_before_the_options_resume_as_they_trained(tmp_path, method, meant):
    """MoCo v3 had one rate and, as every method, the papers' 8 % crops before the options; SimCLR has no predictor
    and no projector option, so nothing is filled in for it but the crops."""
    out = tmp_path / "run"
    _run_from_before_the_options(out, method)
    cfg = config_for_run(None, {"max_steps": 2}, out, resume=True)
    assert {key: getattr(cfg, key) for key in meant} == meant
