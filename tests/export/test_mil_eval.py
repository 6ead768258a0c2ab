"""The ML Program evaluator against torch: every registered op, the image input, fp16 rounding, real encoders.

Each op case is a MIL snippet (coremltools' `mb` builder) and an independent torch reference written from the op's
documented semantics. All cases live in one program so coremltools converts once; each case is still its own test.
The same cases, converted to a NeuralNetwork, test the layer evaluator (tests/export/test_nn_eval.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from export import mil_eval
from core.errors import PipelineError

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402

SHAPE = (1, 3, 8, 8)
_rng = np.random.default_rng(0)
W_CONV = _rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
W_DW = _rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
W_DIL = _rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
W_LIN = _rng.standard_normal((5, 8)).astype(np.float32)
B_LIN = _rng.standard_normal(5).astype(np.float32)
W_SE1 = _rng.standard_normal((2, 3, 1, 1)).astype(np.float32)  # squeeze-excitation: 3 -> 2 -> 3 channels
W_SE2 = _rng.standard_normal((3, 2, 1, 1)).astype(np.float32)
B_SE = _rng.standard_normal(3).astype(np.float32)
G8, B8 = (_rng.standard_normal(8).astype(np.float32) for _ in range(2))  # layer norm over a last axis of 8
G3, B3 = (_rng.standard_normal(3).astype(np.float32) for _ in range(2))  # ... and over the 3 channels
f32 = np.float32
HALVES = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5], f32)  # MIL: "0.5 is rounded to 0"


def _t(a):
    return torch.from_numpy(np.asarray(a))


def _f32(v):
    """Core ML outputs cannot be bool: comparisons are checked as 0/1 floats."""
    return mb.cast(x=v, dtype="fp32")


# name -> (MIL snippet on inputs x, y (normal) and p (positive), torch reference on the same tensors).
CASES = {
    "conv_same_stride2": (lambda x, y, p: mb.conv(x=x, weight=W_CONV, pad_type="same", strides=[2, 2]),
                          lambda x, y, p: F.conv2d(F.pad(x, (0, 1, 0, 1)), _t(W_CONV), stride=2)),
    "conv_depthwise_custom_pad": (
        lambda x, y, p: mb.conv(x=x, weight=W_DW, groups=3, pad_type="custom", pad=[1, 0, 2, 1], bias=np.ones(3, f32)),
        lambda x, y, p: F.conv2d(F.pad(x, (2, 1, 1, 0)), _t(W_DW), torch.ones(3), groups=3)),
    "conv_same_lower_dilated": (
        lambda x, y, p: mb.conv(x=x, weight=W_DIL, pad_type="same_lower", dilations=[2, 2]),
        # dilated kernel 3 at stride 1: total pad 2 -> (1, 1)
        lambda x, y, p: F.conv2d(F.pad(x, (1, 1, 1, 1)), _t(W_DIL), dilation=2)),
    "conv_valid_even_same_lower": (
        lambda x, y, p: mb.conv(x=x, weight=W_DIL, pad_type="same_lower"),
        # kernel 2 at stride 1: total pad 1, the extra row goes first with same_lower
        lambda x, y, p: F.conv2d(F.pad(x, (1, 0, 1, 0)), _t(W_DIL))),
    "conv_valid": (lambda x, y, p: mb.conv(x=x, weight=W_CONV, pad_type="valid"),
                   lambda x, y, p: F.conv2d(x, _t(W_CONV))),
    "max_pool_custom": (
        lambda x, y, p: mb.max_pool(x=x, kernel_sizes=[3, 3], strides=[2, 2], pad_type="custom", pad=[1, 1, 1, 1]),
        lambda x, y, p: F.max_pool2d(x, 3, 2, padding=1)),
    "max_pool_same": (lambda x, y, p: mb.max_pool(x=x, kernel_sizes=[2, 2], strides=[3, 3], pad_type="same"),
                      # out ceil(8/3)=3, total pad (3-1)*3+2-8=0
                      lambda x, y, p: F.max_pool2d(x, 2, 3)),
    "max_pool_ceil": (
        lambda x, y, p: mb.max_pool(x=x, kernel_sizes=[3, 3], strides=[2, 2], pad_type="custom", pad=[1, 1, 1, 1], ceil_mode=True),
        lambda x, y, p: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True)),
    "avg_pool_valid": (lambda x, y, p: mb.avg_pool(x=x, kernel_sizes=[2, 2], strides=[2, 2], pad_type="valid"),
                       lambda x, y, p: F.avg_pool2d(x, 2, 2)),
    "avg_pool_pad_included": (
        lambda x, y, p: mb.avg_pool(x=x, kernel_sizes=[3, 3], strides=[1, 1], pad_type="custom", pad=[1, 1, 1, 1]),
        lambda x, y, p: F.avg_pool2d(x, 3, 1, padding=1, count_include_pad=True)),
    "avg_pool_pad_excluded": (
        lambda x, y, p: mb.avg_pool(x=x, kernel_sizes=[3, 3], strides=[2, 2], pad_type="custom", pad=[1, 1, 1, 1],
                                    exclude_padding_from_average=True),
        lambda x, y, p: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False)),
    "batch_norm": (
        lambda x, y, p: mb.batch_norm(x=x, mean=np.ones(3, f32), variance=np.full(3, 2, f32), gamma=np.arange(3, dtype=f32),
                                      beta=np.ones(3, f32), epsilon=f32(1e-3)),
        lambda x, y, p: F.batch_norm(x, torch.ones(3), torch.full((3,), 2.0), torch.arange(3.0), torch.ones(3), eps=1e-3)),
    "l2_norm": (lambda x, y, p: mb.l2_norm(x=x, epsilon=f32(1e-6)),
                lambda x, y, p: x / torch.sqrt((x * x).sum(dim=(1, 2, 3), keepdim=True) + 1e-6)),
    "matmul": (lambda x, y, p: mb.matmul(x=x, y=y, transpose_y=True), lambda x, y, p: x @ y.transpose(-1, -2)),
    "linear": (lambda x, y, p: mb.linear(x=x, weight=W_LIN, bias=B_LIN), lambda x, y, p: x @ _t(W_LIN).T + _t(B_LIN)),
    "linear_rank2": (lambda x, y, p: mb.linear(x=mb.reshape(x=x, shape=[24, 8]), weight=W_LIN, bias=B_LIN),
                     lambda x, y, p: x.reshape(24, 8) @ _t(W_LIN).T + _t(B_LIN)),
    "add": (lambda x, y, p: mb.add(x=x, y=y), lambda x, y, p: x + y),
    "add_broadcast": (lambda x, y, p: mb.add(x=x, y=np.arange(8, dtype=f32)), lambda x, y, p: x + torch.arange(8.0)),
    "sub": (lambda x, y, p: mb.sub(x=x, y=y), lambda x, y, p: x - y),
    "sub_broadcast": (lambda x, y, p: mb.sub(x=x, y=mb.reduce_mean(x=y, axes=[1, 2], keep_dims=True)),
                      lambda x, y, p: x - y.mean(dim=(1, 2), keepdim=True)),
    "mul": (lambda x, y, p: mb.mul(x=x, y=y), lambda x, y, p: x * y),
    "mul_broadcast": (lambda x, y, p: mb.mul(x=x, y=mb.reduce_mean(x=y, axes=[1, 3], keep_dims=True)),
                      lambda x, y, p: x * y.mean(dim=(1, 3), keepdim=True)),
    "real_div": (lambda x, y, p: mb.real_div(x=x, y=p), lambda x, y, p: x / p),
    "floor_div": (lambda x, y, p: mb.floor_div(x=x, y=p), lambda x, y, p: torch.floor(x / p)),
    "pow": (lambda x, y, p: mb.pow(x=p, y=y), lambda x, y, p: p ** y),
    "maximum": (lambda x, y, p: mb.maximum(x=x, y=y), lambda x, y, p: torch.max(x, y)),
    "minimum": (lambda x, y, p: mb.minimum(x=x, y=y), lambda x, y, p: torch.min(x, y)),
    # the encoder's L2 floor (a NeuralNetwork writes broadcast max/min as their own layers)
    "maximum_broadcast": (lambda x, y, p: mb.maximum(x=x, y=mb.reduce_mean(x=y, axes=[1], keep_dims=True)),
                          lambda x, y, p: torch.max(x, y.mean(dim=1, keepdim=True))),
    "minimum_broadcast": (lambda x, y, p: mb.minimum(x=x, y=mb.reduce_mean(x=y, axes=[1, 2], keep_dims=True)),
                          lambda x, y, p: torch.min(x, y.mean(dim=(1, 2), keepdim=True))),
    "equal": (lambda x, y, p: _f32(mb.equal(x=mb.round(x=x), y=mb.round(x=y))),
              lambda x, y, p: (torch.round(x) == torch.round(y)).float()),
    "not_equal": (lambda x, y, p: _f32(mb.not_equal(x=mb.round(x=x), y=mb.round(x=y))),
                  lambda x, y, p: (torch.round(x) != torch.round(y)).float()),
    "greater": (lambda x, y, p: _f32(mb.greater(x=x, y=y)), lambda x, y, p: (x > y).float()),
    "greater_equal": (lambda x, y, p: _f32(mb.greater_equal(x=mb.round(x=x), y=mb.round(x=y))),
                      lambda x, y, p: (torch.round(x) >= torch.round(y)).float()),
    "less": (lambda x, y, p: _f32(mb.less(x=x, y=y)), lambda x, y, p: (x < y).float()),
    "less_equal": (lambda x, y, p: _f32(mb.less_equal(x=mb.round(x=x), y=mb.round(x=y))),
                   lambda x, y, p: (torch.round(x) <= torch.round(y)).float()),
    "logical_and_select": (
        lambda x, y, p: mb.select(cond=mb.logical_and(x=mb.greater(x=x, y=0.0), y=mb.less(x=y, y=0.5)), a=x, b=y),
        lambda x, y, p: torch.where((x > 0) & (y < 0.5), x, y)),
    "logical_or_not": (
        lambda x, y, p: _f32(mb.logical_or(x=mb.greater(x=x, y=0.0), y=mb.logical_not(x=mb.less(x=y, y=0.5)))),
        lambda x, y, p: ((x > 0) | ~(y < 0.5)).float()),
    "logical_xor": (lambda x, y, p: _f32(mb.logical_xor(x=mb.greater(x=x, y=0.0), y=mb.greater(x=y, y=0.0))),
                    lambda x, y, p: ((x > 0) ^ (y > 0)).float()),
    "relu": (lambda x, y, p: mb.relu(x=x), lambda x, y, p: torch.relu(x)),
    "sigmoid_hard": (lambda x, y, p: mb.sigmoid_hard(x=mb.mul(x=x, y=4.0), alpha=0.3, beta=0.4),
                     lambda x, y, p: torch.clamp(0.3 * 4 * x + 0.4, 0, 1)),
    "thresholded_relu": (lambda x, y, p: mb.thresholded_relu(x=x, alpha=0.25),
                         lambda x, y, p: x * (x >= 0.25)),
    # torch's hardswish as coremltools converts it: thresholded_relu(-3), sigmoid_hard(1/6, 1/2), mul (x4 reaches
    # both flat parts, |x| > 3)
    "hardswish": (lambda x, y, p: _hardswish(mb.mul(x=x, y=4.0)), lambda x, y, p: F.hardswish(4 * x)),
    "silu": (lambda x, y, p: mb.silu(x=x), lambda x, y, p: x / (1 + torch.exp(-x))),
    "gelu_exact": (lambda x, y, p: mb.gelu(x=x), lambda x, y, p: 0.5 * x * (1 + torch.erf(x / 2 ** 0.5))),
    "gelu_tanh": (lambda x, y, p: mb.gelu(x=x, mode="TANH_APPROXIMATION"),
                  lambda x, y, p: 0.5 * x * (1 + torch.tanh((2 / np.pi) ** 0.5 * (x + 0.044715 * x ** 3)))),
    "gelu_sigmoid": (lambda x, y, p: mb.gelu(x=x, mode="SIGMOID_APPROXIMATION"),
                     lambda x, y, p: x / (1 + torch.exp(-1.702 * x))),
    "softmax_last": (lambda x, y, p: mb.softmax(x=x, axis=-1),
                     lambda x, y, p: torch.exp(x) / torch.exp(x).sum(dim=-1, keepdim=True)),
    "softmax_channels": (lambda x, y, p: mb.softmax(x=x, axis=1),
                         lambda x, y, p: torch.exp(x) / torch.exp(x).sum(dim=1, keepdim=True)),
    "layer_norm_last": (lambda x, y, p: mb.layer_norm(x=x, axes=[-1], gamma=G8, beta=B8, epsilon=f32(1e-5)),
                        lambda x, y, p: _layer_norm(x, [-1], 1e-5) * _t(G8) + _t(B8)),
    # rank 3 over the last axis, as a ViT's tokens: the NeuralNetwork writes it as mvn + scale layers
    "layer_norm_tokens": (lambda x, y, p: mb.layer_norm(x=mb.reshape(x=x, shape=[24, 8]), axes=[-1], gamma=G8,
                                                        beta=B8, epsilon=f32(1e-6)),
                          lambda x, y, p: _layer_norm(x.reshape(24, 8), [-1], 1e-6) * _t(G8) + _t(B8)),
    "layer_norm_tokens_rank3": (lambda x, y, p: mb.layer_norm(x=mb.reshape(x=x, shape=[3, 8, 8]), axes=[2], gamma=G8,
                                                              beta=B8, epsilon=f32(1e-6)),
                                lambda x, y, p: _layer_norm(x.reshape(3, 8, 8), [2], 1e-6) * _t(G8) + _t(B8)),
    "layer_norm_channels": (lambda x, y, p: mb.layer_norm(x=x, axes=[1], gamma=G3, beta=B3, epsilon=f32(1e-6)),
                            lambda x, y, p: _layer_norm(x, [1], 1e-6) * _t(G3).view(3, 1, 1) + _t(B3).view(3, 1, 1)),
    "squeeze_excitation": (lambda x, y, p: mb.mul(x=x, y=mb.sigmoid_hard(x=mb.conv(x=mb.relu(x=mb.conv(
                               x=mb.reduce_mean(x=x, axes=[2, 3], keep_dims=True), weight=W_SE1)), weight=W_SE2,
                               bias=B_SE), alpha=f32(1 / 6), beta=f32(0.5))),
                           lambda x, y, p: x * torch.clamp(F.conv2d(torch.relu(F.conv2d(x.mean(dim=(2, 3), keepdim=True),
                                                                                         _t(W_SE1))), _t(W_SE2), _t(B_SE)) / 6 + 0.5, 0, 1)),
    # scaled dot-product attention of 3 heads, 8 tokens, 8 dims, as coremltools writes it below iOS18: batched
    # matmuls around a softmax
    "attention": (lambda x, y, p: mb.matmul(x=mb.softmax(x=mb.mul(x=mb.matmul(x=x, y=y, transpose_y=True),
                                                                y=f32(8 ** -0.5)), axis=-1), y=p),
                  lambda x, y, p: F.scaled_dot_product_attention(x, y, p)),
    "leaky_relu": (lambda x, y, p: mb.leaky_relu(x=x, alpha=0.2), lambda x, y, p: F.leaky_relu(x, 0.2)),
    "sigmoid": (lambda x, y, p: mb.sigmoid(x=x), lambda x, y, p: torch.sigmoid(x)),
    "tanh": (lambda x, y, p: mb.tanh(x=x), lambda x, y, p: torch.tanh(x)),
    "clip": (lambda x, y, p: mb.clip(x=x, alpha=-0.5, beta=0.5), lambda x, y, p: x.clamp(-0.5, 0.5)),
    "abs": (lambda x, y, p: mb.abs(x=x), lambda x, y, p: x.abs()),
    "sign": (lambda x, y, p: mb.sign(x=x), lambda x, y, p: x.sign()),
    "floor": (lambda x, y, p: mb.floor(x=mb.mul(x=x, y=3.0)), lambda x, y, p: torch.floor(x * 3)),
    "ceil": (lambda x, y, p: mb.ceil(x=mb.mul(x=x, y=3.0)), lambda x, y, p: torch.ceil(x * 3)),
    "round": (lambda x, y, p: mb.round(x=mb.mul(x=x, y=3.0)), lambda x, y, p: torch.round(x * 3)),
    "round_ties_to_even": (lambda x, y, p: mb.round(x=mb.add(x=mb.mul(x=x, y=0.0), y=HALVES)),
                           lambda x, y, p: torch.round(_t(HALVES)).expand(*SHAPE)),
    "sqrt": (lambda x, y, p: mb.sqrt(x=p), lambda x, y, p: p.sqrt()),
    "square": (lambda x, y, p: mb.square(x=x), lambda x, y, p: x * x),
    "exp": (lambda x, y, p: mb.exp(x=x), lambda x, y, p: x.exp()),
    "rsqrt": (lambda x, y, p: mb.rsqrt(x=p, epsilon=0.25), lambda x, y, p: 1 / torch.sqrt(p + 0.25)),
    "inverse": (lambda x, y, p: mb.inverse(x=p, epsilon=0.25), lambda x, y, p: 1 / (p + 0.25)),
    "log": (lambda x, y, p: mb.log(x=p, epsilon=0.25), lambda x, y, p: torch.log(p + 0.25)),
    "cast_truncates": (lambda x, y, p: mb.cast(x=mb.cast(x=mb.mul(x=x, y=4.0), dtype="int32"), dtype="fp32"),
                       lambda x, y, p: torch.trunc(x * 4)),
    "reduce_mean_hw": (lambda x, y, p: mb.reduce_mean(x=x, axes=[-1, -2], keep_dims=True),
                       lambda x, y, p: x.mean(dim=(2, 3), keepdim=True)),
    "reduce_mean_c": (lambda x, y, p: mb.reduce_mean(x=x, axes=[1], keep_dims=False), lambda x, y, p: x.mean(dim=1)),
    "reduce_sum": (lambda x, y, p: mb.reduce_sum(x=x, axes=[1]), lambda x, y, p: x.sum(dim=1)),
    "reduce_max": (lambda x, y, p: mb.reduce_max(x=x, axes=[2], keep_dims=True), lambda x, y, p: x.amax(dim=2, keepdim=True)),
    "reduce_min": (lambda x, y, p: mb.reduce_min(x=x, axes=[1, 3]), lambda x, y, p: x.amin(dim=(1, 3))),
    "reduce_sum_square": (lambda x, y, p: mb.reduce_sum_square(x=x, axes=[3]), lambda x, y, p: (x * x).sum(dim=3)),
    "reduce_l2_norm": (lambda x, y, p: mb.reduce_l2_norm(x=x, axes=[1], keep_dims=True),
                       lambda x, y, p: torch.linalg.vector_norm(x, dim=1, keepdim=True)),
    "reshape": (lambda x, y, p: mb.reshape(x=x, shape=[1, -1, 16]), lambda x, y, p: x.reshape(1, -1, 16)),
    "reshape_zero": (lambda x, y, p: mb.reshape(x=x, shape=[0, 0, -1, 2]), lambda x, y, p: x.reshape(1, 3, -1, 2)),
    "transpose": (lambda x, y, p: mb.transpose(x=x, perm=[0, 2, 3, 1]), lambda x, y, p: x.permute(0, 2, 3, 1)),
    "squeeze": (lambda x, y, p: mb.squeeze(x=mb.reduce_mean(x=x, axes=[1], keep_dims=True), axes=[1]),
                lambda x, y, p: x.mean(dim=1)),
    "expand_dims": (lambda x, y, p: mb.expand_dims(x=mb.reduce_mean(x=x, axes=[1]), axes=[1, -1]),
                    lambda x, y, p: x.mean(dim=1).unsqueeze(1).unsqueeze(-1)),
    "concat_channels": (lambda x, y, p: mb.concat(values=[x, y], axis=1), lambda x, y, p: torch.cat([x, y], 1)),
    "concat_last": (lambda x, y, p: mb.concat(values=[x, y, p], axis=-1), lambda x, y, p: torch.cat([x, y, p], -1)),
    "concat_interleave": (lambda x, y, p: mb.concat(values=[x, y], axis=2, interleave=True),
                          lambda x, y, p: torch.stack([x, y], 3).reshape(1, 3, 16, 8)),
    "split_first": (lambda x, y, p: mb.split(x=x, split_sizes=[1, 2], axis=1)[0], lambda x, y, p: x[:, :1]),
    "split_second": (lambda x, y, p: mb.split(x=x, num_splits=2, axis=-1)[1], lambda x, y, p: x[..., 4:]),
    "slice_by_index": (lambda x, y, p: mb.slice_by_index(x=x, begin=[0, 1, 1, 0], end=[1, 3, 7, 8], stride=[1, 1, 2, 1]),
                       lambda x, y, p: x[:, 1:3, 1:7:2, :]),
    "slice_by_index_masks": (
        lambda x, y, p: mb.slice_by_index(x=x, begin=[0, 2, 0, -2], end=[1, 0, 5, 0], stride=[1, -1, 1, -2],
                                          begin_mask=[False, False, True, False], end_mask=[False, True, False, True],
                                          squeeze_mask=[True, False, False, False]),
        lambda x, y, p: x[0, [2, 1, 0], :5, :][..., [6, 4, 2, 0]]),
    "slice_by_size": (lambda x, y, p: mb.slice_by_size(x=x, begin=[0, 1, 2, 3], size=[1, 2, -1, 4]),
                      lambda x, y, p: x[:, 1:3, 2:, 3:7]),
    "gather": (lambda x, y, p: mb.gather(x=x, indices=np.array([2, 0, -1], np.int32), axis=1),
               lambda x, y, p: x[:, [2, 0, 2]]),
    "tile": (lambda x, y, p: mb.tile(x=x, reps=[1, 1, 2, 1]), lambda x, y, p: x.repeat(1, 1, 2, 1)),
    "crop": (lambda x, y, p: mb.crop(x=x, crop_height=[1, 2], crop_width=[0, 3]), lambda x, y, p: x[..., 1:6, 0:5]),
    "identity": (lambda x, y, p: mb.identity(x=x), lambda x, y, p: x),
    "upsample_bilinear_unaligned": (
        lambda x, y, p: mb.upsample_bilinear(x=x, scale_factor_height=2.0, scale_factor_width=3.0, align_corners=False),
        lambda x, y, p: F.interpolate(x, size=(16, 24), mode="bilinear", align_corners=False)),
    "upsample_bilinear_aligned": (
        lambda x, y, p: mb.upsample_bilinear(x=x, scale_factor_height=2.0, scale_factor_width=2.0, align_corners=True),
        lambda x, y, p: F.interpolate(x, size=(16, 16), mode="bilinear", align_corners=True)),
    "resize_bilinear_strict": (
        lambda x, y, p: mb.resize_bilinear(x=x, target_size_height=5, target_size_width=11, sampling_mode="STRICT_ALIGN_CORNERS"),
        lambda x, y, p: F.interpolate(x, size=(5, 11), mode="bilinear", align_corners=True)),
    "resize_bilinear_unalign_down": (
        lambda x, y, p: mb.resize_bilinear(x=x, target_size_height=3, target_size_width=5, sampling_mode="UNALIGN_CORNERS"),
        lambda x, y, p: F.interpolate(x, size=(3, 5), mode="bilinear", align_corners=False, antialias=False)),
    "resize_bilinear_default": (
        # DEFAULT samples at i * in / out (TF's legacy resize); grid_sample with those points is the reference
        lambda x, y, p: mb.resize_bilinear(x=x, target_size_height=5, target_size_width=12, sampling_mode="DEFAULT"),
        lambda x, y, p: _grid_sample(x, [i * 8 / 5 for i in range(5)], [i * 8 / 12 for i in range(12)])),
    "resize_bilinear_offset": (
        lambda x, y, p: mb.resize_bilinear(x=x, target_size_height=4, target_size_width=3, sampling_mode="OFFSET_CORNERS"),
        lambda x, y, p: _grid_sample(x, [7 / 4 * (i + 0.5) for i in range(4)], [7 / 3 * (i + 0.5) for i in range(3)])),
}

# Ops newer than iOS 15 (so not in the NeuralNetwork format): only in the ML Program.
CASES_IOS17 = {
    "resize_linear": (lambda x, y, p: mb.resize(x=x, shape=np.array([6, 10], np.int32), resized_dims=np.uint32(2),
                                                sampling_mode="UNALIGN_CORNERS"),
                      lambda x, y, p: F.interpolate(x, size=(6, 10), mode="bilinear", align_corners=False)),
    "upsample_bilinear_half_pixel_off": (
        lambda x, y, p: mb.upsample_bilinear(x=x, scale_factor_height=2.0, scale_factor_width=2.0, align_corners=False,
                                             half_pixel_centers=False),
        lambda x, y, p: _grid_sample(x, [i / 2 for i in range(16)], [i / 2 for i in range(16)])),
}


def _hardswish(x):
    w = mb.thresholded_relu(x=x, alpha=-3.0)
    return mb.mul(x=w, y=mb.sigmoid_hard(x=w, alpha=f32(1 / 6), beta=f32(0.5)))


def _layer_norm(x, axes, eps):
    """(x - mean) / sqrt(biased variance + eps) over `axes`, before gamma and beta."""
    mean = x.mean(dim=axes, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(dim=axes, keepdim=True) + eps)


def _grid_sample(x, rows, cols):
    """Bilinear samples of x at pixel coordinates (clamped to the image), via torch's grid_sample."""
    h, w = x.shape[-2:]
    ys = torch.tensor(rows).clamp(0, h - 1) / (h - 1) * 2 - 1
    xs = torch.tensor(cols).clamp(0, w - 1) / (w - 1) * 2 - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack([gx, gy], -1)[None].float()
    return F.grid_sample(x, grid, mode="bilinear", align_corners=True)


