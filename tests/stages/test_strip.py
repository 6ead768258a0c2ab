"""Strip: the shipped state is the backbone and nothing else, its features equal the full model's, and a checkpoint
that does not fit its config (other method / backbone, truncated, missing) is a one-line error."""

from pathlib import Path

import pytest
import torch
import yaml

from export.encoder import load_encoder
from core import rundir
from train.backbones import BACKBONES, build_backbone
from train.configs import PretrainConfig
from train.runspec import build_model
from stages.strip import StripConfig, encoder_path, run
from tests.cli_helpers import assert_one_line_error as _one_line_error
from tests.cli_helpers import cli as _cli
from tests.tiny_run import pretrain_tiny

ENCODER_KEYS = {"state_dict", "backbone", "backbone_args", "small_stem", "feat_dim", "image_size", "mean", "std",
                "l2_normalize", "metadata"}
HEAD_PREFIXES = ("projector", "predictor", "target_", "momentum_", "queue")
DROPPED = {"byol": ["predictor", "projector", "target_backbone", "target_projector"],
           "mocov3": ["momentum_backbone", "momentum_projector", "predictor", "projector", "queue"]}


def _pretrained(tmp_path: Path, overrides: dict, name: str = "run") -> Path:
    out = tmp_path / name
    pretrain_tiny(out, **{**overrides, "max_steps": 1})
    return out


def test_the_same_training_gives_the_same_encoder_bytes_wherever_it_runs(tmp_path, monkeypatch):
    """encoder.pt's hash names the model in files made from it (the Swift demo's golden fixtures): two runs of one
    config, in other folders, give the same bytes; other weights give another checkpoint id."""
    shas, ids = [], []
    for where in ("a", "b/deeper"):
        monkeypatch.chdir((tmp_path / where).mkdir(parents=True) or tmp_path / where)
        pretrain_tiny(Path("run"), max_steps=2)
        run(StripConfig(), Path("run").resolve(), say=lambda *_: None)
        shas.append(rundir.file_sha256(encoder_path(Path("run"))))
        ids.append(torch.load(Path("run") / rundir.LAST_CHECKPOINT, weights_only=False)[rundir.CKPT_ID])
    assert shas[0] == shas[1] and ids[0] == ids[1]
    pretrain_tiny(tmp_path / "other", max_steps=2, seed=1)
    assert torch.load(tmp_path / "other" / rundir.LAST_CHECKPOINT, weights_only=False)[rundir.CKPT_ID] != ids[0]


# SimCLR (projector only) is stripped in every export test (tests/stages/test_export.py checks its dropped modules).
@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_strip_keeps_the_backbone_only_with_equal_features(tmp_path, tiny_overrides, method):
    extra = {"queue_size": 8} if method == "mocov3" else {}
    out = _pretrained(tmp_path, {**tiny_overrides, "method": method, **extra})
    run(StripConfig(), out, say=lambda *_: None)

    state = torch.load(encoder_path(out), weights_only=False)
    assert set(state) == ENCODER_KEYS and state["backbone_args"] == {"small_stem": True}
    fresh, dim = build_backbone("resnet18", small_stem=True)
    assert set(state["state_dict"]) == set(fresh.state_dict())  # exactly a backbone's tensors ...
    assert not [k for k in state["state_dict"] if k.startswith(HEAD_PREFIXES)]  # ... so no head, no momentum net
    assert state["feat_dim"] == dim == BACKBONES["resnet18"].feat_dim
    assert state["metadata"]["dropped_modules"] == DROPPED[method]
    assert state["metadata"]["proof"]["equal"] is True

    # Independent of the stage's own proof: the full method model rebuilt from the checkpoint, in this test.
    ckpt = torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)
    full, _ = build_model(PretrainConfig(**ckpt["config"]))
    full.load_state_dict(ckpt["model"])
    full.eval()
    encoder, _ = load_encoder(encoder_path(out))
    x = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(encoder.backbone(x), full.backbone(x))
        emb = encoder(torch.rand(3, 3, 16, 16) * 255)
    assert emb.shape == (3, dim)
    assert torch.allclose(emb.norm(dim=1), torch.ones(3), atol=1e-5)  # L2 on by default


def test_cli_strip_options_and_default_run_message(tmp_path, tiny_overrides, monkeypatch):
    out = _pretrained(tmp_path, tiny_overrides, name="runs/default")
    monkeypatch.chdir(tmp_path)
    res = _cli("strip", "--no-l2-normalize")
    assert res.exit_code == 0, res.output
    assert "using run runs/default" in res.output and "features equal" in res.output
    state = torch.load(encoder_path(out), weights_only=False)
    assert state["l2_normalize"] is False
    assert not list(out.rglob("*.tmp"))


def _edit_config(run_dir: Path, **changes) -> None:
    path = run_dir / rundir.CONFIG
    cfg = yaml.safe_load(path.read_text())
    cfg.update(changes)
    path.write_text(yaml.safe_dump(cfg))


def _edit_checkpoint_config(run_dir: Path, **changes) -> None:
    path = run_dir / rundir.LAST_CHECKPOINT
    ckpt = torch.load(path, weights_only=False)
    ckpt["config"].update(changes)
    torch.save(ckpt, path)


def test_bad_checkpoints_are_one_line_errors(tmp_path, tiny_overrides):
    out = _pretrained(tmp_path, tiny_overrides)
    ckpt = out / rundir.LAST_CHECKPOINT
    good = ckpt.read_bytes()

    # config.yaml says another method than the checkpoint was trained with
    _edit_config(out, method="byol")
    _one_line_error(_cli("strip", "--run", out), "method='simclr'", "another run")
    # both say byol, but the weights are SimCLR's: the strict load refuses them
    _edit_checkpoint_config(out, method="byol")
    _one_line_error(_cli("strip", "--run", out), "does not fit its config", "byol/resnet18", "missing")
    # another backbone
    ckpt.write_bytes(good)
    _edit_config(out, method="simclr", backbone="resnet34")
    _edit_checkpoint_config(out, backbone="resnet34")
    _one_line_error(_cli("strip", "--run", out), "does not fit its config", "simclr/resnet34")

    _edit_config(out, backbone="resnet18")
    ckpt.write_bytes(good[: len(good) // 2])
    _one_line_error(_cli("strip", "--run", out), "truncated")
    ckpt.unlink()
    _one_line_error(_cli("strip", "--run", out), "no checkpoint")
    _one_line_error(_cli("strip", "--run", tmp_path / "nowhere"), "does not exist")
    assert not encoder_path(out).exists()  # no refused strip wrote anything
    assert not list(out.rglob("*.tmp"))
