"""The backbone table against the networks it builds: pooled features of the stated width, every parameter used by
the forward (CUDA-graph capture needs a gradient for each), the small stem's rule and each row's smallest image side,
one-line refusals of impossible sides, ViT attention through scaled_dot_product_attention while training, and the
builder arguments that encoder.pt records."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
import torchvision

from core.errors import PipelineError
from train import backbones
from train.backbones import BACKBONES, backbone_args, build_backbone, build_from_args, check_image_size, min_image_size
from tests.cli_helpers import assert_one_line_error, cli

NEW = ("mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "convnext_tiny", "vit_b_16", "vit_s_16", "vit_t_16")
ONE_PER_FAMILY = ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "vit_t_16")


def test_the_new_backbones_are_in_the_table_with_their_facts():
    assert set(NEW) <= set(BACKBONES)
    assert {name: (BACKBONES[name].family, BACKBONES[name].feat_dim) for name in NEW} == {
        "mobilenet_v3_small": ("mobilenet", 576), "mobilenet_v3_large": ("mobilenet", 960),
        "efficientnet_b0": ("efficientnet", 1280), "convnext_tiny": ("convnext", 768),
        "vit_b_16": ("vit", 768), "vit_s_16": ("vit", 384), "vit_t_16": ("vit", 192)}


@pytest.mark.parametrize("name", list(BACKBONES))
def test_pooled_features_and_a_gradient_for_every_parameter(name):
    """16 px with the small stem: the cheapest side every backbone takes. A parameter the forward never uses (a
    classifier left in place, an unused token) has no gradient after backward and breaks the CUDA-graph capture."""
    torch.manual_seed(0)
    net, dim = build_backbone(name, True, 16)
    assert dim == BACKBONES[name].feat_dim
    out = net.train()(torch.randn(2, 3, 16, 16))
    assert tuple(out.shape) == (2, dim)
    out.square().sum().backward()
    unused = [n for n, p in net.named_parameters() if p.grad is None]
    assert not unused, f"{name}: parameters the forward never uses: {unused[:5]}"
    assert not any(isinstance(m, torch.nn.Linear) and m.out_features == 1000 for m in net.modules()), "classifier left"


def _last_map(net: torch.nn.Module, x: torch.Tensor) -> tuple[int, ...]:
    """Spatial size of the last stage's output (a ViT: its patch grid)."""
    if isinstance(net, torchvision.models.VisionTransformer):
        with torch.no_grad():
            net.eval()(x)  # asserts the side it was built for
        n = round((net.seq_length - 1) ** 0.5)  # patches, without the class token
        return (n, n)
    seen = {}
    last = net.layer4 if isinstance(net, torchvision.models.ResNet) else net.features
    handle = last.register_forward_hook(lambda m, i, o: seen.update(shape=tuple(o.shape[-2:])))
    with torch.no_grad():
        net.eval()(x)
    handle.remove()
    return seen["shape"]


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
@pytest.mark.parametrize("small", [True, False])
def test_the_smallest_side_leaves_a_1x1_last_stage(name, small):
    """Each row's stride: at the smallest side the last stage is 1x1 (one patch), at twice that 2x2, so the table
    states what the network does, with either stem."""
    lo = min_image_size(name, small)
    net, _ = build_backbone(name, small, lo)
    assert _last_map(net, torch.randn(1, 3, lo, lo)) == (1, 1)
    if BACKBONES[name].family != "vit":  # a ViT is built for one side
        assert _last_map(net, torch.randn(1, 3, 2 * lo, 2 * lo)) == (2, 2)


def test_what_the_small_stem_changes():
    mobile, _ = build_backbone("mobilenet_v3_small", True)
    assert mobile.features[0][0].stride == (1, 1) and build_backbone("mobilenet_v3_small", False)[0].features[0][0].stride == (2, 2)
    eff, _ = build_backbone("efficientnet_b0", True)
    assert eff.features[0][0].stride == (1, 1)
    stem = build_backbone("convnext_tiny", True)[0].features[0][0]
    assert (stem.kernel_size, stem.stride) == ((2, 2), (2, 2))
    assert build_backbone("convnext_tiny", False)[0].features[0][0].stride == (4, 4)
    vit, _ = build_backbone("vit_t_16", True, 32)
    assert vit.patch_size == 4 and vit.seq_length == 8 * 8 + 1
    assert build_backbone("vit_t_16", False, 224)[0].patch_size == 16


@pytest.mark.parametrize("name,small,size,needle", [
    ("vit_t_16", True, 30, "image size 30 is not a multiple of vit_t_16's patch 4 (small stem): use 28 or 32"),
    ("vit_b_16", False, 100, "image size 100 is not a multiple of vit_b_16's patch 16 (ImageNet stem): use 96 or 112"),
    ("vit_s_16", True, 2, "image size 2 is impossible for vit_s_16 with the small stem: use 4..1024"),
    ("mobilenet_v3_small", True, 12, "image size 12 is impossible for mobilenet_v3_small with the small stem: use 16..1024"),
    ("convnext_tiny", False, 24, "image size 24 is impossible for convnext_tiny with the ImageNet stem: use 32..1024"),
])
def test_impossible_sides_are_refused(name, small, size, needle):
    with pytest.raises(PipelineError) as err:
        check_image_size(name, small, size)
    assert str(err.value) == needle


