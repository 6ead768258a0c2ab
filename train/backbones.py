"""The backbones: torchvision networks, randomly initialised (weights=None, never a download), each returning
pooled features (its classifier replaced by Identity), with a rule for small images.

One row per backbone in BACKBONES holds everything the pipeline knows about it: its builder, feature dimension,
family, title, what the small stem changes, the smallest image side with either stem, and the ops its ML Program
holds (the reference evaluator must run them: tests/train/test_backbone_table.py). The table is torch-free (a
builder imports torchvision when it runs), so the CLI's --backbone choices come from it before torch loads. `backbone_args` turns a run's
choice (small stem or not, image size) into the builder's arguments; encoder.pt stores exactly those, so strip,
trace and export rebuild the network that trained even if a rule here changes later.

Small images (the small stem, on by default at <= 64 px), per family:
- ResNet: the CIFAR stem (SimCLR App. B.9): 3x3 stride-1 conv, no max-pool; total stride 32 -> 8.
- MobileNetV3, EfficientNet: the first 3x3 conv at stride 1 instead of 2 (the usual CIFAR change of the mobile
  nets); total stride 32 -> 16, so 32 px ends at 2x2.
- ConvNeXt: the 4x4 stride-4 patchify stem becomes 2x2 stride 2. Still a non-overlapping patchify conv, as the
  architecture wants, and total stride 32 -> 16 as for the mobile nets. A 1x1 stride-1 stem was the other choice: it
  only recolours pixels (no spatial mixing in the stem) and runs stage 1 at the full 32x32, four times the
  compute of 16x16, where stage 1's 7x7 depthwise convs and 4x MLPs spend most of the network's MACs.
- ViT: patch 4 instead of 16 (32 px -> 8x8 = 64 tokens, as the CIFAR ViTs use); the image side must be a
  multiple of the patch, and the position embedding is made for that one side.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

from core.errors import PipelineError

SMALL_STEM_MAX_SIZE = 64  # at or below this, the ImageNet stem (stride 4 before the first stage) throws away most pixels
MAX_IMAGE_SIZE = 1024  # any larger side is a mistake here, not a photo: refused by name
VIT_PATCH = 16  # the patch of every torchvision ViT named *_16
VIT_SMALL_PATCH = 4
BN_MOMENTUM = 0.1  # every BatchNorm's running-statistics momentum (PyTorch's default), whatever torchvision chose


def _resnet(name: str, small_stem: bool) -> nn.Module:
    from torch import nn
    import torchvision

    net = getattr(torchvision.models, name)(weights=None)
    if small_stem:
        net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
        net.maxpool = nn.Identity()
    net.fc = nn.Identity()
    return net


def _mobile(name: str, small_stem: bool) -> nn.Module:
    """MobileNetV3 and EfficientNet: features -> avgpool -> classifier. The classifier goes whole (MobileNetV3's
    first Linear + Hardswish is a head, not part of the feature extractor), so the features are the pooled last
    stage: 576 (V3-Small), 960 (V3-Large), 1280 (EfficientNet-B0)."""
    from torch import nn
    import torchvision

    net = getattr(torchvision.models, name)(weights=None)
    if small_stem:
        net.features[0][0].stride = (1, 1)  # same weights and init; only the first downsampling goes
    net.classifier = nn.Identity()
    return net


def _convnext(name: str, small_stem: bool) -> nn.Module:
    """The classifier is LayerNorm2d, Flatten, Linear: only the Linear goes, the pooled features stay normalised
    (as timm's pre-logits)."""
    from torch import nn
    import torchvision

    net = getattr(torchvision.models, name)(weights=None)
    if small_stem:
        old = net.features[0][0]
        stem = nn.Conv2d(3, old.out_channels, kernel_size=2, stride=2)
        nn.init.trunc_normal_(stem.weight, std=0.02)  # torchvision's ConvNeXt init for every conv
        nn.init.zeros_(stem.bias)
        net.features[0][0] = stem
    net.classifier[2] = nn.Identity()
    return net


def _vit(hidden_dim: int, heads: int, depth: int, mlp_dim: int, image_size: int, patch_size: int) -> nn.Module:
    """torchvision's VisionTransformer at these sizes; features = the final LayerNorm's class token. Attention is
    nn.MultiheadAttention called with need_weights=False, which trains through F.scaled_dot_product_attention (its
    non-fast path; the fast path is inference only), so CUDA picks a fused kernel (tests/train/test_backbones.py)."""
    from torch import nn
    import torchvision

    net = torchvision.models.VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=depth,
                                               num_heads=heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim)
    net.heads = nn.Identity()
    return net


