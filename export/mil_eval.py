"""Run a saved ML Program (.mlpackage) anywhere, op by op, with PyTorch: the Core ML check that works on Linux.

coremltools converts on every OS but predicts only on macOS, so a wrong channel order, a lost normalisation or a
broken op would otherwise ship unchecked. This evaluator loads the program back with coremltools' own milproto
loader (weights read from the package's blob file) and executes every op with a torch function from `MIL_OPS`.

What it reproduces exactly, because that is where export bugs live:
- the image input: Core ML hands the program the picture's pixels 0..255 as float in the order the model's
  description declares (RGB, BGR, or one gray channel); `image_input` does the same from an RGB picture. The
  ImageType scale/bias are ops inside the program (coremltools inserts them), so they run like any other op.
- fp16: a tensor the program declares fp16 is computed in fp32 and rounded to fp16 after every op, which is how
  Core ML stores it; fp16 weights are used as stored. Kernels that accumulate in fp16 (GPU/ANE) differ by more
  rounding than this; only the real runtime on a Mac measures that (`core.coreml_runtime`).
An op without an entry in `MIL_OPS` is an error that names it; the evaluator never skips or guesses. After every
op the result is checked against the shape the program declares, so an evaluator bug cannot pass silently either.
Each image is its own prediction (batch 1, as Vision calls Core ML), vectorised over images with torch.vmap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from core.quiet import import_coremltools
from core.errors import PipelineError

COLOR_SPACES = {10: "GRAYSCALE", 20: "RGB", 30: "BGR", 40: "GRAYSCALE_FLOAT16"}  # ImageFeatureType.ColorSpace


# ---------------------------------------------------------------- kernels shared with the NeuralNetwork evaluator

def same_pads(in_sizes, kernel, strides, dilations, lower: bool = False) -> list[tuple[int, int]]:
    """TF-style "same": output = ceil(in / stride); an odd total puts the extra row at the end (start if lower)."""
    pads = []
    for i, k, s, d in zip(in_sizes, kernel, strides, dilations):
        total = max(0, (math.ceil(i / s) - 1) * s + (k - 1) * d + 1 - i)
        small, big = total // 2, total - total // 2
        pads.append((big, small) if lower else (small, big))
    return pads


def pad_spatial(x: torch.Tensor, pads: list[tuple[int, int]], value: float = 0.0) -> torch.Tensor:
    """Pad the trailing len(pads) dims; a negative amount crops (F.pad's own convention)."""
    flat = [a for before, after in reversed(pads) for a in (before, after)]
    if not any(flat):
        return x
    return F.pad(x, flat, value=value)


def conv_nd(x, weight, bias, strides, pads, dilations, groups) -> torch.Tensor:
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[weight.dim() - 2]
    if all(a == b for a, b in pads):  # symmetric: the conv pads itself, without a padded copy of the input
        return fn(x, weight, bias, stride=list(strides), padding=[a for a, _ in pads], dilation=list(dilations),
                  groups=int(groups))
    return fn(pad_spatial(x, pads), weight, bias, stride=list(strides), dilation=list(dilations), groups=int(groups))


def pool_out_size(n: int, k: int, s: int, pad: tuple[int, int], ceil_mode: bool) -> int:
    """MIL's rule: floor, or ceil with the last window dropped when it would start inside the right padding."""
    if not ceil_mode:
        return (n + pad[0] + pad[1] - k) // s + 1
    out = (n + pad[0] + pad[1] - k + s - 1) // s + 1
    if (out - 1) * s >= n + pad[0] and (pad[0] > 0 or pad[1] > 0):
        out -= 1
    return out


def pool_nd(x, kind: str, kernel, strides, pads, out_sizes, exclude_padding: bool) -> torch.Tensor:
    """Max/average pooling on the trailing len(kernel) dims with explicit pads and output sizes.

    The input is padded to exactly the extent the output windows need: declared padding counts in an average
    unless excluded; windows reaching past it (ceil mode) only ever see the real pixels, as in Core ML and torch.
    """
    nd = len(kernel)
    lead = x.shape[:-nd]
    x = x.reshape(-1, 1, *x.shape[-nd:])
    extra = [((o - 1) * s + k) - (n + p[0] + p[1]) for n, k, s, p, o in zip(x.shape[2:], kernel, strides, pads, out_sizes)]
    if kind == "max":
        xp = pad_spatial(pad_spatial(x, pads, -math.inf), [(0, e) for e in extra], -math.inf)
        y = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd](xp, list(kernel), list(strides))
    else:
        avg = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
        area = float(np.prod(kernel))
        xp = pad_spatial(pad_spatial(x, pads, 0.0), [(0, e) for e in extra], 0.0)
        ones = torch.ones(1, 1, *x.shape[2:], dtype=x.dtype)
        mask = pad_spatial(pad_spatial(ones, pads, 0.0 if exclude_padding else 1.0), [(0, e) for e in extra], 0.0)
        y = avg(xp, list(kernel), list(strides)) * area / (avg(mask, list(kernel), list(strides)) * area)
    return y.reshape(*lead, *y.shape[-nd:])