def case_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(SHAPE, generator=g), "y": torch.randn(SHAPE, generator=g),
            "p": 0.5 + 1.5 * torch.rand(SHAPE, generator=g)}


def build_program(cases: dict, opset):
    """One MIL program: inputs x, y, p; one named output per case."""

    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE) for _ in range(3)], opset_version=opset)
    def prog(x, y, p):
        return tuple(mb.identity(x=build(x, y, p), name=name) for name, (build, _) in cases.items())

    return prog


def convert(prog, path, convert_to: str, **kw):
    """Convert with an empty main pipeline so every op reaches the file as written (no fusion, no folding)."""
    model = ct.convert(prog, convert_to=convert_to, pass_pipeline=ct.PassPipeline.EMPTY, **kw)
    model.save(str(path))
    return path


def reference(cases: dict, name: str, inputs: dict) -> torch.Tensor:
    return cases[name][1](inputs["x"], inputs["y"], inputs["p"])


ALL_CASES = {**CASES, **CASES_IOS17}


@pytest.fixture(scope="module")
def op_program(tmp_path_factory):
    path = tmp_path_factory.mktemp("mil_ops") / "ops.mlpackage"
    convert(build_program(ALL_CASES, ct.target.iOS17), path, "mlprogram",
            compute_precision=ct.precision.FLOAT32, minimum_deployment_target=ct.target.iOS17)
    model = mil_eval.load_mlpackage(path)
    inputs = case_inputs()
    return model, inputs, mil_eval.run_program(model, inputs)


