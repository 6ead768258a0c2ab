"""Pretraining options outside their sensible range are refused with one line naming the option, from a YAML file
or a flag, before anything is written (`lr: -3` used to train, ascending the loss)."""

import pytest

from core.errors import PipelineError
from train.runspec import config_for_run
from tests.cli_helpers import assert_one_line_error, cli


@pytest.mark.parametrize("text,needle", [
    ("lr: -3\n", "`lr` must be > 0 and <= 100, got -3.0"),
    ("lr: 0\n", "`lr` must be > 0"),
    ("batch_size: 1\n", "`batch_size` must be >= 2 and <= 65536, got 1"),
    ("temperature: 0\n", "`temperature` must be > 0"),
    ("weight_decay: -1e-6\n", "`weight_decay` must be >= 0"),
    ("momentum_base: 1.5\n", "`momentum_base` must be >= 0 and <= 1"),
    ("momentum_base: -0.1\n", "`momentum_base` must be >= 0 and <= 1"),
    ("warmup_epochs: -1\n", "`warmup_epochs` must be >= 0"),
    ("proj_dim: 0\n", "`proj_dim` must be >= 1"),
    ("queue_size: -4\nmethod: mocov3\n", "`queue_size` must be >= 0"),
    ("log_every: 0\n", "`log_every` must be >= 1"),
    ("num_workers: -2\n", "`num_workers` must be >= -1"),
    ("epochs: 0\n", "`epochs` must be >= 1 and <= 100000, got 0"),
    ("num_workers: 100000\n", "`num_workers` must be >= -1 and <= 64, got 100000"),
    ("val_fraction: 1.5\n", "`val_fraction` must be >= 0 and < 1, got 1.5"),
    ("lr: .nan\n", "`lr` must be a finite number, got nan"),
    ("temperature: .inf\n", "`temperature` must be a finite number, got inf"),
    ("seed: -1\n", "`seed` must be >= 0"),
    ("image_size: 1025\n", "`image_size` must be >= 1 and <= 1024, got 1025"),
])
def test_out_of_range_values_are_one_line_errors(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(PipelineError, match=needle.replace("(", r"\(")):
        config_for_run(f, {}, tmp_path / "run", resume=False)
    res = cli("pretrain", "--config", f, "--out", tmp_path / "run", "--device", "cpu")
    assert_one_line_error(res, needle)
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("over", [{"lr": 1e-9}, {"momentum_base": 1.0}, {"momentum_base": 0.0}, {"weight_decay": 0.0},
                                  {"warmup_epochs": 0.0}, {"queue_size": 0, "method": "mocov3"}, {"num_workers": -1}])
def test_values_on_the_bounds_are_accepted(tmp_path, over):
    cfg = config_for_run(None, over, tmp_path / "run", resume=False)
    for key, value in over.items():
        assert getattr(cfg, key) == value


@pytest.mark.parametrize("over,message", [
        ({"image_size": 16, "small_stem": "off"}, "image size 16 is impossible for resnet18 with the ImageNet stem: use 32..1024"),
    ({"image_size": 7, "small_stem": "on"}, "image size 7 is impossible for resnet18 with the small stem: use 8..1024"),
    ({"store_size": 48, "image_size": 64}, "store_size 48 is smaller than image_size 64"),
    ({"lars_eta": 0.0}, "--lars-eta: `lars_eta` must be > 0 and <= 1, got 0.0"),
    ({"checkpoint_every_s": -0.5}, "--checkpoint-every-s: `checkpoint_every_s` must be >= 0 and <= 10000000, got -0.5"),
])
def test_values_past_the_other_limits_name_the_limit(tmp_path, over, message):
    with pytest.raises(PipelineError) as e:
        config_for_run(None, {"backbone": "resnet18", **over}, tmp_path / "run", resume=False)
    assert str(e.value) == message


@pytest.mark.parametrize("over", [{"image_size": 1024}, {"image_size": 8, "small_stem": "on"}, {"batch_size": 2},
                                  {"epochs": 1}, {"store_size": 64, "image_size": 64}, {"lars_eta": 1e-9},
                                  {"checkpoint_every_s": 0.0}, {"checkpoint_every_s": 0.5}])
def test_values_on_the_other_limits_are_accepted(tmp_path, over):
    cfg = config_for_run(None, over, tmp_path / "run", resume=False)
    for key, value in over.items():
        assert getattr(cfg, key) == value


def test_queue_size_is_refused_for_other_methods_and_resume_without_a_checkpoint(tmp_path):
    with pytest.raises(PipelineError) as e:
        config_for_run(None, {"method": "byol", "queue_size": 8}, tmp_path / "run", resume=False)
    assert str(e.value) == "queue_size is a MoCo v3 option; method is byol"
    with pytest.raises(PipelineError) as e:
        config_for_run(None, {}, tmp_path / "run", resume=True)
    assert str(e.value) == f"--resume: no checkpoint at {tmp_path / 'run' / 'checkpoints' / 'last.pt'}"
