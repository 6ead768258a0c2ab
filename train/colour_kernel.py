"""The device views' colour jitter and grayscale on CUDA as two Triton kernels: one reduction pass and one
pointwise pass over the batch, where the compiled `device_augment.colour` makes about a dozen.

Why hand-written: the jitter is 6 blend slots around a hue round trip, each slot reading all three channels of the
one before, and contrast blends towards the mean grey each image holds as it enters its contrast slot. torch.compile
stores the images between slots, one reduction pass per slot's mean and pointwise passes between them (1.3 ms a step
of the views' 2.45 at 224 px on an H200); the same chain written as one reduction and one pointwise pass came out
slower still, with the images stored between slots in both (benchmarks/results/h200-views-passes/). Here each
pixel's chain runs in registers:

1. `_contrast_sums`: an image has at most one contrast slot and only pointwise blends before it, so the chain run
   with mean 0 gives, at that slot, the grey the mean is taken of: each block of pixels writes its sum;
2. `_jittered`: each image's mean from its blocks' sums (in block order: the same bits every run), then the whole
   chain with it, and grayscale, written in the resize's layout.

The arithmetic is `device_augment.colour`'s, op for op, in fp32 registers (the compiled version also computes in
fp32 and rounds where it stores). tests/train/test_colour_kernel.py runs both kernels in Triton's interpreter on
the CPU against `colour`. On an H200 they cut the views' GPU time at 224 px from 2.46 to 1.28 ms a step
(docs/benchmarks.md, "The colour jitter as two Triton kernels").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # pixels a program: 50 blocks an image at 224 px, one at 32 px
# Columns of the per-image parameter rows the kernels read (`_rows`): a, sat, con 6 slots each, then hue_on, hue, gray.
# tl.constexpr, since a jitted function may read no other module-level value: Triton's compiler refuses one (its CPU
# interpreter does not), which tests/train/test_colour_kernel.py checks by compiling for a Hopper GPU on the CPU.
A, SAT, CON, HUE_ON, HUE, GRAY, WIDTH = (tl.constexpr(c) for c in (0, 6, 12, 18, 19, 20, 21))
# Both launches' compile options, named rather than left to Triton's default: fused multiply-adds, as the kernels were
# measured and tested on the GPU. Triton 3.10 turns that default off (3.9 warns while TRITON_DEFAULT_FP_FUSION is
# unset); named here, a newer Triton compiles the same arithmetic.
OPTIONS = {"enable_fp_fusion": True}


@triton.jit
def _grey(r, g, b):
    return r * 0.2989 + g * 0.587 + b * 0.114  # torchvision's weights, in its order


@triton.jit
def _mod6(k):
    return k - 6.0 * tl.floor(k / 6.0)  # torch.remainder: the sign of the divisor


@triton.jit
def _hue_channel(maxc, delta, k):
    return maxc - delta * tl.minimum(tl.maximum(tl.minimum(k, 4.0 - k), 0.0), 1.0)


@triton.jit
def _pixels(px, sc, valid):
    """The three channels of the pixels at px (channel stride sc), as fp32."""
    r = tl.load(px, mask=valid, other=0.0).to(tl.float32)
    g = tl.load(px + sc, mask=valid, other=0.0).to(tl.float32)
    b = tl.load(px + 2 * sc, mask=valid, other=0.0).to(tl.float32)
    return r, g, b


@triton.jit
def _chain(r, g, b, row, mean):
    """Clamp, the 6 slots around hue; returns the channels and the grey entering each pixel's contrast slot."""
    r = tl.minimum(tl.maximum(r, 0.0), 1.0)
    g = tl.minimum(tl.maximum(g, 0.0), 1.0)
    b = tl.minimum(tl.maximum(b, 0.0), 1.0)
    entering = tl.zeros_like(r)
    for s in tl.static_range(6):
        if s == 3:  # hue (device_augment.shift_hue), where the image draws jitter
            maxc = tl.maximum(tl.maximum(r, g), b)
            delta = maxc - tl.minimum(tl.minimum(r, g), b)
            d = tl.maximum(delta, 1e-12)
            h = tl.where(r == maxc, (g - b) / d, tl.where(g == maxc, (b - r) / d + 2.0, (r - g) / d + 4.0))
            h = h + 6.0 * tl.load(row + HUE)
            on = tl.load(row + HUE_ON) > 0
            r2 = _hue_channel(maxc, delta, _mod6(h + 5.0))
            g2 = _hue_channel(maxc, delta, _mod6(h + 3.0))
            b2 = _hue_channel(maxc, delta, _mod6(h + 1.0))
            r = tl.where(on, r2, r)
            g = tl.where(on, g2, g)
            b = tl.where(on, b2, b)
        a = tl.load(row + A + s)
        sat = tl.load(row + SAT + s)
        con = tl.load(row + CON + s)
        grey = _grey(r, g, b)
        entering = tl.where(con != 0, grey, entering)
        t = con * mean + sat * grey
        r = tl.minimum(tl.maximum(t + a * r, 0.0), 1.0)
        g = tl.minimum(tl.maximum(t + a * g, 0.0), 1.0)
        b = tl.minimum(tl.maximum(t + a * b, 0.0), 1.0)
    return r, g, b, entering


