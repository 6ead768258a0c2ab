"""Every method trains the new backbones on the CPU with the real training step: all three methods on a mobile net
and a ViT, one method on each other backbone. Also what training a ViT brings along: the momentum update of a
network without buffers, MoCo v3's frozen random patch projection (kept still, left out of the optimizer and
recorded in the run), the ViT recipe rule, and the job service offering the backbones."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from core import rundir
from train import recipes, training
from train.backbones import BACKBONES
from train.configs import PretrainConfig
from train.methods import METHODS
from train.heads import ema_update
from train.runspec import resolve

SMALL = dict(image_size=16, batch_size=4)  # 16 px: every backbone's small stem takes it (a ViT: 4x4 patches)
COMBOS = ([(b, m) for b in ("mobilenet_v3_small", "vit_t_16") for m in METHODS]
          + [("mobilenet_v3_large", "mocov3"), ("efficientnet_b0", "simclr"), ("convnext_tiny", "byol"),
             ("vit_s_16", "mocov3"), ("vit_b_16", "simclr")])
ONE_STEP = ("vit_b_16",)  # 86M parameters: one AdamW step over them is most of its time
PATCH = ["conv_proj.bias", "conv_proj.weight"]


def test_ema_update_of_a_network_without_buffers():
    """A ViT or ConvNeXt holds no buffers; torch's _foreach_copy_ refuses the empty list they give."""
    online, target = nn.Linear(3, 2), nn.Linear(3, 2)
    old = target.weight.detach().clone()
    ema_update(target, online, 0.75)
    torch.testing.assert_close(target.weight, 0.75 * old + 0.25 * online.weight.detach())


@pytest.mark.parametrize("backbone,method", COMBOS)
def test_the_training_step_trains_each_backbone(tiny_overrides, backbone, method):
    cfg = resolve(PretrainConfig(**{**tiny_overrides, **SMALL, "method": method, "backbone": backbone}))
    torch.manual_seed(0)
    t, feat_dim = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=2)
    model = t.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    momentum = [n for n in ("target_backbone", "momentum_backbone") if hasattr(model, n)]
    gen = torch.Generator().manual_seed(1)
    for step in range(1 if backbone in ONE_STEP else 2):
        x1, x2 = (torch.rand(cfg.batch_size, 3, 16, 16, generator=gen) for _ in range(2))
        loss = training.train_step(t, [x1, x2], step)
        assert math.isfinite(loss.item())
    no_grad = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not no_grad, f"trainable parameters without a gradient: {no_grad[:5]}"
    moved = [n for n, p in model.backbone.named_parameters() if not torch.equal(p, before[f"backbone.{n}"])]
    assert moved, "the backbone did not train"
    for name in momentum:  # the EMA ran (and a buffer-free backbone did not stop it)
        net = getattr(model, name)
        assert any(not torch.equal(p, before[f"{name}.{n}"]) for n, p in net.named_parameters())
    frozen = [n for n, p in model.backbone.named_parameters() if not p.requires_grad]
    if method == "mocov3" and backbone.startswith("vit"):
        assert sorted(frozen) == PATCH
        trained = {id(p) for g in t.optimizer.param_groups for p in g["params"]}
        for n in PATCH:
            p = model.backbone.get_parameter(n)
            assert torch.equal(p, before[f"backbone.{n}"]) and id(p) not in trained
            assert torch.equal(model.momentum_backbone.get_parameter(n), p)
        assert type(t.optimizer).__name__ == "AdamW" and cfg.temperature == 0.2
    else:
        assert frozen == []


def test_a_vit_run_records_its_recipe_frozen_projection_and_builder_arguments(tmp_path):
    """config.yaml holds the ViT rule's values; the checkpoint and encoder.pt name the frozen patch projection;
    encoder.pt records the builder arguments the exported network is rebuilt from."""
    import yaml

    from export.encoder import load_encoder
    from stages import strip
    from tests.tiny_run import pretrain_tiny

    run = tmp_path / "run"
    pretrain_tiny(run, method="mocov3", backbone="vit_t_16", max_steps=1, warmup_epochs=None, **SMALL)
    cfg = yaml.safe_load((run / rundir.CONFIG).read_text())
    assert {k: cfg[k] for k in ("optimizer", "lr", "weight_decay", "temperature")} == {
        "optimizer": "adamw", "lr": 1.5e-4, "weight_decay": 0.1, "temperature": 0.2}
    assert cfg["warmup_epochs"] == pytest.approx(2 * 40 / 300)  # the paper's 40 of 300 epochs, as a share
    ckpt = rundir.load_checkpoint(run / rundir.LAST_CHECKPOINT)
    assert ckpt[rundir.CKPT_META]["frozen_parameters"] == PATCH
    strip.run(strip.StripConfig(), run, say=lambda *_: None)
    enc, state = load_encoder(run / rundir.EXPORT / "encoder.pt")
    assert state["backbone_args"] == {"image_size": 16, "patch_size": 4}
    assert state["metadata"]["frozen_parameters"] == PATCH
    assert enc.backbone.patch_size == 4 and enc(torch.zeros(1, 3, 16, 16)).shape == (1, 192)


@pytest.mark.parametrize("recipe", ["small", "paper"])
def test_the_vit_rule_in_both_recipes(tiny_overrides, recipe):
    def resolved(**over):
        return resolve(PretrainConfig(**{**tiny_overrides, **SMALL, "recipe": recipe, "warmup_epochs": None, **over}))

    for method in METHODS:
        vit = resolved(method=method, backbone="vit_s_16")
        assert (vit.optimizer, vit.lr, vit.weight_decay) == ("adamw", 1.5e-4, 0.1)
        convnet = resolved(method=method, backbone="mobilenet_v3_small")
        assert (convnet.optimizer, convnet.lr, convnet.weight_decay) == tuple(
            recipes.values(recipe, method)[k] for k in ("optimizer", "lr", "weight_decay"))
        # the temperature: MoCo v3's ViT 0.2, the others keep their own
        assert vit.temperature == (0.2 if method == "mocov3" else convnet.temperature)
    assert resolved(method="byol", backbone="vit_t_16", optimizer="sgd", lr=0.1).optimizer == "sgd"  # a flag wins
    assert "MoCo v3's ViT settings" in recipes.source(recipe, "simclr", "vit_t_16")
    assert "ViT" not in recipes.source(recipe, "simclr", "resnet18")


def test_warmup_rule_by_family():
    assert recipes.warmup_epochs(1000, "vit_b_16") == 40 and recipes.warmup_epochs(30, "vit_b_16") == pytest.approx(4)
    assert recipes.warmup_epochs(1000, "convnext_tiny") == 10 and recipes.warmup_epochs(30) == pytest.approx(3)


def test_the_job_service_takes_every_backbone(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from pipeline.serve.app import create_app
    from pipeline.serve.options import describe

    described = describe()
    field = next(f for f in described["fields"] if f["name"] == "backbone")
    assert tuple(field["choices"]) == tuple(BACKBONES)
    with TestClient(create_app(tmp_path / "root", described, run_jobs=False, allow_data=("synthetic:48",))) as c:
        c.headers["Authorization"] = "Bearer " + (tmp_path / "root" / "token").read_text().strip()
        for name in ("mobilenet_v3_small", "vit_t_16"):
            r = c.post("/jobs", data={"data": "synthetic:48", "backbone": name, "image-size": "32",
                                          "batch-size": "8"})
            assert r.status_code == 201, r.text
            assert r.json()["options"]["backbone"] == name