def sample_grid(n_in: int, n_out: int, mode: str) -> torch.Tensor:
    """Source coordinates of a linear resize, per MIL's resize_bilinear sampling modes (iOS15 op docs)."""
    i = torch.arange(n_out, dtype=torch.float64)
    if mode in ("STRICT_ALIGN_CORNERS", "ALIGN_CORNERS"):
        if n_out == 1:
            g = torch.full((1,), (n_in - 1) / 2 if mode == "ALIGN_CORNERS" else 0.0, dtype=torch.float64)
        else:
            g = i * (n_in - 1) / (n_out - 1)
    elif mode == "DEFAULT":
        g = i * n_in / n_out
    elif mode == "OFFSET_CORNERS":
        delta = max(1, n_in - 1) / n_out
        g = 0.5 * delta + i * delta
    elif mode == "UNALIGN_CORNERS":
        g = (i + 0.5) * n_in / n_out - 0.5
    else:
        raise PipelineError(f"resize: unknown sampling mode {mode!r}")
    return g.clamp(0, n_in - 1)


def resample_linear(x: torch.Tensor, axis: int, grid: torch.Tensor) -> torch.Tensor:
    """Linear interpolation of x along one axis at fractional source coordinates `grid`."""
    n = x.shape[axis]
    lo = grid.floor().long().clamp(0, n - 1)
    hi = (lo + 1).clamp(max=n - 1)
    w = (grid - lo).to(x.dtype)
    shape = [1] * x.dim()
    shape[axis] = -1
    w = w.reshape(shape)
    return x.index_select(axis, lo) * (1 - w) + x.index_select(axis, hi) * w


def resize_linear(x: torch.Tensor, sizes, mode: str) -> torch.Tensor:
    """Resize the trailing len(sizes) dims, one axis after the other (bilinear is separable)."""
    for j, n_out in enumerate(sizes):
        axis = x.dim() - len(sizes) + j
        x = resample_linear(x, axis, sample_grid(x.shape[axis], int(n_out), mode))
    return x