@triton.jit
def _contrast_sums(x_ptr, rows_ptr, sums_ptr, hw, w, sn, sc, sh, blocks, BLOCK: tl.constexpr):
    n, blk = tl.program_id(0), tl.program_id(1)
    i = blk * BLOCK + tl.arange(0, BLOCK)
    valid = i < hw
    r, g, b = _pixels(x_ptr + n * sn + (i // w) * sh + i % w, sc, valid)
    _, _, _, entering = _chain(r, g, b, rows_ptr + n * WIDTH, 0.0)
    tl.store(sums_ptr + n * blocks + blk, tl.sum(tl.where(valid, entering, 0.0), axis=0))


@triton.jit
def _jittered(x_ptr, rows_ptr, sums_ptr, out_ptr, hw, w, sn, sc, sh, on_, oc, oh, blocks, BLOCK: tl.constexpr,
              BLOCKS: tl.constexpr):
    n, blk = tl.program_id(0), tl.program_id(1)
    j = tl.arange(0, BLOCKS)
    mean = tl.sum(tl.load(sums_ptr + n * blocks + j, mask=j < blocks, other=0.0), axis=0) / hw
    i = blk * BLOCK + tl.arange(0, BLOCK)
    valid = i < hw
    y, x = i // w, i % w
    r, g, b = _pixels(x_ptr + n * sn + y * sh + x, sc, valid)
    row = rows_ptr + n * WIDTH
    r, g, b, _ = _chain(r, g, b, row, mean)
    grey = _grey(r, g, b)
    gray = tl.load(row + GRAY) > 0
    r, g, b = tl.where(gray, grey, r), tl.where(gray, grey, g), tl.where(gray, grey, b)
    po = out_ptr + n * on_ + y * oh + x
    kind = out_ptr.dtype.element_ty
    tl.store(po, r.to(kind), mask=valid)
    tl.store(po + oc, g.to(kind), mask=valid)
    tl.store(po + 2 * oc, b.to(kind), mask=valid)


def colour(x: torch.Tensor, a: torch.Tensor, sat: torch.Tensor, con: torch.Tensor, hue_on: torch.Tensor,
           hue: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
    """`device_augment.colour` (same arguments; x's last dim contiguous), written in the resize's layout."""
    m, _, h, w = x.shape
    assert x.stride(3) == 1, "the kernels read each row of pixels contiguous"
    rows = torch.cat([a, sat, con, hue_on, hue, gray], 1).float().contiguous()  # one (m, WIDTH) block to read
    blocks = triton.cdiv(h * w, BLOCK)
    sums = torch.empty(m, blocks, device=x.device, dtype=torch.float32)
    out = torch.empty(m, h, 3, w, device=x.device, dtype=x.dtype).permute(0, 2, 1, 3)
    sn, sc, sh, _ = x.stride()
    _contrast_sums[(m, blocks)](x, rows, sums, h * w, w, sn, sc, sh, blocks, BLOCK=BLOCK, **OPTIONS)
    _jittered[(m, blocks)](x, rows, sums, out, h * w, w, sn, sc, sh, *out.stride()[:3], blocks, BLOCK=BLOCK,
                           BLOCKS=triton.next_power_of_2(blocks), **OPTIONS)
    return out