def test_every_registered_op_is_exercised(op_program):
    model, _, _ = op_program
    used = {op.op_type for op in model.function.operations}
    missing = set(mil_eval.MIL_OPS) - used
    assert not missing, f"registered ops without a case: {sorted(missing)}"


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_op_matches_torch(op_program, name):
    model, inputs, outputs = op_program
    ref = reference(ALL_CASES, name, inputs)
    out = outputs[name]
    assert tuple(out.shape) == tuple(ref.shape)
    torch.testing.assert_close(out, ref.to(out.dtype), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode,n_in,n_out,expected", [
    # the grid examples printed in MIL's resize_bilinear documentation
    ("UNALIGN_CORNERS", 2, 5, [0.0, 0.1, 0.5, 0.9, 1.0]),
    ("STRICT_ALIGN_CORNERS", 2, 5, [0.0, 0.25, 0.5, 0.75, 1.0]),
    ("ALIGN_CORNERS", 2, 5, [0.0, 0.25, 0.5, 0.75, 1.0]),
    ("DEFAULT", 2, 5, [0.0, 0.4, 0.8, 1.0, 1.0]),
    ("OFFSET_CORNERS", 2, 5, [0.1, 0.3, 0.5, 0.7, 0.9]),
    ("UNALIGN_CORNERS", 2, 6, [0.0, 0.0, 1 / 3, 2 / 3, 1.0, 1.0]),
    ("DEFAULT", 2, 6, [0.0, 1 / 3, 2 / 3, 1.0, 1.0, 1.0]),
    ("OFFSET_CORNERS", 2, 6, [1 / 12, 0.25, 5 / 12, 7 / 12, 0.75, 11 / 12]),
    ("ALIGN_CORNERS", 5, 1, [2.0]),
])
def test_sampling_grid_matches_mil_docs(mode, n_in, n_out, expected):
    np.testing.assert_allclose(mil_eval.sample_grid(n_in, n_out, mode).numpy(), expected, atol=1e-9)