def test_the_cli_refuses_a_side_that_is_no_whole_number_of_patches(tmp_path):
    res = cli("pretrain", "--backbone", "vit_t_16", "--image-size", "30", "--data", "synthetic:48", "--out",
              tmp_path / "run", "--device", "cpu")
    assert_one_line_error(res, "not a multiple of vit_t_16's patch 4")
    assert not (tmp_path / "run").exists()


def test_builder_arguments():
    assert backbone_args("resnet18", True, 32) == {"small_stem": True}
    assert backbone_args("convnext_tiny", False, 224) == {"small_stem": False}
    assert backbone_args("vit_s_16", True, 32) == {"image_size": 32, "patch_size": 4}
    assert backbone_args("vit_s_16", False, 224) == {"image_size": 224, "patch_size": 16}
    with pytest.raises(PipelineError, match="vit_t_16 is built for one image size"):
        backbone_args("vit_t_16", True)
    with pytest.raises(PipelineError, match=r"builder arguments \{'small_stem': True\} do not fit vit_t_16"):
        build_from_args("vit_t_16", {"small_stem": True})
    with pytest.raises(PipelineError, match="unknown backbone 'vit_h_14'"):
        build_backbone("vit_h_14", True, 32)


def test_vit_training_attends_through_scaled_dot_product_attention(monkeypatch):
    """torchvision's EncoderBlock calls nn.MultiheadAttention with need_weights=False: out of the inference fast
    path (training, gradients on) that runs F.scaled_dot_product_attention, where CUDA picks a fused kernel."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    net, _ = build_backbone("vit_t_16", True, 16)
    net.train()(torch.randn(2, 3, 16, 16)).sum().backward()
    assert len(calls) == 12 and calls[0] == (2, 3, 17, 64)  # one per block: batch, heads, 16 patches + class token, dim


def test_moco_v3_freezes_a_vit_patch_projection_only():
    vit, _ = build_backbone("vit_t_16", True, 16)
    assert backbones.freeze_patch_projection(vit) == ["conv_proj.weight", "conv_proj.bias"]
    assert [n for n, p in vit.named_parameters() if not p.requires_grad] == ["conv_proj.weight", "conv_proj.bias"]
    resnet, _ = build_backbone("resnet18", True)
    assert backbones.freeze_patch_projection(resnet) == [] and all(p.requires_grad for p in resnet.parameters())


def test_encoder_pt_rebuilds_from_its_recorded_arguments_not_todays_rule(tmp_path, monkeypatch):
    """A ViT encoder.pt keeps its builder arguments: changing the table's small-stem rule afterwards (patch 2
    instead of 4) still rebuilds the network that trained, and its weights load."""
    from export.encoder import encoder_from_state

    net, dim = build_backbone("vit_t_16", True, 16)
    state = {"state_dict": net.state_dict(), "backbone": "vit_t_16", "backbone_args": backbone_args("vit_t_16", True, 16),
             "small_stem": True, "feat_dim": dim, "image_size": 16, "mean": [0.5] * 3, "std": [0.25] * 3}
    monkeypatch.setitem(BACKBONES, "vit_t_16", dataclasses.replace(BACKBONES["vit_t_16"], stride=(16, 2)))
    assert backbone_args("vit_t_16", True, 16)["patch_size"] == 2  # today's rule changed
    enc = encoder_from_state(state)
    assert enc.backbone.patch_size == 4
    x = torch.rand(2, 3, 16, 16) * 255
    torch.testing.assert_close(enc(x), F.normalize(net.eval()((x / 255 - 0.5) / 0.25)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0", "resnet18"])
def test_batch_norm_statistics_forget_their_init_within_a_short_run(name):
    """Every BatchNorm at momentum 0.1 (torchvision's MobileNetV3 asks 0.01): 40 train-mode steps on one batch
    leave 0.9 ** 40 = 1.5 % of the initial mean 0 in the first BatchNorm's running mean (at 0.01: 67 %), so a
    run of a few hundred steps evaluates with statistics of its own weights."""
    net, _ = build_backbone(name, False, 64)
    norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert norms and {m.momentum for m in norms} == {backbones.BN_MOMENTUM} == {0.1}
    seen = []
    norms[0].register_forward_hook(lambda m, args, out: seen.append(args[0].mean(dim=(0, 2, 3))))
    batch = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0)) + 3.0
    net.train()
    with torch.no_grad():
        for _ in range(40):
            net(batch)
    torch.testing.assert_close(norms[0].running_mean, (1 - 0.9 ** 40) * seen[0], rtol=1e-4, atol=1e-5)
