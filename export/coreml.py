"""Core ML writers: the ML Program (.mlpackage) and the legacy NeuralNetwork (.mlmodel) for older iPads (their
minimum iPadOS: export/targets.py).

Both take the traced encoder (an ExportedProgram or TorchScript) and run on Linux: conversion needs no Mac, only
prediction does. The input is an ImageType (RGB, the trained size, scale 1, bias 0), so Vision's VNCoreMLRequest can
feed a camera frame directly and the normalisation stays inside the model, as traced. One output, `embedding`,
float32 [1, D].

fp16 ML Program: everything from the global average pool on (pool, flatten, sum of squares, rsqrt, scale) stays in
fp32; a ViT has no pool, and its tail starts at the final LayerNorm, whose class token is the feature. A sum of 2048
squared features passes fp16's 65504 easily, and this tail costs nothing next to the convs.
A backbone whose registry row says fp32_stem (EfficientNet-B0) also keeps its stem in fp32: every op from the input
through the first conv (the input normalisation and the stem conv), since the fp16 rounding of the normalised input
alone takes half of its fp16 error budget. The NeuralNetwork format cannot do that (export/formats.py refuses it).
fp16 NeuralNetwork: a NeuralNetwork has no compute-precision setting; "fp16" there means fp16 *weights* (the device
picks the compute precision), and the metadata says so.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from export import compression
from export.encoder import INPUT_NAME, OUTPUT_NAME
from export.targets import NEURALNETWORK_TARGET, SPEC_TARGETS
from export.metadata import as_strings, input_description, output_description
from core.quiet import conversion_bars_off, import_coremltools
from core.errors import PipelineError
from train.backbones import row

POOL_OPS = ("reduce_mean", "avg_pool")  # the last one is the global pool (squeeze-excitation pools come before it)
TAIL_WITHOUT_POOL = "layer_norm"  # a ViT: the last one is the final norm
FP32_TAIL_OPS = ("reduce_sum", "rsqrt")  # the L2 ops checked in the saved program
# MIL proto DataType values of the program's tensors (coremltools/proto/MIL.proto)
MIL_DTYPES = {10: "fp16", 11: "fp32"}


def _image_input(ct, size: int):
    return ct.ImageType(name=INPUT_NAME, shape=(1, 3, size, size), color_layout=ct.colorlayout.RGB, scale=1.0,
                        bias=[0.0, 0.0, 0.0])


def tail_ops(block) -> list:
    """The ops that stay fp32: the last global pool (else the last layer_norm) of the block and every op it feeds.
    Only the last: a squeeze-excitation block's pool also reduces to 1x1, and what it feeds is the rest of the net."""
    roots = [op for op in block.operations if op.op_type in POOL_OPS]
    roots = roots or [op for op in block.operations if op.op_type == TAIL_WITHOUT_POOL]
    if not roots:
        return []
    tail, todo = [], [roots[-1]]
    while todo:
        op = todo.pop()
        if any(op is t for t in tail):
            continue
        tail.append(op)
        todo += [child for v in op.outputs for child in v.child_ops]
    return tail


def stem_ops(block) -> list:
    """The ops from the block's start through its first conv: the input normalisation and the stem convolution."""
    ops = list(block.operations)
    first_conv = next((i for i, op in enumerate(ops) if op.op_type == "conv"), -1)
    return ops[: first_conv + 1]


def _fp32_selector(fp32_stem: bool):
    """op_selector for FP16ComputePrecision: False (fp32) for the tail (tail_ops) and, with fp32_stem, the stem
    (stem_ops); True (fp16) for the rest. Found once, from the first op asked about, in the block the pass walks."""
    kept: dict[int, Any] = {}  # id -> op; holding the op keeps its id from being reused

    def fp16(op) -> bool:
        if not kept:
            block = op.enclosing_block
            ops = tail_ops(block) + (stem_ops(block) if fp32_stem else [])
            kept.update({id(t): t for t in ops} or {0: None})  # {0: None}: nothing kept, asked
        return id(op) not in kept

    return fp16