def batched(fn, xs: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """fn(one item of xs) for every item, stacked. Vectorised with torch.vmap, since a CPU convolves a batch an
    order of magnitude faster than the same images one by one; each item still sees exactly its own tensors, as
    Core ML's one-image predictions do. Where vmap cannot batch an op, the items run one at a time."""
    outs = []
    with torch.no_grad():
        for i in range(0, len(xs), chunk):
            part = xs[i: i + chunk]
            try:
                outs.append(torch.vmap(fn)(part))
            except (RuntimeError, PipelineError):  # no batching rule for some op: the plain loop is the semantics
                outs.append(torch.stack([fn(x) for x in part]))
    return torch.cat(outs)


# ---------------------------------------------------------------- reading op arguments

def _ints(v) -> list[int]:
    return [int(a) for a in torch.as_tensor(v).flatten().tolist()]


def _float(v) -> float:
    return float(torch.as_tensor(v).item())


def _bool(v) -> bool:
    return bool(torch.as_tensor(v).item())


def _axes(v, rank: int) -> list[int]:
    return sorted(a % rank for a in _ints(v)) if rank else []


# ---------------------------------------------------------------- the ops
# Each takes (args, op): args maps the op's input names to tensors (or str / list of tensors), including every
# default the op definition fills in; an input absent from args is optional and unset. op is the pymil Operation
# (only its type is read, for messages). Output dtypes and shapes are applied and checked by the caller.

def _conv(a, op):
    w = a["weight"]
    nd = w.dim() - 2
    strides = _ints(a["strides"]) if "strides" in a else [1] * nd
    dil = _ints(a["dilations"]) if "dilations" in a else [1] * nd
    pad_type = a.get("pad_type", "valid")
    if pad_type == "custom":
        p = _ints(a["pad"])
        pads = [(p[2 * i], p[2 * i + 1]) for i in range(nd)]
    elif pad_type in ("same", "same_lower"):
        pads = same_pads(a["x"].shape[-nd:], w.shape[2:], strides, dil, lower=pad_type == "same_lower")
    elif pad_type == "valid":
        pads = [(0, 0)] * nd
    else:
        raise PipelineError(f"conv: unknown pad_type {pad_type!r}")
    groups = _ints(a["groups"])[0] if "groups" in a else 1
    return conv_nd(a["x"], w, a.get("bias"), strides, pads, dil, groups)


def _pool(kind):
    def run(a, op):
        kernel = _ints(a["kernel_sizes"])
        nd = len(kernel)
        strides = _ints(a["strides"]) if "strides" in a else [1] * nd
        pad_type = a["pad_type"]
        if pad_type == "custom":
            p = _ints(a["pad"])
            pads = [(p[2 * i], p[2 * i + 1]) for i in range(nd)]
        elif pad_type in ("same", "same_lower"):
            pads = same_pads(a["x"].shape[-nd:], kernel, strides, [1] * nd, lower=pad_type == "same_lower")
        elif pad_type == "valid":
            pads = [(0, 0)] * nd
        else:
            raise PipelineError(f"{op.op_type}: unknown pad_type {pad_type!r}")
        ceil_mode = _bool(a["ceil_mode"]) if "ceil_mode" in a else False
        outs = [pool_out_size(n, k, s, p, ceil_mode) for n, k, s, p in zip(a["x"].shape[-nd:], kernel, strides, pads)]
        exclude = _bool(a["exclude_padding_from_average"]) if "exclude_padding_from_average" in a else False
        return pool_nd(a["x"], kind, kernel, strides, pads, outs, exclude)

    return run


def _reduce(fn):
    def run(a, op):
        x = a["x"]
        keep = _bool(a["keep_dims"]) if "keep_dims" in a else False
        axes = _axes(a["axes"], x.dim()) if a.get("axes") is not None else list(range(x.dim()))
        if not axes:
            return x
        return fn(x, axes, keep)

    return run


def _reduce_max(x, axes, keep):
    for ax in sorted(axes, reverse=True):
        x = x.amax(dim=ax, keepdim=keep)
    return x


def _reduce_min(x, axes, keep):
    for ax in sorted(axes, reverse=True):
        x = x.amin(dim=ax, keepdim=keep)
    return x


def _batch_norm(a, op):
    x = a["x"]
    shape = [1, -1] + [1] * (x.dim() - 2)
    y = (x - a["mean"].reshape(shape)) / torch.sqrt(a["variance"].reshape(shape) + _float(a.get("epsilon", 1e-5)))
    if a.get("gamma") is not None:
        y = y * a["gamma"].reshape(shape)
    if a.get("beta") is not None:
        y = y + a["beta"].reshape(shape)
    return y


def _l2_norm(a, op):
    x = a["x"]
    dims = list(range(x.dim() - 3, x.dim()))  # MIL: the last three dims, leading dims are batch
    return x / torch.sqrt((x * x).sum(dim=dims, keepdim=True) + _float(a.get("epsilon", 1e-6)))


def _matmul(a, op):
    x, y = a["x"], a["y"]
    if _bool(a.get("transpose_x", False)) and x.dim() >= 2:
        x = x.transpose(-1, -2)
    if _bool(a.get("transpose_y", False)) and y.dim() >= 2:
        y = y.transpose(-1, -2)
    return torch.matmul(x, y)


def _linear(a, op):
    return F.linear(a["x"], a["weight"], a.get("bias"))


def _reshape(a, op):
    x = a["x"]
    shape = _ints(a["shape"])
    if len(shape) == x.dim():  # MIL: 0 copies the input's dim only when the ranks match
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return x.reshape(shape)


def _squeeze(a, op):
    x = a["x"]
    if a.get("axes") is None:
        return x.reshape([d for d in x.shape if d != 1])
    axes = _axes(a["axes"], x.dim())
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _expand_dims(a, op):
    x = a["x"]
    out_rank = x.dim() + len(_ints(a["axes"]))
    for ax in sorted(a_ % out_rank for a_ in _ints(a["axes"])):
        x = x.unsqueeze(ax)
    return x


def _concat(a, op):
    values, axis = list(a["values"]), _ints(a["axis"])[0]
    if _bool(a.get("interleave", False)):
        axis = axis % values[0].dim()
        stacked = torch.stack(values, dim=axis + 1)
        shape = list(values[0].shape)
        shape[axis] *= len(values)
        return stacked.reshape(shape)
    return torch.cat(values, dim=axis)


def _split(a, op):
    x, axis = a["x"], _ints(a["axis"])[0]
    if a.get("split_sizes") is not None:
        sizes = _ints(a["split_sizes"])
    else:
        n = _ints(a["num_splits"])[0]
        sizes = [x.shape[axis] // n] * n
    return tuple(torch.split(x, sizes, dim=axis))


def _slice_by_index(a, op):
    x = a["x"]
    rank = x.dim()
    begin, end = _ints(a["begin"]), _ints(a["end"])
    stride = _ints(a["stride"]) if a.get("stride") is not None else [1] * rank
    bmask = _ints(a["begin_mask"]) if a.get("begin_mask") is not None else [0] * rank
    emask = _ints(a["end_mask"]) if a.get("end_mask") is not None else [0] * rank
    smask = _ints(a["squeeze_mask"]) if a.get("squeeze_mask") is not None else [0] * rank
    for d in range(rank):  # python slice semantics, as MIL's own value inference uses
        if smask[d]:
            idx = [begin[d] % x.shape[d]]
        else:
            idx = range(x.shape[d])[slice(None if bmask[d] else begin[d], None if emask[d] else end[d], stride[d])]
        x = x.index_select(d, torch.as_tensor(list(idx), dtype=torch.long))
    return x.reshape([n for d, n in enumerate(x.shape) if not smask[d]])


def _slice_by_size(a, op):
    x = a["x"]
    begin, size = _ints(a["begin"]), _ints(a["size"])
    for d in range(x.dim()):
        b = begin[d] % x.shape[d] if x.shape[d] else 0
        x = x.narrow(d, b, x.shape[d] - b if size[d] == -1 else size[d])
    return x


def _gather(a, op):
    x, idx = a["x"], a["indices"].long()
    if a.get("batch_dims") is not None and _ints(a["batch_dims"])[0] != 0:
        raise PipelineError("gather with batch_dims > 0 is not supported by the reference evaluator")
    axis = _ints(a.get("axis", 0))[0] % x.dim()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    out = x.index_select(axis, idx.flatten())
    return out.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1:])