def _image_program(color_layout, scale, bias, channels=3):
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, channels, 4, 5))], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.mul(x=x, y=1.0, name="out")

    kw = dict(scale=scale, bias=bias, color_layout=color_layout)
    return prog, [ct.ImageType(name="x", shape=(1, channels, 4, 5), **kw)]


@pytest.mark.parametrize("layout", ["RGB", "BGR"])
def test_image_input_follows_color_layout_scale_and_bias(tmp_path, layout):
    """Core ML feeds the program the picture's pixels in the declared channel order; ImageType's scale and bias
    run as ops. An RGB/BGR mix-up anywhere shows up here."""
    bias = [-1.0, -2.0, -3.0]  # in the program's channel order
    prog, inputs = _image_program(getattr(ct.colorlayout, layout), 1 / 255, bias)
    path = convert(prog, tmp_path / "img.mlpackage", "mlprogram", inputs=inputs,
                   compute_precision=ct.precision.FLOAT32, minimum_deployment_target=ct.target.iOS16)
    model = mil_eval.load_mlpackage(path)
    assert model.inputs[0].color_space == layout
    rgb = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    out = torch.from_numpy(mil_eval.predict_images(model, rgb)).reshape(2, 3, 4, 5)
    planes = rgb.float() if layout == "RGB" else rgb.float().flip(1)
    ref = planes / 255 + torch.tensor(bias).view(1, 3, 1, 1)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)