def program_ops(spec) -> list[tuple[str, str, str]]:
    """(op type, first output name, its dtype) of an ML Program's main function, in order."""
    fn = spec.mlProgram.functions["main"]
    block = fn.block_specializations[fn.opset]
    out = []
    for op in block.operations:
        if op.outputs:
            dtype = op.outputs[0].type.tensorType.dataType
            out.append((op.type, op.outputs[0].name, MIL_DTYPES.get(dtype, str(dtype))))
    return out


def check_fp32_ops(spec, fp32_stem: bool) -> None:
    """The L2 normalisation of an fp16 program (and, with fp32_stem, its first conv) must be fp32 in the saved
    program, not just requested."""
    ops = program_ops(spec)
    tail = [(t, n, d) for t, n, d in ops if t in FP32_TAIL_OPS]
    if not tail or any(d != "fp32" for _, _, d in tail):
        raise PipelineError(f"fp16 ML Program keeps its L2 ops in {[(t, d) for t, _, d in tail]}, not fp32: refused")
    stem = next((d for t, _, d in ops if t == "conv"), None)
    if fp32_stem and stem != "fp32":
        raise PipelineError(f"fp16 ML Program keeps its first conv in {stem}, not fp32 as its backbone needs: refused")


def _set_metadata(model, meta: dict[str, Any]) -> None:
    model.author = meta["author"]
    model.license = meta["license"]
    model.version = meta["version"]
    model.short_description = meta["description"]
    model.input_description[INPUT_NAME] = input_description(meta)
    model.output_description[OUTPUT_NAME] = output_description(meta)
    model.user_defined_metadata.update(as_strings(meta))


def _convert(ct, program, size: int, **kwargs):
    try:
        with warnings.catch_warnings(), conversion_bars_off():
            warnings.simplefilter("ignore", DeprecationWarning)  # coremltools' own internal registry, once per op
            return ct.convert(program, inputs=[_image_input(ct, size)],
                              outputs=[ct.TensorType(name=OUTPUT_NAME, dtype=np.float32)], skip_model_load=True, **kwargs)
    except Exception as e:  # coremltools raises many types; the message names the op it could not lower
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PipelineError(f"Core ML conversion failed ({type(e).__name__}: {first}); nothing was written") from None


def _compress_ml_program(ct, model, name: str, target: str):
    """The converted fp16 program with its weights compressed by coremltools.optimize.coreml; (model, the exact
    OpConfig arguments). Refused when nothing was large enough to compress: a file named int8 must be int8."""
    import coremltools.optimize.coreml as cto

    config = compression.ml_program_config(name, target)
    kind = compression.COMPRESSIONS[name].kind
    op_config, apply = {"linear": (cto.OpLinearQuantizerConfig, cto.linear_quantize_weights),
                        "palettize": (cto.OpPalettizerConfig, cto.palettize_weights),
                        "prune": (cto.OpMagnitudePrunerConfig, cto.prune_weights)}[kind]
    with warnings.catch_warnings(), conversion_bars_off():
        warnings.simplefilter("ignore")  # per-op notes on skipped small tensors
        model = apply(model, cto.OptimizationConfig(global_config=op_config(**config)))
    ops = {t for t, _, _ in program_ops(model.get_spec()) if t.startswith("constexpr_")}
    if not ops:
        raise PipelineError(f"--compress {name}: no weight tensor has {compression.WEIGHT_THRESHOLD} or more values, "
                            f"so nothing was compressed; nothing was written")
    return model, config


def _weight_file_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in (path / "Data" / "com.apple.CoreML" / "weights").rglob("*") if f.is_file())


def _compression_detail(name: str, config: dict[str, Any], coremltools_call: str, weights_bytes: int) -> dict[str, Any]:
    c = compression.COMPRESSIONS[name]
    return {"compression": name, "compression_detail": c.what, "compression_config": {"call": coremltools_call, **config},
            "weights_bytes": weights_bytes}