def _crop(a, op):
    x = a["x"]
    t, b = _ints(a["crop_height"])
    l, r = _ints(a["crop_width"])
    return x[..., t: x.shape[-2] - b, l: x.shape[-1] - r]


def _cast(a, op):
    return a["x"]  # the declared output dtype does the conversion (see _as_declared)


def _upsample_bilinear(a, op):
    x = a["x"]
    sh, sw = _float(a.get("scale_factor_height", 1)), _float(a.get("scale_factor_width", 1))
    out_h, out_w = int(math.floor(x.shape[-2] * sh)), int(math.floor(x.shape[-1] * sw))
    align = _bool(a.get("align_corners", True))
    half = _bool(a["half_pixel_centers"]) if a.get("half_pixel_centers") is not None else not align
    mode = "STRICT_ALIGN_CORNERS" if align else ("UNALIGN_CORNERS" if half else "DEFAULT")
    return resize_linear(x, [out_h, out_w], mode)


def _resize_bilinear(a, op):
    sizes = [_ints(a.get("target_size_height", 1))[0], _ints(a.get("target_size_width", 1))[0]]
    return resize_linear(a["x"], sizes, a.get("sampling_mode", "DEFAULT"))


def _resize(a, op):
    x = a["x"]
    if a.get("interpolation_mode", "LINEAR") != "LINEAR":
        raise PipelineError(f"resize with interpolation_mode {a['interpolation_mode']} is not supported by the reference evaluator")
    shape, k = _ints(a["shape"]), _ints(a["resized_dims"])[0]
    sizes = [s if s != 0 else x.shape[x.dim() - k + i] for i, s in enumerate(shape[len(shape) - k:])]
    return resize_linear(x, sizes, a.get("sampling_mode", "DEFAULT"))


def _binary(fn):
    return lambda a, op: fn(a["x"], a["y"])


def _unary(fn):
    return lambda a, op: fn(a["x"])


def _eps(fn, default):
    return lambda a, op: fn(a["x"], _float(a.get("epsilon", default)))


def _clip(a, op):
    return a["x"].clamp(_float(a["alpha"]), _float(a["beta"]))


def _select(a, op):
    return torch.where(a["cond"].bool(), a["a"], a["b"])


def _tile(a, op):
    return a["x"].repeat(_ints(a["reps"]))


def _transpose(a, op):
    return a["x"].permute(_ints(a["perm"]))


def _leaky_relu(a, op):
    return F.leaky_relu(a["x"], _float(a.get("alpha", 0.01)))


def _thresholded_relu(a, op):
    """x where x >= alpha, else 0 (hardswish converts to thresholded_relu(-3), sigmoid_hard(1/6, 1/2), mul)."""
    x = a["x"]
    return torch.where(x >= _float(a.get("alpha", 1.0)), x, torch.zeros_like(x))


def _sigmoid_hard(a, op):
    return (_float(a.get("alpha", 0.2)) * a["x"] + _float(a.get("beta", 0.5))).clamp(0.0, 1.0)


def gelu(x: torch.Tensor, mode: str) -> torch.Tensor:
    """The three GELU forms both Core ML formats define (MIL gelu's mode, NeuralNetwork GeluLayerParams)."""
    if mode == "EXACT":
        return F.gelu(x)
    if mode == "TANH_APPROXIMATION":
        return F.gelu(x, approximate="tanh")
    if mode == "SIGMOID_APPROXIMATION":
        return x * torch.sigmoid(1.702 * x)
    raise PipelineError(f"gelu: unknown mode {mode!r}")


