"""The options of the stages that ship an encoder (strip, trace, export, validate): one dataclass per stage, each
field with its default and the one-line reason for it. Torch-free, as train/configs.py, for the CLI's flags; beside
the format table whose names `--to` and `--coreml-format` choose from."""

from __future__ import annotations

from dataclasses import dataclass

from core.config import opt
from export import compression, formats
from export.targets import ML_PROGRAM_REACH, ML_PROGRAM_TARGET, ML_PROGRAM_TARGETS, NEURALNETWORK_TARGET, ipados


@dataclass
class StripConfig:
    l2_normalize: bool = opt(True, "unit-length embeddings: the app's cosine similarity becomes a plain dot product")
    proof_batch: int = opt(4, "random images on which stripped and full-model backbone features must be equal")
    seed: int = opt(0, "seeds the proof's random images, so the recorded proof is reproducible")



@dataclass
class TraceConfig:
    method: str = opt("auto", "auto = torch.export, falling back to torch.jit.trace where it fails; or force one",
                      choices=("auto", "export", "jit"))
    example_batch: int = opt(2, "batch of the example input; >= 2 so the batch stays dynamic (1 gets specialised)")
    tolerance: float = opt(1e-5, "largest |traced - eager| on the example input before a trace is refused")
    seed: int = opt(0, "seeds the example images (pixels 0..255)")



@dataclass
class ExportConfig:
    to: str = opt("all", "which formats: a group of the format table (below), or all", choices=formats.to_choices())
    precision: str | None = opt(None, "None = each format's default: fp16 for Core ML (half the size, the Neural "
                                      "Engine's type), fp32 for ONNX", choices=("fp16", "fp32"))
    coreml_format: str | None = opt(None, f"None = both: the ML Program ({ipados(ML_PROGRAM_TARGET)} at the default "
                                          f"--deployment-target), the one-file NeuralNetwork for older iPads "
                                          f"({ipados(NEURALNETWORK_TARGET)})", choices=tuple(formats.coreml_choices()))
    deployment_target: str | None = opt(None, f"ML Program minimum OS; None = {ML_PROGRAM_TARGET} "
                                              f"({ipados(ML_PROGRAM_TARGET)}: {ML_PROGRAM_REACH})", choices=ML_PROGRAM_TARGETS)
    compress: str | None = opt(None, "Core ML weight compression; None = fp16 (uncompressed). A compressed file is "
                                      "named for it (encoder.int8.mlpackage) and sits beside the others: "
                                      + "; ".join(f"{c.name}: {c.what}" for c in compression.COMPRESSIONS.values()),
                               choices=compression.names())
    opset: int | None = opt(None, "ONNX opset; None = 18, the lowest the torch.export-based exporter writes natively")
    author: str = opt("ssl-edge-pipeline", "shown in Xcode's model view")
    license: str = opt("MIT", "the pipeline's license; set the terms of your training data if they differ")
    model_version: str | None = opt(None, "model version string shown in Xcode; None = <pipeline version>+<run id>.e<epochs>")
    description: str | None = opt(None, "short description; None = method, backbone, input and output in one line")



# The ValidateConfig fields that are bounds of parity.gate_failures, by its keyword names.
GATES = ("fp32_max_abs", "fp32_min_cosine", "fp16_max_rel_l2", "fp16_min_topk", "compressed_min_topk",
         "compressed_max_knn_drop", "compressed_max_probe_drop", "compressed_min_cosine")


@dataclass
class ValidateConfig:
    images: str = opt("", "extra folder of images to check with, besides the run's val split (any PIL-readable files)")
    max_images: int = opt(256, "cap on val images (and, separately, on --images files): enough for top-10 statistics, "
                               "and the reference evaluators run one image at a time")
    max_train_images: int = opt(1024, "compressed artifacts' probe gate: cap on the run's train images (spread over "
                                      "the split) each model fits its own probe on; each compressed artifact runs them "
                                      "too, so the cap bounds validate's time")
    top_k: int = opt(10, "neighbours compared per query for retrieval agreement (clamped to images - 1)")
    fp32_max_abs: float = opt(1e-4, "fp32 artifacts: largest |artifact - PyTorch| allowed; fp32 summation order alone "
                                    "gives ~1e-6 on unit-length features")
    fp32_min_cosine: float = opt(0.99999, "fp32 artifacts: worst per-image cosine allowed; a wrong op costs far more")
    fp16_max_rel_l2: float = opt(1e-2, "fp16 artifacts: worst per-image ||a - r|| / ||r||; fp16 storage through a "
                                       "ResNet gives ~1e-3, an RGB/BGR swap ~5e-2")
    fp16_min_topk: float = opt(0.95, "fp16 artifacts: mean top-k neighbour overlap with PyTorch's features")
    compressed_min_topk: float = opt(0.80, "compressed artifacts (--compress): mean top-k neighbour overlap with the "
                                           "fp32 encoder (docs/export.md, Compressed weights: the measurement)")
    compressed_max_knn_drop: float = opt(0.03, "compressed artifacts: largest drop in leave-one-out kNN top-1 on the "
                                               "labelled val images (fp32 encoder minus artifact)")
    compressed_max_probe_drop: float = opt(0.03, "compressed artifacts: largest drop in val top-1 of the artifact's "
                                                 "own linear probe (fitted on its train features) against the fp32 "
                                                 "encoder's own")
    compressed_min_cosine: float = opt(0.90, "compressed artifacts: worst per-image cosine to the fp32 feature; one "
                                             "image gone wrong, which the averages hide")
    coreml_runtime: str = opt("auto", "auto: also run the real Core ML runtime where it exists (macOS); off: never",
                              choices=("auto", "off"))

    def gates(self) -> dict[str, float]:
        """The bounds, as parity.gate_failures takes them."""
        return {k: getattr(self, k) for k in GATES}