def write_mlpackage(program, path: Path, meta: dict[str, Any], precision: str, options: dict[str, Any]) -> dict[str, Any]:
    ct = import_coremltools()
    target = options["deployment_target"]
    name = options.get("compress") or compression.NONE
    fp32_stem = row(meta["backbone"]).fp32_stem
    kept = f"{'input normalisation, first conv, ' if fp32_stem else ''}global pool and L2 normalisation in fp32"
    detail = {"precision": precision, "deployment_target": target,
              "precision_detail": (f"fp16 weights and activations; {kept}" if precision == "fp16"
                                   else "fp32 weights and activations")}
    compute = (ct.transform.FP16ComputePrecision(op_selector=_fp32_selector(fp32_stem)) if precision == "fp16"
               else ct.precision.FLOAT32)
    model = _convert(ct, program, meta["image_size"], convert_to="mlprogram", compute_precision=compute,
                     minimum_deployment_target=getattr(ct.target, target))
    config: dict[str, Any] = {}
    if name != compression.NONE:
        model, config = _compress_ml_program(ct, model, name, target)
        detail["precision_detail"] = (f"{compression.COMPRESSIONS[name].what} weights, decompressed to fp16 by "
                                      f"constexpr ops; fp16 activations; {kept}")
    if precision == "fp16":
        check_fp32_ops(model.get_spec(), fp32_stem)
    model.save(str(path))  # once to measure the weight blob, whose size the metadata then carries
    call = {"linear": "linear_quantize_weights", "palettize": "palettize_weights", "prune": "prune_weights"}.get(
        compression.COMPRESSIONS[name].kind or "", "none")
    detail.update(_compression_detail(name, config, f"coremltools.optimize.coreml.{call}" if config else "none",
                                      _weight_file_bytes(path)))
    _set_metadata(model, {**meta, "format": "mlpackage", **detail})
    shutil.rmtree(path)
    model.save(str(path))
    return detail