def _layer_norm(a, op):
    """gamma * (x - E[x]) / sqrt(Var[x] + epsilon) + beta over `axes` (biased variance; MIL's default: all)."""
    x = a["x"]
    axes = _axes(a["axes"], x.dim()) if a.get("axes") is not None else list(range(x.dim()))
    mean = x.mean(dim=axes, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
    y = (x - mean) / torch.sqrt(var + _float(a.get("epsilon", 1e-5)))
    shape = [n if d in axes else 1 for d, n in enumerate(x.shape)]  # gamma and beta are shaped x.shape[axes]
    if a.get("gamma") is not None:
        y = y * a["gamma"].reshape(shape)
    if a.get("beta") is not None:
        y = y + a["beta"].reshape(shape)
    return y


def _softmax(a, op):
    return torch.softmax(a["x"], dim=_ints(a.get("axis", -1))[0])


MIL_OPS: dict[str, Callable[[dict, Any], Any]] = {
    # convolution, pooling, normalisation, linear algebra
    "conv": _conv,
    "max_pool": _pool("max"),
    "avg_pool": _pool("avg"),
    "batch_norm": _batch_norm,
    "layer_norm": _layer_norm,
    "l2_norm": _l2_norm,
    "matmul": _matmul,
    "linear": _linear,
    # elementwise binary (numpy broadcasting, as MIL)
    "add": _binary(torch.add),
    "sub": _binary(torch.sub),
    "mul": _binary(torch.mul),
    "real_div": _binary(torch.div),
    "floor_div": _binary(lambda x, y: torch.floor(x / y)),
    "pow": _binary(torch.pow),
    "maximum": _binary(torch.maximum),
    "minimum": _binary(torch.minimum),
    "equal": _binary(torch.eq),
    "not_equal": _binary(torch.ne),
    "greater": _binary(torch.gt),
    "greater_equal": _binary(torch.ge),
    "less": _binary(torch.lt),
    "less_equal": _binary(torch.le),
    "logical_and": _binary(lambda x, y: x.bool() & y.bool()),
    "logical_or": _binary(lambda x, y: x.bool() | y.bool()),
    "logical_xor": _binary(lambda x, y: x.bool() ^ y.bool()),
    "logical_not": _unary(lambda x: ~x.bool()),
    "select": _select,
    # elementwise unary and activations
    "relu": _unary(torch.relu),
    "leaky_relu": _leaky_relu,
    "sigmoid": _unary(torch.sigmoid),
    "sigmoid_hard": _sigmoid_hard,
    "thresholded_relu": _thresholded_relu,
    "silu": _unary(F.silu),
    "gelu": lambda a, op: gelu(a["x"], a.get("mode", "EXACT")),
    "softmax": _softmax,
    "tanh": _unary(torch.tanh),
    "clip": _clip,
    "abs": _unary(torch.abs),
    "sign": _unary(torch.sign),
    "floor": _unary(torch.floor),
    "ceil": _unary(torch.ceil),
    "round": _unary(torch.round),  # half to even, as MIL's value inference (np.round)
    "sqrt": _unary(torch.sqrt),
    "square": _unary(torch.square),
    "exp": _unary(torch.exp),
    "rsqrt": _eps(lambda x, e: torch.rsqrt(x + e), 1e-12),
    "inverse": _eps(lambda x, e: 1.0 / (x + e), 1e-4),
    "log": _eps(lambda x, e: torch.log(x + e), 1e-45),
    "cast": _cast,
    # reductions
    "reduce_mean": _reduce(lambda x, ax, k: x.mean(dim=ax, keepdim=k)),
    "reduce_sum": _reduce(lambda x, ax, k: x.sum(dim=ax, keepdim=k)),
    "reduce_max": _reduce(_reduce_max),
    "reduce_min": _reduce(_reduce_min),
    "reduce_sum_square": _reduce(lambda x, ax, k: (x * x).sum(dim=ax, keepdim=k)),
    "reduce_l2_norm": _reduce(lambda x, ax, k: torch.sqrt((x * x).sum(dim=ax, keepdim=k))),
    # shapes and indexing
    "reshape": _reshape,
    "transpose": _transpose,
    "squeeze": _squeeze,
    "expand_dims": _expand_dims,
    "concat": _concat,
    "split": _split,
    "slice_by_index": _slice_by_index,
    "slice_by_size": _slice_by_size,
    "gather": _gather,
    "tile": _tile,
    "crop": _crop,
    "identity": _unary(lambda x: x),
    # resampling
    "upsample_bilinear": _upsample_bilinear,
    "resize_bilinear": _resize_bilinear,
    "resize": _resize,
}


# ---------------------------------------------------------------- compressed weights (the constexpr ops)
# A compressed weight is a `constexpr_*` op on const inputs in place of a `const` (coremltools.optimize.coreml
# writes them: export/compression.py). Core ML decompresses them once, at load; so does `load_mlpackage`, with
# these functions written from the op definitions (iOS16 and iOS18 op sets), never with coremltools' own
# decompression, which is what tests/export/test_mil_compressed.py holds them to.

def unpack_bits(packed: torch.Tensor, nbits: int, count: int) -> torch.Tensor:
    """`count` n-bit unsigned fields from bytes packed LSB first (the iOS16 ops' layout: an index that straddles
    two bytes has its low bits in the first)."""
    bits = (packed.long().reshape(-1, 1) >> torch.arange(8)) & 1
    fields = bits.reshape(-1)[: count * nbits].reshape(count, nbits)
    return (fields << torch.arange(nbits)).sum(dim=1)


def _along(v: torch.Tensor, axis: int, rank: int) -> torch.Tensor:
    """A scalar or a vector laid along `axis` of a rank-`rank` tensor (affine_dequantize's broadcast rule)."""
    if v.dim() == 0:
        return v
    shape = [1] * rank
    shape[axis] = -1
    return v.reshape(shape)


def _affine_dequantize(a, op):
    """iOS16: scale * (quantized_data - zero_point), scale and zero_point scalars or vectors along `axis`."""
    q = a["quantized_data"]
    axis = _ints(a["axis"])[0] % q.dim()
    return (q.float() - _along(a["zero_point"].float(), axis, q.dim())) * _along(a["scale"], axis, q.dim())


def _per_block(v: torch.Tensor, shape) -> torch.Tensor:
    """A per-block parameter (one value per block of data.shape / v.shape) repeated to data's shape."""
    for d, (n, m) in enumerate(zip(shape, v.shape)):
        if n % m:
            raise PipelineError(f"block parameter of shape {tuple(v.shape)} does not tile data of shape {tuple(shape)}")
        v = v.repeat_interleave(n // m, dim=d)
    return v


def _blockwise_shift_scale(a, op):
    """iOS18: scale * (data - offset), one scale (and offset) per block; the block is data.shape / scale.shape."""
    data = a["data"].float()
    if a.get("offset") is not None:
        data = data - _per_block(a["offset"].float(), data.shape)
    return data * _per_block(a["scale"], data.shape)


def _lut_to_dense(a, op):
    """Palettized weights. iOS16: `indices` are n-bit fields packed in bytes, one LUT of 2^n values for the tensor,
    `shape` the output's. iOS18: `indices` unpacked, shaped as the output; the LUT's leading dims say how many
    tables tile each axis (per grouped channel), its last dim is a vector of VECTOR_SIZE values laid along
    `vector_axis`."""
    lut = a["lut"]
    if a.get("shape") is not None:
        shape = _ints(a["shape"])
        nbits = int(round(math.log2(lut.numel())))
        return lut.reshape(-1)[unpack_bits(a["indices"], nbits, int(np.prod(shape)))].reshape(shape)
    idx = a["indices"].long()
    shape, groups, vector = list(idx.shape), list(lut.shape[:-2]), lut.shape[-1]
    gid = torch.zeros(shape, dtype=torch.long)
    for d, (n, g) in enumerate(zip(shape, groups)):  # which table each element reads, row-major over the tables
        if n % g:
            raise PipelineError(f"LUT of shape {tuple(lut.shape)} does not tile indices of shape {tuple(shape)}")
        along = [1] * len(shape)
        along[d] = n
        gid = gid * g + (torch.arange(n) // (n // g)).reshape(along)
    out = lut.reshape(-1, lut.shape[-2], vector)[gid, idx]  # shape + [vector]
    if vector == 1:
        return out.squeeze(-1)
    axis = _ints(a["vector_axis"])[0] % len(shape)
    shape[axis] *= vector
    return out.movedim(-1, axis + 1).reshape(shape)


def _sparse_to_dense(a, op):
    """Pruned weights: zeros, with `nonzero_data` written in row-major order where the mask is set. iOS16: the mask
    is bits packed LSB first and `shape` the output's; iOS18: the mask is a uint1 tensor of the output's shape."""
    values = a["nonzero_data"].float()
    if a.get("shape") is not None:
        shape = _ints(a["shape"])
        mask = unpack_bits(a["mask"], 1, int(np.prod(shape))).reshape(shape)
    else:
        mask = a["mask"]
    mask = mask != 0
    if int(mask.sum()) != values.numel():
        raise PipelineError(f"the mask sets {int(mask.sum())} values, nonzero_data holds {values.numel()}")
    out = torch.zeros(mask.shape, dtype=values.dtype)
    out[mask] = values
    return out


CONSTEXPR_OPS: dict[str, Callable[[dict, Any], Any]] = {
    "constexpr_affine_dequantize": _affine_dequantize,  # iOS16: linear 8-bit
    "constexpr_blockwise_shift_scale": _blockwise_shift_scale,  # iOS18: linear 8/4-bit, per channel or block
    "constexpr_lut_to_dense": _lut_to_dense,  # palettized, both op sets
    "constexpr_sparse_to_dense": _sparse_to_dense,  # pruned, both op sets
}


# ---------------------------------------------------------------- loading and running a program

@dataclass
class InputInfo:
    name: str
    shape: tuple[int, ...]
    color_space: str | None  # None for a plain tensor input


@dataclass
class MilModel:
    path: Path
    function: Any  # the pymil Function "main"
    inputs: list[InputInfo]
    outputs: list[str]
    consts: dict[str, Any] = field(default_factory=dict)  # var name -> value, converted once at load

    @property
    def precision(self) -> str:
        """fp16 if any op computes in fp16 (what the gates care about), else fp32."""
        return "fp16" if any(_dtype(v) == "fp16" for op in self.function.operations
                             if op.op_type != "const" and not op.op_type.startswith("constexpr_")
                             for v in op.outputs) else "fp32"


def _dtype(var) -> str:
    from coremltools.converters.mil.mil import types

    return types.builtin_to_string(var.dtype)


def _const_value(var):
    val = var.val
    if isinstance(val, str):
        return val
    dt = _dtype(var)
    arr = np.asarray(val)
    if dt == "bool":
        return torch.from_numpy(arr.astype(bool))
    if dt.startswith("int") or dt.startswith("uint"):
        return torch.from_numpy(arr.astype(np.int64))
    return torch.from_numpy(arr.astype(np.float32))  # fp16 weights widen exactly


def _as_declared(value, var, where: str):
    """Store an op result as the program declares it: fp16 rounded, ints as int64, and the shape checked."""
    if not torch.is_tensor(value):
        value = torch.as_tensor(value)
    dt = _dtype(var)
    if dt == "fp16":
        value = value.to(torch.float32).half().float()
    elif dt in ("fp32", "fp64"):
        value = value.to(torch.float32)
    elif dt == "bool":
        value = value.bool() if value.dtype == torch.bool else value != 0
    elif dt.startswith("int") or dt.startswith("uint"):
        value = value.to(torch.int64)  # float -> int truncates toward zero, as MIL's cast
    else:
        raise PipelineError(f"{where}: output type {dt} is not supported by the reference evaluator")
    declared = getattr(var, "shape", None)
    if declared is not None and all(isinstance(d, (int, np.integer)) for d in declared):
        if tuple(value.shape) != tuple(int(d) for d in declared):
            raise PipelineError(f"{where}: evaluator produced shape {tuple(value.shape)}, the program declares "
                                f"{tuple(declared)} (an evaluator bug: the model cannot be checked)")
    return value


def load_mlpackage(path: Path | str) -> MilModel:
    """Read an .mlpackage's program with coremltools' milproto loader. One-line errors for anything unreadable."""
    ct = import_coremltools()
    from coremltools.converters.mil.frontend.milproto.load import load as load_milproto

    path = Path(path)
    if not path.is_dir() or not (path / "Manifest.json").is_file():
        raise PipelineError(f"{path} is not an .mlpackage (no Manifest.json): re-run `pipeline export`")
    try:
        spec = ct.utils.load_spec(str(path))
    except Exception as e:
        raise PipelineError(f"{path}: the model spec is unreadable ({type(e).__name__}): re-run `pipeline export`") from None
    if spec.WhichOneof("Type") != "mlProgram":
        raise PipelineError(f"{path} holds a {spec.WhichOneof('Type')} model, not an ML Program")
    weights = path / "Data" / "com.apple.CoreML" / "weights"
    try:
        prog = load_milproto(spec, spec.specificationVersion, file_weights_dir=str(weights))
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else ""
        raise PipelineError(f"{path}: the program cannot be loaded back ({type(e).__name__}: {msg})") from None
    if "main" not in prog.functions:
        raise PipelineError(f"{path}: the program has no `main` function")
    func = prog.functions["main"]
    inputs = []
    for desc in spec.description.input:
        if desc.name not in func.inputs:
            raise PipelineError(f"{path}: input {desc.name!r} of the description is not an input of the program")
        color = COLOR_SPACES.get(desc.type.imageType.colorSpace, "INVALID") if desc.type.WhichOneof("Type") == "imageType" else None
        if color == "INVALID":
            raise PipelineError(f"{path}: image input {desc.name!r} has no valid color space")
        shape = func.inputs[desc.name].shape
        if not all(isinstance(d, (int, np.integer)) for d in shape):
            raise PipelineError(f"{path}: input {desc.name!r} has a flexible shape {shape}; the reference evaluator "
                                f"runs fixed-shape programs only")
        inputs.append(InputInfo(desc.name, tuple(int(d) for d in shape), color))
    model = MilModel(path, func, inputs, [v.name for v in func.outputs])
    for op in func.operations:
        if op.op_type == "const":
            model.consts[op.outputs[0].name] = _const_value(op.outputs[0])
    for op in func.operations:  # compressed weights: decompressed once, as Core ML does at load
        if op.op_type.startswith("constexpr_"):
            model.consts.update(decompress(op, model.consts, path.name))
    return model


def decompress(op, consts: dict[str, Any], where: str) -> dict[str, torch.Tensor]:
    """{output name: value} of one constexpr op on already-known const inputs, stored as the program declares."""
    fn = CONSTEXPR_OPS.get(op.op_type)
    if fn is None:
        raise PipelineError(f"{where}: op `{op.op_type}` ({op.name}) is not supported by the reference evaluator, so "
                            f"this model cannot be checked; add it to export/mil_eval.CONSTEXPR_OPS with a test")
    args = {key: consts[v.name] for key, v in op.inputs.items()}
    label = f"{where}: op `{op.op_type}` ({op.name})"
    results = call_checked(label, len(op.outputs), lambda: fn(args, op))
    return {var.name: _as_declared(val, var, label) for var, val in zip(op.outputs, results)}


def image_input(rgb: torch.Tensor, info: InputInfo) -> torch.Tensor:
    """What Core ML hands the program for an RGB picture (3 x H x W, 0..255): its pixels as float, in the channel
    order of the model's color space. A gray model needs a 1-channel picture: Core ML's own RGB->gray conversion
    is not emulated, so it is refused rather than guessed."""
    rgb = rgb.to(torch.float32)
    if rgb.dim() == 4 and rgb.shape[0] == 1:
        rgb = rgb[0]
    if info.color_space == "RGB":
        chw = rgb
    elif info.color_space == "BGR":
        chw = rgb.flip(0)
    elif rgb.shape[0] == 1:
        chw = rgb
    else:
        raise PipelineError(f"input {info.name!r} is a {info.color_space} image: pass 1-channel pictures")
    if chw.shape[0] != 3 and info.color_space in ("RGB", "BGR"):
        raise PipelineError(f"input {info.name!r} is an {info.color_space} image: pass 3-channel pictures, got {chw.shape[0]}")
    h, w = info.shape[-2], info.shape[-1]
    if tuple(chw.shape[-2:]) != (h, w):
        raise PipelineError(f"input {info.name!r} takes {w}x{h} images; got {chw.shape[-1]}x{chw.shape[-2]} "
                            f"(resize/crop before predicting, as an app does)")
    return chw.reshape(info.shape)


def run_program(model: MilModel, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Execute `main` op by op. `feeds` are the program's input tensors (images already laid out, see
    `image_input`). Returns every program output as the program declares it (fp16 outputs rounded)."""
    env: dict[str, Any] = dict(model.consts)
    for var_name, var in model.function.inputs.items():
        if var_name not in feeds:
            raise PipelineError(f"{model.path.name}: missing input {var_name!r}")
        env[var_name] = _as_declared(torch.as_tensor(feeds[var_name]), var, f"{model.path.name} input {var_name!r}")
    for op in model.function.operations:
        if op.op_type == "const" or op.op_type.startswith("constexpr_"):  # in env already (load_mlpackage)
            continue
        fn = MIL_OPS.get(op.op_type)
        if fn is None:
            raise PipelineError(f"{model.path.name}: op `{op.op_type}` ({op.name}) is not supported by the reference "
                                f"evaluator, so this model cannot be checked; add it to export/mil_eval.MIL_OPS with a test")
        args = {}
        for key, v in op.inputs.items():
            args[key] = [env[u.name] for u in v] if isinstance(v, (tuple, list)) else env[v.name]
        where = f"{model.path.name}: op `{op.op_type}` ({op.name})"
        results = call_checked(where, len(op.outputs), lambda: fn(args, op))
        for var, val in zip(op.outputs, results):
            env[var.name] = _as_declared(val, var, f"{model.path.name}: op `{op.op_type}` ({op.name})")
    return {name: env[name] for name in model.outputs}


def call_checked(where: str, n_outputs: int, call: Callable[[], Any]) -> tuple:
    """Run one op or layer (both evaluators): any failure, or a wrong number of outputs, becomes a one-line error
    naming it, so a broken artifact is reported by op, never as a traceback."""
    try:
        result = call()
    except PipelineError as e:
        raise PipelineError(f"{where}: {e}") from None
    except (RuntimeError, ValueError, IndexError, TypeError, KeyError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PipelineError(f"{where} failed in the evaluator: {msg}") from None
    results = result if isinstance(result, tuple) else (result,)
    if len(results) != n_outputs:
        raise PipelineError(f"{where} gave {len(results)} outputs, expected {n_outputs}")
    return results


def image_io(model, output: str | None) -> tuple[InputInfo, str]:
    """The single image input and the chosen output (default: the first) of an ML Program or NeuralNetwork model."""
    image_inputs = [i for i in model.inputs if i.color_space is not None]
    if len(model.inputs) != 1 or not image_inputs:
        raise PipelineError(f"{model.path.name}: expected one image input, found {[i.name for i in model.inputs]}")
    name = output or model.outputs[0]
    if name not in model.outputs:
        raise PipelineError(f"{model.path.name}: no output {name!r} (outputs: {', '.join(model.outputs)})")
    return image_inputs[0], name


def predict_images(model: MilModel, images: torch.Tensor, output: str | None = None) -> np.ndarray:
    """Images N x 3 x H x W RGB 0..255 -> N x D float32 of the (single image input) model's output `output`
    (default: the first). Each image is its own prediction, as an app calls Core ML (see `batched`)."""
    info, name = image_io(model, output)
    if len(images) == 0:
        return np.zeros((0, 0), np.float32)
    laid_out = torch.stack([image_input(img, info) for img in images])
    out = batched(lambda x: run_program(model, {info.name: x})[name], laid_out)
    return out.reshape(len(images), -1).to(torch.float32).numpy()