def test_gray_image_needs_one_channel(tmp_path):
    prog, inputs = _image_program(ct.colorlayout.GRAYSCALE, 2.0, [1.0], channels=1)
    path = convert(prog, tmp_path / "gray.mlpackage", "mlprogram", inputs=inputs,
                   compute_precision=ct.precision.FLOAT32, minimum_deployment_target=ct.target.iOS16)
    model = mil_eval.load_mlpackage(path)
    gray = torch.randint(0, 256, (1, 1, 4, 5), dtype=torch.uint8)
    out = mil_eval.predict_images(model, gray)
    np.testing.assert_allclose(out.reshape(4, 5), gray[0, 0].float().numpy() * 2 + 1, rtol=1e-6)
    with pytest.raises(PipelineError, match="1-channel"):
        mil_eval.predict_images(model, torch.zeros(1, 3, 4, 5))
    with pytest.raises(PipelineError, match="takes 5x4 images"):
        mil_eval.predict_images(model, torch.zeros(1, 1, 5, 5))


def test_fp16_tensors_are_rounded_after_every_op(tmp_path):
    """(x + 1000) - 1000 in fp16 keeps only the fp16 grid of 1000 + x (spacing 0.5): per-op rounding, not one
    rounding at the end."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(64,))], opset_version=ct.target.iOS16)
    def prog(x):
        h = mb.cast(x=x, dtype="fp16")
        h = mb.sub(x=mb.add(x=h, y=np.float16(1000)), y=np.float16(1000))
        return mb.cast(x=h, dtype="fp32", name="out")

    path = convert(prog, tmp_path / "fp16.mlpackage", "mlprogram", compute_precision=ct.precision.FLOAT32,
                   minimum_deployment_target=ct.target.iOS16)
    model = mil_eval.load_mlpackage(path)
    assert model.precision == "fp16"
    x = torch.linspace(-3, 3, 64)
    out = mil_eval.run_program(model, {"x": x})["out"]
    ref = ((x.half().float() + 1000).half().float() - 1000).half().float()
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert (out - x).abs().max() > 0.1  # the fp32 answer would be x itself


def test_unknown_op_fails_naming_it(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.softplus(x=x, name="out")

    path = convert(prog, tmp_path / "softplus.mlpackage", "mlprogram", compute_precision=ct.precision.FLOAT32,
                   minimum_deployment_target=ct.target.iOS16)
    model = mil_eval.load_mlpackage(path)
    with pytest.raises(PipelineError, match="op `softplus`.*not supported"):
        mil_eval.run_program(model, {"x": torch.zeros(2, 4)})


def test_not_a_package_is_one_line_error(tmp_path):
    with pytest.raises(PipelineError, match="not an .mlpackage"):
        mil_eval.load_mlpackage(tmp_path / "missing.mlpackage")


def test_pool_out_size_follows_mil_ceil_rule():
    assert mil_eval.pool_out_size(8, 3, 2, (1, 1), ceil_mode=False) == 4
    assert mil_eval.pool_out_size(9, 3, 2, (1, 1), ceil_mode=True) == 5
    assert mil_eval.pool_out_size(7, 2, 2, (0, 0), ceil_mode=True) == 4
    # a window that would start in the right padding is dropped
    assert mil_eval.pool_out_size(7, 2, 2, (1, 1), ceil_mode=True) == 4