class _LargeWeightsOnly:
    """quantization_utils' layer selector, limited like coremltools.optimize's weight_threshold: convolutions and
    inner products with at least WEIGHT_THRESHOLD weights. Batch-norm statistics and biases stay fp16."""

    def __init__(self, base):
        self.base = base

    def do_quantize(self, layer, **kwargs) -> bool:
        kind = layer.WhichOneof("layer")
        if kind not in ("convolution", "innerProduct") or not self.base.do_quantize(layer, **kwargs):
            return False
        w = getattr(layer, kind).weights
        return max(len(w.floatValue), len(w.float16Value) // 2) >= compression.WEIGHT_THRESHOLD


def _kmeans_lut(nbits: int, weight):
    """coremltools' own k-means LUT for a NeuralNetwork weight, flattened: its "kmeans_lut" mode hands the LUT on
    as an N x 1 array, which the protobuf field refuses (coremltools 9)."""
    from coremltools.models.neural_network.quantization_utils import _get_kmeans_lookup_table_and_weight

    # fp16 first, as the ML Program path clusters: coremltools then picks its exact 1-d k-means (kmeans1d), seconds
    # where scikit-learn takes minutes on a 512x512x3x3 convolution; the stored LUT values are fp16-exact anyway.
    lut, indices = _get_kmeans_lookup_table_and_weight(nbits, np.asarray(weight, dtype=np.float16))
    return np.asarray(lut, dtype=np.float32).reshape(-1), indices


def _nn_weights_bytes(spec) -> int:
    total = 0
    for layer in spec.neuralNetwork.layers:
        kind = layer.WhichOneof("layer")
        for fd, w in getattr(layer, kind).ListFields() if kind else ():
            if fd.message_type is not None and fd.message_type.name == "WeightParams":
                total += 4 * len(w.floatValue) + len(w.float16Value) + len(w.rawValue) + len(w.int8RawValue)
    return total


def pack_bits(values, nbits: int) -> np.ndarray:
    """The bytes of coremltools' NeuralNetwork bit packer (`_convert_array_to_nbit_quantized_bytes`): each value's
    low `nbits` bits, most significant first, packed into bytes high bit first, zero-padded to a whole byte and to one
    byte at least. Theirs loops in Python over every bit: 38 s of a ResNet-18's 4-bit palettization on one core, and
    minutes for a ResNet-50; numpy's packbits does the same in a fraction of a second."""
    v = np.asarray(values).ravel().astype(np.uint8)  # only the low nbits < 8 bits are kept, which a uint8 holds
    bits = (v[:, None] >> np.arange(nbits - 1, -1, -1, dtype=np.uint8)) & 1
    packed = np.packbits(bits.ravel())
    return packed if packed.size else np.zeros(1, np.uint8)


@contextlib.contextmanager
def _numpy_bit_packer(quantization_utils):
    """quantize_weights with `pack_bits` in place of coremltools' own packer, for this call only (tests/export/
    test_coreml.py checks the two give the same bytes); a coremltools without that function keeps its own."""
    name = "_convert_array_to_nbit_quantized_bytes"
    original = getattr(quantization_utils, name, None)
    if original is None:
        yield
        return
    setattr(quantization_utils, name, pack_bits)
    try:
        yield
    finally:
        setattr(quantization_utils, name, original)


def write_mlmodel(program, path: Path, meta: dict[str, Any], precision: str, options: dict[str, Any]) -> dict[str, Any]:
    ct = import_coremltools()
    from coremltools.models.neural_network import quantization_utils

    with contextlib.redirect_stdout(io.StringIO()):  # "Const ... was already added": a weight two layers share
        model = _convert(ct, program, meta["image_size"], convert_to="neuralnetwork",
                         minimum_deployment_target=getattr(ct.target, NEURALNETWORK_TARGET))
    name = options.get("compress") or compression.NONE
    config: dict[str, Any] = {}
    if name != compression.NONE:
        mode, nbits = compression.COMPRESSIONS[name].neuralnetwork
        config = {"nbits": nbits, "quantization_mode": mode, "layers": "convolution, innerProduct",
                  "weight_threshold": compression.WEIGHT_THRESHOLD}
        lut = {"lut_function": _kmeans_lut} if mode == "kmeans_lut" else {}
        with contextlib.redirect_stdout(io.StringIO()), _numpy_bit_packer(quantization_utils):  # one line per layer
            model = quantization_utils.quantize_weights(
                model, nbits=nbits, quantization_mode="custom_lut" if lut else mode,
                selector=_LargeWeightsOnly(quantization_utils.QuantizedLayerSelector()), **lut)
    if precision == "fp16":  # the rest (or all) to fp16; fields already quantized have no fp32 values to convert
        with contextlib.redirect_stdout(io.StringIO()):
            model = quantization_utils.quantize_weights(model, nbits=16)
    spec = model.get_spec()
    target = SPEC_TARGETS.get(spec.specificationVersion, f"specification version {spec.specificationVersion}")
    detail = {"precision": precision, "deployment_target": target,
              "precision_detail": ("fp16 weights (NeuralNetwork: the device chooses the compute precision)"
                                   if precision == "fp16" else "fp32 weights")}
    if config:
        detail["precision_detail"] = (f"{compression.COMPRESSIONS[name].what} weights (convolutions and inner "
                                      f"products), the rest fp16; the device chooses the compute precision")
    detail.update(_compression_detail(name, config, "coremltools.models.neural_network.quantization_utils."
                                      "quantize_weights" if config else "none", _nn_weights_bytes(spec)))
    # The NeuralNetwork converter leaves the output shape unset; the app (and Xcode's preview) should see [1, D].
    out = spec.description.output[0]
    if out.name != OUTPUT_NAME:
        raise PipelineError(f"NeuralNetwork output is named {out.name!r}, expected {OUTPUT_NAME!r}")
    del out.type.multiArrayType.shape[:]
    out.type.multiArrayType.shape.extend([1, meta["embedding_dim"]])
    model = ct.models.MLModel(spec, skip_model_load=True)
    _set_metadata(model, {**meta, "format": "mlmodel", **detail})
    model.save(str(path))
    return detail


# ---------------------------------------------------------------- checkers (the format table's, run by validate)
# images (uint8 RGB N x 3 x S x S) -> (runtime name, N x D features, the precision the file computes in or None)

def check_mlpackage(path: Path, images) -> tuple[str, np.ndarray, str | None]:
    """The ML Program executed op by op by the reference evaluator (export/mil_eval.py)."""
    from export import mil_eval

    model = mil_eval.load_mlpackage(path)
    return "mil-eval", mil_eval.predict_images(model, images, OUTPUT_NAME), model.precision


def check_mlmodel(path: Path, images) -> tuple[str, np.ndarray, str | None]:
    """The NeuralNetwork's layers run by the reference evaluator (export/nn_eval.py)."""
    from export import nn_eval

    model = nn_eval.load_mlmodel(path)
    compute = model.default_compute
    return f"nn-eval ({compute} activations)", nn_eval.predict_images(model, images, OUTPUT_NAME, compute), model.precision
