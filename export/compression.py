"""The weight compressions a Core ML file can be written with, one row each: what it stores, the coremltools
configuration that writes it in an ML Program (coremltools.optimize.coreml) and in a NeuralNetwork
(quantization_utils), and the op set that decompresses it. Torch- and coremltools-free: `--compress`'s choices,
the format table's allowed values and the docs read it before anything heavy loads.

Only the weights are compressed; activations stay what `--precision` says (fp16). Core ML decompresses a weight at
load (or on the fly on the Neural Engine) with the `constexpr_*` op that replaced its `const`, so the file shrinks
and the arithmetic is the fp16 network's on slightly different weights: which is why a compressed artifact is gated
on what an app does with the embedding (stages/validate.py), not on elementwise closeness.

`weight_threshold` 2048 (coremltools' default): tensors smaller than that (biases, a tiny stem) stay fp16; they are
a negligible share of the bytes and the first to hurt when rounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.rundir import UNCOMPRESSED

NONE = UNCOMPRESSED  # the uncompressed file: every weight fp16, its plain name
WEIGHT_THRESHOLD = 2048
GROUPED_FROM = "iOS18"  # per-grouped-channel palettization and per-block quantization are iOS18 ops


@dataclass(frozen=True)
class Compression:
    name: str  # --compress's value; also the artifact file's infix (core/rundir.compressed_file)
    what: str  # its help line
    bits: float | None  # bits per stored weight, before LUTs/scales/masks; None: fp16
    kind: str | None  # "linear" | "palettize" | "prune" | None
    ml_program: dict[str, Any]  # the OpConfig's arguments; granularity may depend on the target (ml_program_config)
    neuralnetwork: tuple[str, int] | None  # (quantization_utils mode, nbits), None: the format has no equivalent
    why_no_neuralnetwork: str = ""


COMPRESSIONS: dict[str, Compression] = {
    NONE: Compression(NONE, "fp16 weights, uncompressed (the default)", None, None, {}, None),
    "int8": Compression("int8", "8-bit linear (symmetric, per output channel)", 8, "linear",
                        {"mode": "linear_symmetric", "dtype": "int8", "granularity": "per_channel"},
                        ("linear_symmetric", 8)),
    "palettize-6": Compression("palettize-6", "6-bit k-means palettization (64-entry LUT per tensor)", 6, "palettize",
                               {"mode": "kmeans", "nbits": 6, "granularity": "per_tensor"}, ("kmeans_lut", 6)),
    "palettize-4": Compression("palettize-4", "4-bit k-means palettization (16-entry LUT per tensor; per group of "
                                              f"16 output channels from --deployment-target {GROUPED_FROM} on)", 4, "palettize",
                               {"mode": "kmeans", "nbits": 4, "granularity": "per_tensor"}, ("kmeans_lut", 4)),
    "prune-50": Compression("prune-50", "50% magnitude pruning, sparse fp16 storage", None, "prune",
                            {"target_sparsity": 0.5}, None,
                            "the NeuralNetwork format stores no sparse weights"),
}


def names() -> tuple[str, ...]:
    return tuple(COMPRESSIONS)


def neuralnetwork_names() -> tuple[str, ...]:
    """The compressions a NeuralNetwork (.mlmodel) can hold: 8-bit linear and LUT quantization, no sparsity."""
    return tuple(n for n, c in COMPRESSIONS.items() if n == NONE or c.neuralnetwork)


def _target_number(target: str) -> int:
    return int(target.removeprefix("iOS"))


def ml_program_config(name: str, target: str) -> dict[str, Any]:
    """The OpConfig arguments for this compression at this deployment target, weight_threshold included: the
    exact configuration recorded in the artifact's metadata and in encoder.json."""
    c = COMPRESSIONS[name]
    config = {**c.ml_program, "weight_threshold": WEIGHT_THRESHOLD}
    if name == "palettize-4" and _target_number(target) >= _target_number(GROUPED_FROM):
        # 16 values for a whole 3x3x512x512 tensor lose the small-magnitude channels; one LUT per 16 output channels
        # keeps them at a few percent more bytes. Below iOS18 there is no op for it.
        config.update(granularity="per_grouped_channel", group_size=16, channel_axis=0)
    return config


def refusal(name: str, fmt: str, target: str | None) -> str | None:
    """Why this file cannot hold this compression, or None."""
    c = COMPRESSIONS[name]
    if name == NONE:
        return None
    if fmt == "mlmodel" and c.neuralnetwork is None:
        return f"--compress {name}: {c.why_no_neuralnetwork}; add --coreml-format mlpackage"
    if fmt == "mlpackage" and target is not None and _target_number(target) < 16:
        return (f"--compress {name}: compressed weights need the iOS16 op set (constexpr ops); "
                f"--deployment-target {target} has none: use iOS16 or later")
    return None