# The MIL ops each family's ML Program holds (listed from converted programs of both stems, fp16 and fp32);
# hard-swish lowers to sigmoid_hard and thresholded_relu, SiLU's squeeze-excite gate to sigmoid
RESNET_OPS = ("conv", "batch_norm", "relu", "max_pool", "add", "reduce_mean", "reshape")
MOBILENET_OPS = ("conv", "batch_norm", "relu", "sigmoid_hard", "thresholded_relu", "mul", "add", "reduce_mean", "reshape")
EFFICIENTNET_OPS = ("conv", "batch_norm", "silu", "sigmoid", "mul", "add", "reduce_mean", "reshape")
CONVNEXT_OPS = ("conv", "layer_norm", "linear", "gelu", "transpose", "mul", "add", "reduce_mean", "reshape")
VIT_OPS = ("conv", "reshape", "transpose", "concat", "expand_dims", "slice_by_index", "squeeze", "layer_norm", "linear",
           "matmul", "softmax", "gelu", "mul", "add")


@dataclass(frozen=True)
class Backbone:
    build: Callable[..., nn.Module]  # (**backbone_args) -> the network, classifier removed
    feat_dim: int  # width of the pooled features
    family: str  # resnet | mobilenet | efficientnet | convnext | vit: the rules below and the recipes read it
    title: str  # as its paper writes it (model metadata)
    small_rule: str  # what the small stem changes, one line
    stride: tuple[int, int]  # total stride with the ImageNet stem, with the small one: the smallest image side
    export_ops: tuple[str, ...]  # MIL op types its ML Program holds besides the encoder's (export/encoder.ENCODER_OPS)
    fp32_stem: bool = False  # fp16 Core ML keeps the input normalisation and first conv in fp32: fp16 there breaks parity
    # Steps of one run from which torch.compile inside the CUDA graphs, measured faster end to end, has repaid its
    # compiling on a cold cache (docs/benchmarks.md); None = not measured faster. A shorter run stays eager.
    compile_repays: int | None = None
    # The methods whose 100-epoch runs, compiled beside eager, reached eager's kNN (docs/benchmarks.md): the default
    # compiles only these: running faster is the backbone's fact, training to the same features is each method's.
    compile_methods: tuple[str, ...] = ()


# ResNet-18's compiled grid (3 seeds, SimCLR, BYOL and MoCo v3) matched eager's kNN (a method added later is not among
# them until measured); ResNet-50 matched too, each method over 3 pairs (MoCo v3 -0.1 +- 1.6 points).
# On the mobile nets SimCLR matched (9 pairs, -0.0 +- 0.8 points) and MoCo v3 did not show it (9 pairs, -2.9 +- 5.8);
# BYOL matched on both MobileNets (6 pairs, +0.5 +- 1.4) and not on EfficientNet-B0 (3 pairs, -5.7 +- 6.2, where its
# eager BYOL swings between seeds too; with its momentum copy compiled as well, below eager on digits-sizes and photos).
_RESNET18_GRID = ("simclr", "byol", "mocov3")
_MOBILENET_GRID = ("simclr", "byol")


BACKBONES: dict[str, Backbone] = {
    "resnet18": Backbone(partial(_resnet, "resnet18"), 512, "resnet", "ResNet-18",
                         "3x3 stride-1 stem, no max-pool", (32, 8), RESNET_OPS,
                         # 32 px: +33 %, 4.1 ms a step for 16-20 s more start-up
                         compile_repays=5_000, compile_methods=_RESNET18_GRID),
    "resnet34": Backbone(partial(_resnet, "resnet34"), 512, "resnet", "ResNet-34",
                         "3x3 stride-1 stem, no max-pool", (32, 8), RESNET_OPS),
    "resnet50": Backbone(partial(_resnet, "resnet50"), 2048, "resnet", "ResNet-50",
                         "3x3 stride-1 stem, no max-pool", (32, 8), RESNET_OPS,
                         # 224 px: +44 %, 31 ms a step for 30 s more start-up
                         compile_repays=1_000, compile_methods=_RESNET18_GRID),
    "mobilenet_v3_small": Backbone(partial(_mobile, "mobilenet_v3_small"), 576, "mobilenet",
                                   "MobileNetV3-Small", "first conv at stride 1", (32, 16), MOBILENET_OPS,
                                   # 32 px: +28 %, 1.5 ms a step for 22 s more start-up (224 px: 6 ms, 34 s)
                                   compile_repays=15_000, compile_methods=_MOBILENET_GRID),
    "mobilenet_v3_large": Backbone(partial(_mobile, "mobilenet_v3_large"), 960, "mobilenet",
                                   "MobileNetV3-Large", "first conv at stride 1", (32, 16), MOBILENET_OPS,
                                   # 32 px: +32 %, 3.4 ms a step for 35 s more start-up
                                   compile_repays=11_000, compile_methods=_MOBILENET_GRID),
    "efficientnet_b0": Backbone(partial(_mobile, "efficientnet_b0"), 1280, "efficientnet",
                                "EfficientNet-B0", "first conv at stride 1", (32, 16), EFFICIENTNET_OPS,
                                fp32_stem=True,  # half its fp16 error is the rounding of its normalised input
                                # 32 px: +32 %, 5.5 ms a step for 42 s more start-up
                                compile_repays=8_000, compile_methods=("simclr",)),
    "convnext_tiny": Backbone(partial(_convnext, "convnext_tiny"), 768, "convnext", "ConvNeXt-T",
                              "2x2 stride-2 patchify stem instead of 4x4 stride 4", (32, 16), CONVNEXT_OPS),
    # ViT-B/16 as torchvision's vit_b_16; ViT-S and ViT-Ti at DeiT's sizes (Touvron et al. 2021, Table 1)
    "vit_b_16": Backbone(partial(_vit, 768, 12, 12, 3072), 768, "vit", "ViT-B/16",
                         f"patch {VIT_SMALL_PATCH} instead of {VIT_PATCH}", (VIT_PATCH, VIT_SMALL_PATCH), VIT_OPS),
    "vit_s_16": Backbone(partial(_vit, 384, 6, 12, 1536), 384, "vit", "ViT-S/16",
                         f"patch {VIT_SMALL_PATCH} instead of {VIT_PATCH}", (VIT_PATCH, VIT_SMALL_PATCH), VIT_OPS),
    "vit_t_16": Backbone(partial(_vit, 192, 3, 12, 768), 192, "vit", "ViT-Ti/16",
                         f"patch {VIT_SMALL_PATCH} instead of {VIT_PATCH}", (VIT_PATCH, VIT_SMALL_PATCH), VIT_OPS),
}


