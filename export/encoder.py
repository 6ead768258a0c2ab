"""The shippable encoder: RGB image in 0..255 -> normalisation inside the model -> backbone -> optional L2.

This is the module every export format is made from and the fp32 reference every artifact is compared with.
`RUN/export/encoder.pt` (written by the strip stage) holds its state and metadata; `load_encoder` rebuilds it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from core.errors import PipelineError
from train.backbones import build_from_args

INPUT_NAME = "image"  # every artifact's input: float/uint8 RGB image, 0..255, N x 3 x S x S
OUTPUT_NAME = "embedding"  # every artifact's output: float32, N x D
# The ML Program ops of the encoder around its backbone: the normalisation (the converter folds it into a
# batch_norm), the fp16-safe L2 (max-abs scaling, then the norm) and the fp16 program's casts; a backbone's own are
# its row's export_ops (train/backbones.py). No const: a const is a value the evaluator reads, not an op it runs.
ENCODER_OPS = ("cast", "batch_norm", "abs", "reduce_max", "maximum", "real_div", "mul", "add", "reduce_sum", "rsqrt")


class Encoder(nn.Module):
    def __init__(self, backbone: nn.Module, mean, std, l2_normalize: bool = True):
        super().__init__()
        self.backbone = backbone
        # Normalisation folded in: an app hands the model raw pixels, so no preprocessing can be forgotten.
        self.register_buffer("scale", 1.0 / (255.0 * torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)))
        self.register_buffer("shift", -torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) / torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1))
        self.l2_normalize = l2_normalize

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = image.float() * self.scale + self.shift
        f = self.backbone(x)
        if self.l2_normalize:
            # Explicit sum-of-squares + rsqrt (not F.normalize) so converters see plain ops; eps keeps 0 finite.
            # Divided by the largest |feature| first: the same unit vector, but the sum of squares stays <= D
            # whatever the features' scale. A NeuralNetwork on an iPad's GPU or Neural Engine sums in fp16, which
            # overflows (65504) once the feature norm passes ~256, and the embedding came out all zeros (seen with
            # MobileNetV3, whose unbounded hardswish features reached norms above 1000). The floor is fp16's
            # smallest normal number, so the division stays finite for all-zero features in fp16 too.
            f = f / f.abs().amax(dim=1, keepdim=True).clamp_min(2.0 ** -14)
            f = f * torch.rsqrt((f * f).sum(dim=1, keepdim=True) + 1e-12)
        return f


def recorded_backbone_args(state: dict) -> dict:
    """The builder arguments encoder.pt records; a file from before they were recorded holds a ResNet, whose one
    argument was its small_stem."""
    return state.get("backbone_args") or {"small_stem": bool(state["small_stem"])}


def encoder_from_state(state: dict, l2_normalize: bool | None = None) -> Encoder:
    backbone, _ = build_from_args(state["backbone"], recorded_backbone_args(state))
    backbone.load_state_dict(state["state_dict"])
    enc = Encoder(backbone, state["mean"], state["std"], state.get("l2_normalize", True) if l2_normalize is None else l2_normalize)
    return enc.eval()


def load_encoder(path: Path | str, l2_normalize: bool | None = None) -> tuple[Encoder, dict]:
    """(Encoder in eval mode, fp32, on CPU; the stored state dict with metadata). One-line errors for bad files."""
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"no stripped encoder at {path}: run `pipeline strip` first")
    try:
        # tensors and plain values only: an encoder.pt is a file users pass around, and unpickling arbitrary
        # objects from one could run code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise PipelineError(f"{path} holds Python objects other than tensors and plain values; refused, since "
                            "loading them could run code: re-run `pipeline strip`") from None
    except Exception as e:
        raise PipelineError(f"{path} is unreadable or truncated ({type(e).__name__}): re-run `pipeline strip`") from None
    if not isinstance(state, dict) or "state_dict" not in state or "backbone" not in state:
        raise PipelineError(f"{path} is not an encoder written by `pipeline strip`")
    return encoder_from_state(state, l2_normalize), state
