"""Run a saved NeuralNetwork model (.mlmodel) anywhere, layer by layer, with PyTorch.

The older Core ML format keeps the picture's preprocessing outside the layers: the description declares the
image's color space (RGB/BGR/gray) and `neuralNetwork.preprocessing` a per-channel scale and bias. Both are
applied here exactly as the spec defines them, since that is where RGB/BGR bugs hide; then every layer runs with
a torch function from `NN_LAYERS`. A layer (or activation, unary function) without an entry is an error naming it.

Precision: weights stored as fp16 are used as stored. What the arithmetic does is a choice, because the runtime
differs by device: on the CPU Core ML computes NN models in fp32; on the GPU and the Neural Engine (what an iPad
uses with the default compute units) activations are fp16. `compute="fp16"` rounds every layer's output to fp16
(fp32 math inside a layer); `compute="fp32"` emulates the CPU. `NNModel.default_compute` picks fp16 for a model
with fp16 weights (the iPad case) and fp32 otherwise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from export.mil_eval import (COLOR_SPACES, InputInfo, batched, call_checked, conv_nd, gelu, image_input, image_io,
                             pad_spatial, pool_nd, resize_linear, same_pads)
from core.quiet import import_coremltools
from core.errors import PipelineError


# ---------------------------------------------------------------- weights

def weights(w, count: int | None = None) -> torch.Tensor:
    """A WeightParams as a float32 tensor: floatValue or float16Value (widened exactly), or quantized weights
    (`pipeline export --compress`) dequantized; those need `count`, the number of weights the layer declares,
    since n-bit fields padded to a whole byte leave it ambiguous."""
    if len(w.floatValue):
        return torch.tensor(np.asarray(w.floatValue, dtype=np.float32))
    if len(w.float16Value):
        return torch.from_numpy(np.frombuffer(w.float16Value, dtype=np.float16).astype(np.float32))
    if len(w.int8RawValue):
        raise PipelineError("int8 dynamic-quantization weights are not supported by the reference evaluator")
    if len(w.rawValue):
        return dequantize(w, count)
    return torch.zeros(0)


def unpack_fields_msb(packed: torch.Tensor, nbits: int, count: int) -> torch.Tensor:
    """`count` n-bit unsigned fields from bytes packed most significant bit first (the NeuralNetwork's layout,
    the reverse of the ML Program's)."""
    bits = (packed.long().reshape(-1, 1) >> torch.arange(7, -1, -1)) & 1
    fields = bits.reshape(-1)[: count * nbits].reshape(count, nbits)
    return (fields << torch.arange(nbits - 1, -1, -1)).sum(dim=1)


def dequantize(w, count: int | None) -> torch.Tensor:
    """Quantized WeightParams -> float32: per-channel linear (q * scale + bias, along the first axis) or a lookup
    table, as NeuralNetwork.proto's QuantizationParams define them; computed in float64 and rounded once."""
    q = w.quantization
    nbits, kind = q.numberOfBits, q.WhichOneof("QuantizationType")
    if count is None:
        raise PipelineError("quantized weights outside a convolution or inner product are not supported by the "
                            "reference evaluator")
    raw = torch.from_numpy(np.frombuffer(w.rawValue, dtype=np.uint8).copy())
    if not 1 <= nbits <= 8 or len(raw) != -(-count * nbits // 8):
        raise PipelineError(f"{len(raw)} bytes of {nbits}-bit weights cannot hold the layer's {count} weights")
    codes = raw.long() if nbits == 8 else unpack_fields_msb(raw, nbits, count)
    if kind == "linearQuantization":
        scale = torch.tensor(list(q.linearQuantization.scale), dtype=torch.float64)
        bias = torch.tensor(list(q.linearQuantization.bias), dtype=torch.float64)
        if len(scale) != len(bias) or len(scale) < 1 or count % len(scale):
            raise PipelineError(f"linear quantization with {len(scale)} scales and {len(bias)} biases for {count} weights")
        out = codes.double().reshape(len(scale), -1) * scale[:, None] + bias[:, None]
    elif kind == "lookupTableQuantization":
        lut = torch.tensor(list(q.lookupTableQuantization.floatValue), dtype=torch.float64)
        if len(lut) != 2 ** nbits:
            raise PipelineError(f"a {nbits}-bit lookup table needs {2 ** nbits} values, it has {len(lut)}")
        out = lut[codes]
    else:
        raise PipelineError(f"quantization {kind!r} is not supported by the reference evaluator")
    return out.reshape(-1).to(torch.float32)


def quantized_count(layer, field: str) -> int | None:
    """How many weights a layer's field holds, by its declared sizes: the layers --compress quantizes."""
    kind = layer.WhichOneof("layer")
    if field != "weights":
        return None
    if kind == "convolution":
        c = layer.convolution
        return int(c.outputChannels * c.kernelChannels * np.prod(list(c.kernelSize)))
    if kind == "innerProduct":
        return int(layer.innerProduct.outputChannels * layer.innerProduct.inputChannels)
    return None


def _is_fp16(w) -> bool:
    """fp16 weights, or quantized ones: both stand for an fp16 network (the device computes it in fp16)."""
    return len(w.float16Value) > 0 or len(w.rawValue) > 0


# ---------------------------------------------------------------- layers
# Each takes (params, inputs, w): the layer's oneof message, its input tensors, and its WeightParams fields as flat
# float32 tensors (converted once at load, by field name); returns one tensor or a tuple.

def _convolution(p, xs, w):
    if p.isDeconvolution:
        raise PipelineError("deconvolution is not supported by the reference evaluator")
    if len(xs) != 1:
        raise PipelineError("convolution with weights as a second input is not supported by the reference evaluator")
    x = xs[0]
    kernel = list(p.kernelSize) or [3, 3]
    strides = list(p.stride) or [1, 1]
    dil = list(p.dilationFactor) or [1, 1]
    groups = p.nGroups or 1
    weight = w["weights"].reshape(p.outputChannels, p.kernelChannels, *kernel)
    b = w["bias"] if p.hasBias else None
    if p.WhichOneof("ConvolutionPaddingType") == "same":
        pads = same_pads(x.shape[-2:], kernel, strides, dil, lower=p.same.asymmetryMode == 1)
    else:
        amounts = p.valid.paddingAmounts.borderAmounts
        pads = [(a.startEdgeSize, a.endEdgeSize) for a in amounts] if len(amounts) else [(0, 0), (0, 0)]
    return conv_nd(x, weight, b, strides, pads, dil, groups)


def _pooling(p, xs, w):
    x = xs[0]
    kind = {0: "max", 1: "avg"}.get(p.type)
    if kind is None:
        raise PipelineError("L2 pooling is not supported by the reference evaluator")
    if p.globalPooling:
        kernel, strides, pads = list(x.shape[-2:]), [1, 1], [(0, 0), (0, 0)]
        outs = [1, 1]
    else:
        kernel = list(p.kernelSize) or [3, 3]
        strides = list(p.stride) or [1, 1]
        padding = p.WhichOneof("PoolingPaddingType")
        if padding == "same":
            pads = same_pads(x.shape[-2:], kernel, strides, [1, 1], lower=p.same.asymmetryMode == 1)
            outs = [math.ceil(n / s) for n, s in zip(x.shape[-2:], strides)]
        elif padding == "includeLastPixel":
            amounts = list(p.includeLastPixel.paddingAmounts) or [0, 0]
            pads = [(a, a) for a in amounts]
            outs = []
            for n, k, s, a in zip(x.shape[-2:], kernel, strides, amounts):  # the proto's Caffe-style rule
                o = math.ceil((n + 2 * a - k) / s) + 1
                if a > 0 and (o - 1) * s >= n + a:
                    o -= 1
                outs.append(o)
        else:
            amounts = p.valid.paddingAmounts.borderAmounts
            pads = [(a.startEdgeSize, a.endEdgeSize) for a in amounts] if len(amounts) else [(0, 0), (0, 0)]
            outs = [(n + pl + pr - k) // s + 1 for n, k, s, (pl, pr) in zip(x.shape[-2:], kernel, strides, pads)]
    return pool_nd(x, kind, kernel, strides, pads, outs, p.avgPoolExcludePadding)


ACTIVATIONS: dict[str, Callable] = {
    "ReLU": lambda a, x: torch.relu(x),
    "linear": lambda a, x: a.alpha * x + a.beta,
    "leakyReLU": lambda a, x: torch.where(x >= 0, x, a.alpha * x),
    "sigmoid": lambda a, x: torch.sigmoid(x),
    "tanh": lambda a, x: torch.tanh(x),
    "sigmoidHard": lambda a, x: (a.alpha * x + a.beta).clamp(0, 1),
    "thresholdedReLU": lambda a, x: torch.where(x >= a.alpha, x, torch.zeros_like(x)),
}


def _activation(p, xs, w):
    kind = p.WhichOneof("NonlinearityType")
    if kind not in ACTIVATIONS:
        raise PipelineError(f"activation `{kind}` is not supported by the reference evaluator")
    return ACTIVATIONS[kind](getattr(p, kind), xs[0])


UNARY: dict[int, Callable] = {  # UnaryFunctionLayerParams.Operation; x is already scale*x + shift
    0: lambda x, p, eps: torch.sqrt(x),
    1: lambda x, p, eps: torch.rsqrt(x + eps),
    2: lambda x, p, eps: 1.0 / (x + eps),
    3: lambda x, p, eps: torch.pow(x, p.alpha),
    4: lambda x, p, eps: torch.exp(x),
    # The proto's formula omits epsilon for LOG, but the runtime adds it: coremltools' NN-backend tests assert
    # log(x + epsilon) on device, and its MIL log(x, epsilon) converts to exactly this layer.
    5: lambda x, p, eps: torch.log(x + eps),
    6: lambda x, p, eps: torch.abs(x),
    7: lambda x, p, eps: torch.clamp(x, min=p.alpha),
}


def _unary(p, xs, w):
    if p.type not in UNARY:
        raise PipelineError(f"unary function type {p.type} is not supported by the reference evaluator")
    scale = p.scale if p.scale != 0 else 1.0  # the proto: 0 or unset means 1
    eps = p.epsilon if p.epsilon != 0 else 1e-6
    return UNARY[p.type](xs[0] * scale + p.shift, p, eps)


def _add(p, xs, w):
    if len(xs) == 1:
        return xs[0] + p.alpha
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def _multiply(p, xs, w):
    if len(xs) == 1:
        return xs[0] * p.alpha
    out = xs[0]
    for x in xs[1:]:
        out = out * x
    return out


def _fold(fn):
    def run(p, xs, w):
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out

    return run


def _compare(fn):
    def run(p, xs, w):
        other = xs[1] if len(xs) > 1 else torch.tensor(p.alpha)
        return fn(xs[0], other).float()

    return run


def _batchnorm(p, xs, w):
    if p.computeMeanVar:
        raise PipelineError("batchnorm with computeMeanVar (instance norm) is not supported by the reference evaluator")
    x = xs[0]
    c = p.channels
    shape = [c, 1, 1]  # the channel axis is -3
    eps = p.epsilon if p.epsilon != 0 else 1e-5
    mean, var = w["mean"].reshape(shape), w["variance"].reshape(shape)
    gamma, beta = w["gamma"].reshape(shape), w["beta"].reshape(shape)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def _mvn(p, xs, w):
    """Mean (and variance) normalisation over the last three dims (acrossChannels) or the last two. The spec does
    not say where epsilon goes; coremltools lowers layer_norm, (x - mean) / sqrt(var + eps), to this layer, so that
    is the semantics taken (1 / (sqrt(var) + eps) differs by ~eps / 2 relative at unit variance)."""
    x = xs[0]
    dims = list(range(x.dim() - (3 if p.acrossChannels else 2), x.dim()))
    y = x - x.mean(dim=dims, keepdim=True)
    if p.normalizeVariance:
        eps = p.epsilon if p.epsilon != 0 else 1e-6
        y = y / torch.sqrt((y * y).mean(dim=dims, keepdim=True) + eps)
    return y


def _chw(values: torch.Tensor, shape) -> torch.Tensor:
    """A Scale/Bias layer's parameter of shape [1], [C], [1, H, W] or [C, H, W], aligned with the last three dims."""
    shape = list(shape) or [1]
    return values.reshape([shape[0], 1, 1] if len(shape) == 1 else shape)


def _scale(p, xs, w):
    y = xs[0] * _chw(w["scale"], p.shapeScale)
    return y + _chw(w["bias"], p.shapeBias) if p.hasBias else y


GELU_MODES = {0: "EXACT", 1: "TANH_APPROXIMATION", 2: "SIGMOID_APPROXIMATION"}  # GeluLayerParams.GeluMode


def _l2normalize(p, xs, w):
    x = xs[0]
    eps = p.epsilon if p.epsilon != 0 else 1e-6
    dims = list(range(x.dim() - 3, x.dim()))
    return x / torch.sqrt((x * x).sum(dim=dims, keepdim=True) + eps)


def _inner_product(p, xs, w):
    """W is [C_out, C_in]. Ranks 1-3 multiply the last axis; rank 4/5 flatten C,H,W and return (..., C_out, 1, 1)."""
    x = xs[0]
    if p.int8DynamicQuantize:
        raise PipelineError("int8 dynamic quantization is not supported by the reference evaluator")
    weight = w["weights"].reshape(p.outputChannels, p.inputChannels)
    b = w["bias"] if p.hasBias else None
    if x.dim() <= 3:
        return F.linear(x, weight, b)
    lead = x.shape[:-3]
    y = F.linear(x.reshape(*lead, -1), weight, b)
    return y.reshape(*lead, p.outputChannels, 1, 1)


def _batched_matmul(p, xs, w):
    if len(xs) == 2:
        a, b = xs
        if p.transposeA:
            a = a.transpose(-1, -2)
        if p.transposeB:
            b = b.transpose(-1, -2)
        return torch.matmul(a, b)
    # One input: W is [X1, X2] stored column-major, i.e. row-major [X2, X1] -- a Linear weight.
    weight = w["weights"].reshape(p.weightMatrixSecondDimension, p.weightMatrixFirstDimension)
    return F.linear(xs[0], weight, w["bias"] if p.hasBias else None)


def _reduce(fn):
    def run(p, xs, w):
        x = xs[0]
        dims = list(range(x.dim())) if p.reduceAll else sorted(a % x.dim() for a in p.axes)
        for d in sorted(dims, reverse=True):
            x = fn(x, d, p.keepDims)
        return x

    return run


def _rank_preserving_reshape(p, xs, w):
    x = xs[0]
    shape = [x.shape[i] if s == 0 else s for i, s in enumerate(p.targetShape)]  # 0 copies that input dim
    return x.reshape(shape)


def _squeeze(p, xs, w):
    x = xs[0]
    if p.squeezeAll:
        return x.reshape([d for d in x.shape if d != 1] or [1])
    axes = {a % x.dim() for a in p.axes}
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    return x.reshape(shape or [1])  # the proto: a rank-1 input stays rank 1


def _expand_dims(p, xs, w):
    x = xs[0]
    out_rank = x.dim() + len(p.axes)
    for a in sorted(a % out_rank for a in p.axes):
        x = x.unsqueeze(a)
    return x


def _concat(p, xs, w):
    if p.sequenceConcat:
        return torch.cat(xs, dim=-5)
    return torch.cat(xs, dim=-3)


def _concat_nd(p, xs, w):
    if p.interleave:
        axis = p.axis % xs[0].dim()
        stacked = torch.stack(xs, dim=axis + 1)
        shape = list(xs[0].shape)
        shape[axis] *= len(xs)
        return stacked.reshape(shape)
    return torch.cat(xs, dim=p.axis)


def _split_nd(p, xs, w):
    x = xs[0]
    sizes = list(p.splitSizes) or [x.shape[p.axis] // p.numSplits] * p.numSplits
    return tuple(torch.split(x, sizes, dim=p.axis))


def _slice_static(p, xs, w):
    x = xs[0]
    squeeze = list(p.squeezeMasks) or [False] * x.dim()
    for d in range(x.dim()):
        if squeeze[d]:
            idx = [p.beginIds[d] % x.shape[d]]
        else:
            b = None if p.beginMasks[d] else p.beginIds[d]
            e = None if p.endMasks[d] else p.endIds[d]
            idx = range(x.shape[d])[slice(b, e, p.strides[d])]
        x = x.index_select(d, torch.as_tensor(list(idx), dtype=torch.long))
    return x.reshape([n for d, n in enumerate(x.shape) if not squeeze[d]])


def _gather(p, xs, w):
    x, idx = xs[0], xs[1].round().long()
    axis = p.axis % x.dim()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    out = x.index_select(axis, idx.flatten())
    return out.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


def _tile(p, xs, w):
    if len(xs) > 1:
        raise PipelineError("tile with reps as a second input is not supported by the reference evaluator")
    reps = [1] * (xs[0].dim() - len(p.reps)) + list(p.reps)
    return xs[0].repeat(reps)


RESIZE_MODES = {0: "STRICT_ALIGN_CORNERS", 1: "ALIGN_CORNERS", 2: "DEFAULT", 3: "OFFSET_CORNERS"}  # SamplingMode.Method


def _resize_bilinear(p, xs, w):
    size = list(p.targetSize) or [1, 1]
    return resize_linear(xs[0], size, RESIZE_MODES[p.mode.samplingMethod])


def _upsample(p, xs, w):
    x = xs[0]
    if len(p.fractionalScalingFactor):
        scale = list(p.fractionalScalingFactor)
    else:
        scale = list(p.scalingFactor) or [1, 1]
    outs = [int(math.floor(n * s)) for n, s in zip(x.shape[-2:], scale)]
    if p.mode == 0:
        if any(float(s) != int(s) for s in scale):
            raise PipelineError("nearest-neighbour upsample by a fractional factor is not supported by the reference evaluator")
        return x.repeat_interleave(int(scale[0]), dim=-2).repeat_interleave(int(scale[1]), dim=-1)
    mode = {0: "DEFAULT", 1: "STRICT_ALIGN_CORNERS", 2: "UNALIGN_CORNERS"}[p.linearUpsampleMode]
    return resize_linear(x, outs, mode)


def _crop(p, xs, w):
    if len(xs) > 1:
        raise PipelineError("crop with a reference input (offset mode) is not supported by the reference evaluator")
    (t, b), (l, r) = [(a.startEdgeSize, a.endEdgeSize) for a in p.cropAmounts.borderAmounts]
    return pad_spatial(xs[0], [(-t, -b), (-l, -r)])


def _load_constant_nd(p, xs, w):
    return w["data"].reshape(list(p.shape))


def _where(p, xs, w):
    return torch.where(xs[0] != 0, xs[1], xs[2])


NN_LAYERS: dict[str, Callable[[Any, list[torch.Tensor], dict[str, torch.Tensor]], Any]] = {
    "convolution": _convolution,
    "pooling": _pooling,
    "activation": _activation,
    "unary": _unary,
    "batchnorm": _batchnorm,
    "l2normalize": _l2normalize,
    "mvn": _mvn,
    "scale": _scale,
    "gelu": lambda p, xs, w: gelu(xs[0], GELU_MODES[p.mode]),
    "softmax": lambda p, xs, w: torch.softmax(xs[0], dim=-3),  # the legacy layer: always the channel axis
    "softmaxND": lambda p, xs, w: torch.softmax(xs[0], dim=p.axis),
    "innerProduct": _inner_product,
    "batchedMatmul": _batched_matmul,
    "add": _add,
    "multiply": _multiply,
    "max": _fold(torch.maximum),
    "min": _fold(torch.minimum),
    "maxBroadcastable": _fold(torch.maximum),
    "minBroadcastable": _fold(torch.minimum),
    "addBroadcastable": _fold(torch.add),
    "subtractBroadcastable": _fold(torch.sub),
    "multiplyBroadcastable": _fold(torch.mul),
    "divideBroadcastable": _fold(torch.div),
    "powBroadcastable": _fold(torch.pow),
    "greaterThan": _compare(torch.gt),
    "lessThan": _compare(torch.lt),
    "logicalAnd": lambda p, xs, w: ((xs[0] != 0) & (xs[1] != 0)).float(),
    "logicalOr": lambda p, xs, w: ((xs[0] != 0) | (xs[1] != 0)).float(),
    "logicalNot": lambda p, xs, w: (xs[0] == 0).float(),
    "whereBroadcastable": _where,
    "clip": lambda p, xs, w: xs[0].clamp(p.minVal, p.maxVal),
    "sign": lambda p, xs, w: torch.sign(xs[0]),
    "floor": lambda p, xs, w: torch.floor(xs[0]),
    "ceil": lambda p, xs, w: torch.ceil(xs[0]),
    "round": lambda p, xs, w: torch.round(xs[0]),  # ties to even, as MIL's round; the NN spec leaves ties open
    "reduceSum": _reduce(lambda x, d, k: x.sum(dim=d, keepdim=k)),
    "reduceMean": _reduce(lambda x, d, k: x.mean(dim=d, keepdim=k)),
    "reduceMax": _reduce(lambda x, d, k: x.amax(dim=d, keepdim=k)),
    "reduceL2": lambda p, xs, w: torch.sqrt(_reduce(lambda x, d, k: x.sum(dim=d, keepdim=k))(p, [xs[0] * xs[0]], w)),
    "reshapeStatic": lambda p, xs, w: xs[0].reshape(list(p.targetShape)),
    "rankPreservingReshape": _rank_preserving_reshape,
    "transpose": lambda p, xs, w: xs[0].permute(list(p.axes)),
    "squeeze": _squeeze,
    "expandDims": _expand_dims,
    "concat": _concat,
    "concatND": _concat_nd,
    "splitND": _split_nd,
    "sliceStatic": _slice_static,
    "gather": _gather,
    "tile": _tile,
    "loadConstantND": _load_constant_nd,
    "resizeBilinear": _resize_bilinear,
    "upsample": _upsample,
    "crop": _crop,
    "copy": lambda p, xs, w: xs[0],
}


# ---------------------------------------------------------------- loading and running a model

@dataclass
class NNModel:
    path: Path
    spec: Any  # the Model proto
    inputs: list[InputInfo]
    outputs: list[str]
    scalers: dict[str, Any]  # input name -> NeuralNetworkImageScaler
    layer_weights: list[dict[str, torch.Tensor]]  # per layer: WeightParams field -> flat float32, converted once
    weights_fp16: bool  # any weight stored as float16Value

    @property
    def precision(self) -> str:
        return "fp16" if self.weights_fp16 else "fp32"

    @property
    def default_compute(self) -> str:
        return "fp16" if self.weights_fp16 else "fp32"


def _layer_weights(layer) -> dict[str, Any]:
    kind = layer.WhichOneof("layer")
    params = getattr(layer, kind) if kind else None
    if params is None:
        return {}
    return {fd.name: value for fd, value in params.ListFields()
            if fd.message_type is not None and fd.message_type.name == "WeightParams"}


def load_mlmodel(path: Path | str) -> NNModel:
    """Read a .mlmodel NeuralNetwork spec. One-line errors for anything this evaluator cannot run faithfully."""
    ct = import_coremltools()

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"no .mlmodel at {path}: re-run `pipeline export`")
    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as e:
        raise PipelineError(f"{path}: the model spec is unreadable ({type(e).__name__}): re-run `pipeline export`") from None
    kind = spec.WhichOneof("Type")
    if kind != "neuralNetwork":
        raise PipelineError(f"{path} holds a {kind} model; the NeuralNetwork evaluator runs only plain neuralNetwork models")
    nn = spec.neuralNetwork
    if nn.imageInputShapeMapping != 1 or nn.arrayInputShapeMapping != 1:
        raise PipelineError(f"{path}: legacy rank-5 input mapping (spec version <= 3) is not supported by the reference evaluator")
    scalers = {}
    for pre in nn.preprocessing:
        if pre.WhichOneof("preprocessor") != "scaler":
            raise PipelineError(f"{path}: preprocessing `{pre.WhichOneof('preprocessor')}` is not supported by the reference evaluator")
        name = pre.featureName or (spec.description.input[0].name if len(spec.description.input) == 1 else "")
        scalers[name] = pre.scaler
    inputs = []
    for desc in spec.description.input:
        t = desc.type.WhichOneof("Type")
        if t == "imageType":
            color = COLOR_SPACES.get(desc.type.imageType.colorSpace, "INVALID")
            if color == "INVALID":
                raise PipelineError(f"{path}: image input {desc.name!r} has no valid color space")
            channels = 3 if color in ("RGB", "BGR") else 1
            shape = (1, channels, desc.type.imageType.height, desc.type.imageType.width)  # RANK4_IMAGE_MAPPING
            inputs.append(InputInfo(desc.name, shape, color))
        elif t == "multiArrayType":
            inputs.append(InputInfo(desc.name, tuple(desc.type.multiArrayType.shape), None))
        else:
            raise PipelineError(f"{path}: input {desc.name!r} of type {t} is not supported by the reference evaluator")
    layer_weights, fp16 = [], False
    for layer in nn.layers:
        fields = _layer_weights(layer)
        fp16 = fp16 or any(_is_fp16(w) for w in fields.values())
        try:
            layer_weights.append({name: weights(w, quantized_count(layer, name)) for name, w in fields.items()})
        except PipelineError as e:
            raise PipelineError(f"{path}: layer `{layer.WhichOneof('layer')}` ({layer.name}): {e}") from None
    return NNModel(path, spec, inputs, [o.name for o in spec.description.output], scalers, layer_weights, fp16)


def _preprocess(x: torch.Tensor, info: InputInfo, scaler) -> torch.Tensor:
    """NeuralNetworkImageScaler: y = channelScale * x + the bias of each channel's colour, per the color space."""
    if scaler is None:
        return x
    if info.color_space == "RGB":
        bias = [scaler.redBias, scaler.greenBias, scaler.blueBias]
    elif info.color_space == "BGR":
        bias = [scaler.blueBias, scaler.greenBias, scaler.redBias]
    else:
        bias = [scaler.grayBias]
    return x * scaler.channelScale + torch.tensor(bias, dtype=torch.float32).reshape(1, -1, 1, 1)


def run_network(model: NNModel, feeds: dict[str, torch.Tensor], compute: str | None = None) -> dict[str, torch.Tensor]:
    """Execute the layers in order. Image feeds are already laid out by `image_input`; preprocessing runs here."""
    compute = compute or model.default_compute
    if compute not in ("fp32", "fp16"):
        raise PipelineError(f"compute must be fp32 or fp16, got {compute!r}")
    blobs: dict[str, torch.Tensor] = {}
    for info in model.inputs:
        if info.name not in feeds:
            raise PipelineError(f"{model.path.name}: missing input {info.name!r}")
        x = torch.as_tensor(feeds[info.name]).to(torch.float32)
        if info.color_space is not None:
            x = _preprocess(x.reshape(info.shape), info, model.scalers.get(info.name))
        blobs[info.name] = x.half().float() if compute == "fp16" else x
    for layer, w in zip(model.spec.neuralNetwork.layers, model.layer_weights):
        kind = layer.WhichOneof("layer")
        fn = NN_LAYERS.get(kind)
        where = f"{model.path.name}: layer `{kind}` ({layer.name})"
        if fn is None:
            raise PipelineError(f"{where} is not supported by the reference evaluator, so this model cannot be "
                                f"checked; add it to export/nn_eval.NN_LAYERS with a test")
        missing = [n for n in layer.input if n not in blobs]
        if missing:
            raise PipelineError(f"{where} reads {missing[0]!r}, which no earlier layer or input produces")
        results = call_checked(where, len(layer.output), lambda: fn(getattr(layer, kind), [blobs[n] for n in layer.input], w))
        for name, value in zip(layer.output, results):
            value = value.to(torch.float32)
            blobs[name] = value.half().float() if compute == "fp16" else value
    missing = [o for o in model.outputs if o not in blobs]
    if missing:
        raise PipelineError(f"{model.path.name}: output {missing[0]!r} is produced by no layer")
    return {o: blobs[o] for o in model.outputs}


def predict_images(model: NNModel, images: torch.Tensor, output: str | None = None, compute: str | None = None) -> np.ndarray:
    """Images N x 3 x H x W RGB 0..255, one at a time as an app calls Core ML -> N x D float32."""
    info, name = image_io(model, output)
    if len(images) == 0:
        return np.zeros((0, 0), np.float32)
    laid_out = torch.stack([image_input(img, info) for img in images])
    out = batched(lambda x: run_network(model, {info.name: x}, compute)[name], laid_out)
    return out.reshape(len(images), -1).numpy()