def row(name: str) -> Backbone:
    if name not in BACKBONES:
        raise PipelineError(f"unknown backbone {name!r}: use {', '.join(BACKBONES)}")
    return BACKBONES[name]


def uses_small_stem(small_stem: str, image_size: int) -> bool:
    if small_stem == "auto":
        return image_size <= SMALL_STEM_MAX_SIZE
    return small_stem == "on"


def min_image_size(name: str, small: bool) -> int:
    """Smallest side that still leaves the last stage at least 1x1 (one token for a ViT): the total stride."""
    return row(name).stride[int(small)]


def check_image_size(name: str, small: bool, image_size: int) -> None:
    """One line for an image side this backbone cannot take: below its total stride, or not a whole number of
    ViT patches."""
    lo, stem = min_image_size(name, small), "small" if small else "ImageNet"
    if not lo <= image_size <= MAX_IMAGE_SIZE:
        raise PipelineError(f"image size {image_size} is impossible for {name} with the {stem} stem: use {lo}..{MAX_IMAGE_SIZE}")
    if row(name).family == "vit" and image_size % lo:
        raise PipelineError(f"image size {image_size} is not a multiple of {name}'s patch {lo} ({stem} stem): use "
                            f"{image_size // lo * lo or lo} or {(image_size // lo + 1) * lo}")


def check_run_side(name: str, small_stem: str, image_size: int) -> None:
    """check_image_size for a run's options as asked: --small-stem (auto|on|off) resolved against the side first.
    Torch-free, so the CLI and the job service refuse a side before torch loads, as pretraining's validate does."""
    check_image_size(name, uses_small_stem(small_stem, image_size), image_size)


def backbone_args(name: str, small_stem: bool, image_size: int | None = None) -> dict:
    """The builder's arguments for a run's stem choice and image side (what encoder.pt records). A ViT's patch and
    position embedding depend on the side, so it needs one; the convnets pool globally and take any side."""
    if row(name).family != "vit":
        return {"small_stem": bool(small_stem)}
    if image_size is None:
        raise PipelineError(f"{name} is built for one image size: give it")
    return {"image_size": int(image_size), "patch_size": min_image_size(name, small_stem)}


def build_from_args(name: str, args: dict) -> tuple[nn.Module, int]:
    """(backbone, feature dim) from recorded builder arguments. weights=None: random init, never a download."""
    spec = row(name)
    try:
        net = spec.build(**args)
    except TypeError:
        raise PipelineError(f"builder arguments {args} do not fit {name}: the file was written for another backbone") from None
    _set_batch_norm_momentum(net)
    return net, spec.feat_dim


def _set_batch_norm_momentum(net: nn.Module) -> None:
    """Every BatchNorm of every backbone at BN_MOMENTUM. torchvision builds MobileNetV3's with 0.01, an
    ImageNet-length run's: after the few hundred steps of a run here the running statistics still hold
    0.99**steps of their init (0, 1), and in eval mode every image's features then share one direction
    (docs/recipes.md); 0.1 forgets the init within ~40 steps. Set here, for whatever a row's builder made."""
    from torch import nn

    for m in net.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = BN_MOMENTUM


def build_backbone(name: str, small_stem: bool, image_size: int | None = None) -> tuple[nn.Module, int]:
    """(backbone, feature dim) for a run's stem choice and image side."""
    return build_from_args(name, backbone_args(name, small_stem, image_size))


def freeze_patch_projection(backbone: nn.Module) -> list[str]:
    """MoCo v3's trick for ViTs (Chen, Xie, He 2021, Sec. 4, "a trick for improving stability"): the patch embedding keeps
    its random init and never trains, which removed the training instability it studies. The names frozen."""
    import torchvision

    if not isinstance(backbone, torchvision.models.VisionTransformer):
        return []
    for p in backbone.conv_proj.parameters():
        p.requires_grad_(False)
    return [f"conv_proj.{n}" for n, _ in backbone.conv_proj.named_parameters()]
