"""The device views' last pass on CUDA as one Triton kernel: solarize, (x - mean) / std, and the model's fp32 layout.

Why hand-written: the views reach this pass in the resize's layout, each row of an image its three channels one
after another (m, H, 3, W), and the model reads channels last (m, H, W, 3): the pass is a transpose as well as a
cast. The pointwise kernel torch.compile writes for it was the views' largest at 224 px on an H200 (0.24 ms a step
of 1.28, for 0.46 GB read and written: under half the card's bandwidth). Here each program holds whole rows as
[W, 4] tiles (the 4th channel masked off), so a row's 3W values are read and written as one contiguous run each.

`device_augment.standardise` is the reference, op for op in fp32 (solarize on the stored value, exact in fp16:
1 - x is exact for x in [0.5, 2]); tests/train/test_standardise_kernel.py runs the kernel in Triton's interpreter on
the CPU against it, compiles it for a Hopper GPU on the CPU, and on a GPU compares the compiled kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PIXELS = 1024  # about this many pixels a program (whole rows): 4 rows at 224 px, 32 at 32 px


@triton.jit
def _standardised(x_ptr, sol_ptr, scale_ptr, shift_ptr, rows_ptr, out_ptr, n_rows, h, w, sn, sc, sh, sol_n, on_, oc, oh,
                  ow, ROWS: tl.constexpr, BW: tl.constexpr, GATHER: tl.constexpr):
    xs = tl.arange(0, BW)
    cs = tl.arange(0, 4)
    valid = (xs[:, None] < w) & (cs[None, :] < 3)
    scale = tl.load(scale_ptr + cs, mask=cs < 3, other=0.0)[None, :]
    shift = tl.load(shift_ptr + cs, mask=cs < 3, other=0.0)[None, :]
    for i in range(ROWS):
        r = tl.program_id(0) * ROWS + i
        if r < n_rows:
            n, y = r // h, r % h
            src = n
            if GATHER:  # output image n is input image rows[n]
                src = tl.load(rows_ptr + n)
            v = tl.load(x_ptr + src * sn + y * sh + cs[None, :] * sc + xs[:, None], mask=valid, other=0.0)
            v = v.to(tl.float32)
            v = tl.where(tl.load(sol_ptr + src * sol_n) > 0, tl.where(v >= 0.5, 1.0 - v, v), v)
            tl.store(out_ptr + n * on_ + y * oh + xs[:, None] * ow + cs[None, :] * oc, v * scale + shift, mask=valid)


def standardise(x: torch.Tensor, solarize: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                channels_last: bool, rows: torch.Tensor | None = None) -> torch.Tensor:
    """`device_augment.standardise` (same arguments; x's rows contiguous, any layout of its other dims; solarize
    (m, 1), any row stride: a column of the views' parameter table), as fp32 in the memory format asked for."""
    m, _, h, w = x.shape
    assert x.stride(3) == 1, "the kernel reads each row of pixels contiguous"
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty(x.shape, device=x.device, dtype=torch.float32, memory_format=fmt)
    per = max(1, PIXELS // w)  # rows of pixels a program
    sn, sc, sh, _ = x.stride()
    on_, oc, oh, ow = out.stride()
    gather = rows is not None
    _standardised[(triton.cdiv(m * h, per),)](x, solarize, scale, shift, rows if gather else x, out, m * h, h, w, sn,
                                              sc, sh, solarize.stride(0), on_, oc, oh, ow, ROWS=per,
                                              BW=triton.next_power_of_2(w), GATHER=gather)
    return out
