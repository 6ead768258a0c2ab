"""SSL augmentation on the training device: whole batches, uint8 in, per-sample random parameters, every view a
method declares (the views of one size made together, in one pass over the batch).

Why not torchvision.transforms.v2 on a batch tensor: a v2 transform draws ONE set of random parameters per call
and applies it to every image it is given, so a batch would share one crop, one flip and one colour change. SSL
learns from the variety between the views of each image, and a shared draw removes most of it. Here row i of
the parameters that `augment.draw_views` draws is applied to image i, as the CPU reference
(`augment.apply_view`) does one image at a time; given the same rows the two agree to float rounding
(tests/train/test_device_augment.py).

How each op becomes a few whole-batch kernels (no per-image launch, no device-to-host sync):
- crop + resize + flip: per image, one matrix per axis holding the antialiased triangle filter that
  `interpolate(..., antialias=True)` uses, restricted to the crop window (a flip reverses the column matrix's
  rows); two batched matmuls apply them.
- colour jitter in each image's own random order, split at hue: 3 blend slots, one hue pass, 3 blend slots.
  Brightness, contrast and saturation are all y = clamp(a*x + b*grey(x) + c) with per-image a, b, c (c from the
  image's mean grey, for contrast), so one pass per slot serves every image, whichever of the three it gets
  (a=1, b=c=0 leaves the others exactly as they were). Hue, an HSV round trip, runs once for the whole batch. On
  CUDA the whole jitter and grayscale are two Triton kernels (train/colour_kernel.py says why).
- grayscale and solarize are masks; blur is two batched matmuls with per-image banded Gaussian matrices (reflect
  padding folded in) on the resize's memory layout, so they read the views without a copy; an image that draws no
  blur gets the identity, which leaves it exactly as it was.
- solarize, standardise and the model's memory format in one last pass (`finish`), which also puts the views made
  blurred-first back in order.
- the views of a batch are made by the same kernels on the same shapes whatever was drawn (every image through
  every op but the blur, which covers a fixed number of rows from the first, where the images that drew it are
  put): so on CUDA one graph replays them all (ViewGraph), one launch instead of dozens.

The parameters of a batch are drawn on the host by `augment.draw_views` from one generator seeded by
(seed, epoch, batch): a pure function of the step on every device, so a resumed run sees the same views as an
uninterrupted one, and N processes each applying their share of the global batch's rows see exactly what one
process would. The draws differ from the CPU path's (whose generators are per image); the distribution is the
same. On CUDA the pixels are processed in fp16 (values in [0, 1], error ~5e-4, well under one uint8 step, and
the model then reads them in bf16 anyway), which halves the memory traffic these bandwidth-bound ops cost, and
the next batch's views are made on a side stream while the current step trains.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import queue
import threading
import warnings

import numpy as np
import torch

from train import augment
from core.views import HUE, view_side

# torchvision's rgb_to_grayscale weights (ITU-R 601), as the CPU path uses them.
GRAY = (0.2989, 0.587, 0.114)


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """Seed of one batch's draws (every view): a pure function of (run seed, epoch, batch index)."""
    return (augment.view_seed(seed, epoch, batch) * 2 + 1) % (1 << 63)


def draw_params(n: int, recipes, src_size: int, seed: int, epoch: int, batch: int) -> dict[str, np.ndarray]:
    """Every view's parameters for a batch of n images (augment.draw_views: the view first, views x n x ...), from
    one generator seeded by the batch, drawn on the host (cheap: n rows of numbers). A view's draws do not depend
    on the views after it."""
    return augment.draw_views(n, recipes, src_size, np.random.default_rng(batch_seed(seed, epoch, batch)))


def rows_of(drawn: dict[str, np.ndarray], views: list[int], rows: slice) -> dict[str, np.ndarray]:
    """The given rows of the given views' parameters, views one after another: the rows of one batch of views."""
    return {k: v[views, rows].reshape(-1, *v.shape[2:]) for k, v in drawn.items()}


def _jitter_rounds() -> np.ndarray:
    """(256, 6): for each order of the 4 jitter ops (its code: `order @ _ORDER_CODE`, base 4), the blend op of each
    of the 6 slots, -1 where none: up to 3 blends before hue, then up to 3 after, hue itself once between (every order
    holds it), empty slots identities. One hue pass for the batch instead of one per round (hue is the costly op).
    There are 24 orders, so one table read per row replaces a dozen numpy calls on the host every step
    (docs/benchmarks.md, "The views' parameters in one numpy pass")."""
    rounds = np.full((256, 6), -1, np.int64)
    for order in itertools.permutations(range(4)):
        at = order.index(HUE)
        before, after = order[:at], order[at + 1:]
        rounds[np.dot(order, _ORDER_CODE)] = [*before, *[-1] * (3 - len(before)), *after, *[-1] * (3 - len(after))]
    return rounds


_ORDER_CODE = np.array([64, 16, 4, 1])
_ROUNDS = _jitter_rounds()


def _plan(p: dict, out_size: int) -> tuple[np.ndarray, dict]:
    """Parameter rows -> one float table of per-image numbers (it travels to the device in one copy) and its column
    slices. Every op has a column for every image, an identity where the image does not get it, so the work on the
    device has the same shapes whatever was drawn. The columns are joined straight into the float32 table (one
    rounding of the float64 ones, as a float64 table cast once would round): this runs on the host every step."""
    p = {k: np.asarray(v) for k, v in p.items()}
    m = len(p["flip"])
    # Each image's 4 jitter ops in its own order, split at hue: its row of _ROUNDS (m, 6): the blend op of each slot.
    # (Row r's element j of an (m, w) array is element r * w + j of its flat copy: np.take of those flat indices
    # picks one element per row and slot in one call, several times faster than 2-d fancy indexing at these sizes.)
    each = np.arange(m)[:, None]
    rounds = np.where(p["jitter"][:, None], _ROUNDS[p["jitter_order"] @ _ORDER_CODE], -1)
    factor = np.stack([p["brightness"], p["contrast"], p["saturation"]], 1).astype(np.float64)
    a = np.where(rounds >= 0, np.take(factor, each * 3 + np.clip(rounds, 0, 2)), 1.0)
    k = augment.blur_kernel_size(out_size)
    # Not blurred: the kernel [0 .. 1 .. 0], which the blur's matrix products pass through exactly. A batch where no
    # image drew the blur (every batch of a side that never blurs, such as every 32 px one) skips the Gaussians.
    blur = np.asarray(p["blur"], bool)
    kernels = np.broadcast_to(np.arange(k) == k // 2, (m, k))
    if blur.any():
        gauss = np.exp(-0.5 * ((np.arange(k) - k // 2)[None, :] / p["sigma"].astype(np.float64)[:, None]) ** 2)
        kernels = np.where(blur[:, None], gauss / gauss.sum(1, keepdims=True), kernels)
    cols = {
        "crop": p["crop"], "flip": p["flip"],
        # brightness: a*x; contrast: a*x + (1-a)*mean grey; saturation: a*x + (1-a)*grey(x); others a=1
        "a": a, "sat": np.where(rounds == 2, 1 - a, 0.0), "con": np.where(rounds == 1, 1 - a, 0.0),
        "hue_on": p["jitter"], "hue": p["hue"], "gray": p["gray"], "blur": kernels, "solarize": p["solarize"],
    }
    cols = {name: np.asarray(values).reshape(m, -1) for name, values in cols.items()}  # bool, int, float32 or 64
    at, width = {}, 0
    for name, values in cols.items():
        at[name] = slice(width, width + values.shape[1])
        width += values.shape[1]
    return np.concatenate(list(cols.values()), axis=1, dtype=np.float32), at


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without stalling the host: from pinned memory, a CUDA copy is queued, not waited for (from
    pageable memory it would wait for all queued GPU work first)."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def resize_matrices(start: torch.Tensor, length: torch.Tensor, flip: torch.Tensor, src_size: int, out_size: int,
                    dtype: torch.dtype = torch.float32, gain: float = 1.0) -> torch.Tensor:
    """(k, out, src): row o holds the weights of output pixel o over the source pixels, for a crop of `length`
    pixels from `start` (output order reversed where `flip`), times `gain`. The filter is PyTorch's antialiased
    bilinear one (a triangle widened by the downscale factor, clipped to the crop, normalised), so this matches
    interpolate(antialias=True). Only its few non-zero taps per row are computed, then scattered into the matrix."""
    dev = start.device
    scale = (length / out_size)[:, None]
    support = torch.where(scale >= 1, scale, torch.ones_like(scale))
    inv = 1.0 / support
    center = scale * (torch.arange(out_size, device=dev, dtype=torch.float32)[None, :] + 0.5)  # (k, out)
    taps = math.ceil(2 * max(1.0, src_size / out_size)) + 1  # enough for the widest filter any crop can need
    pos = torch.floor(center - support + 0.5)[:, :, None] + torch.arange(taps, device=dev)  # (k, out, taps), crop-relative
    w = (1 - ((pos + 0.5 - center[:, :, None]) * inv[:, :, None]).abs()).clamp_(min=0)
    w = w * ((pos >= 0) & (pos < length[:, None, None]))
    w = w * (gain / w.sum(-1, keepdim=True))
    index = (pos + start[:, None, None]).clamp_(0, src_size - 1).long()  # zero-weight taps may land anywhere valid
    backwards = flip.bool()[:, None, None]
    w, index = torch.where(backwards, w.flip(1), w), torch.where(backwards, index.flip(1), index)
    out = torch.zeros(start.shape[0], out_size, src_size, device=dev, dtype=dtype)
    return out.scatter_add_(2, index, w.to(dtype))


def crop_matrices(crop: torch.Tensor, flip: torch.Tensor, src_size: int, out_size: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The resize's two matrices for a batch's crops (`_plan`'s crop columns: top, left, height, width): the rows'
    (never flipped) and the columns' (flipped where drawn, with 1/255 folded in). One function so that CUDA compiles
    both into a few kernels: eager, the two are about a hundred small ops, each a launch of its own inside the
    views' graph, on matrices that at 32 px are tiny. Compiled, a step's views took 0.08 ms of an H100's time at
    32 px instead of 0.21, and 1.13 ms instead of 1.28 at 224 px
    (benchmarks/results/h100-views-compiled-mobile-compile/)."""
    wy = resize_matrices(crop[:, 0], crop[:, 2], torch.zeros_like(flip), src_size, out_size, dtype)
    wx = resize_matrices(crop[:, 1], crop[:, 3], flip, src_size, out_size, dtype, gain=1 / 255)
    return wy, wx


@functools.lru_cache(maxsize=None)
def _reflect_index(size: int, ksize: int, device: torch.device) -> torch.Tensor:
    """(size, ksize): the source pixel each tap of a centred kernel reads under reflect padding (edge not repeated)."""
    j = torch.arange(size)[:, None] + torch.arange(ksize)[None, :] - ksize // 2
    j = torch.where(j < 0, -j, j)
    return torch.where(j >= size, 2 * (size - 1) - j, j).to(device)


def blur_matrices(kernels: torch.Tensor, size: int) -> torch.Tensor:
    """(k, size, size) banded matrices: B @ column = the column convolved with each row's 1-D kernel (k, ksize)
    over reflect padding, which is what torchvision's gaussian_blur does along each axis."""
    k, ksize = kernels.shape
    index = _reflect_index(size, ksize, kernels.device).expand(k, size, ksize)
    out = torch.zeros(k, size, size, device=kernels.device, dtype=kernels.dtype)
    return out.scatter_add_(2, index, kernels[:, None, :].expand(k, size, ksize))


def shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_hue (RGB->HSV, rotate, back) for k images at once, shift (k,) in turns; fp32 inside
    (hue divides by channel differences, which fp16 would round too coarsely). Written as plain elementwise ops
    (selects, no gather or roll) so that on CUDA the compiler fuses the whole round trip, and the blends around it,
    into the passes the blends need anyway: the fp32 stays in registers."""
    x = x.float()
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    maxc = torch.maximum(torch.maximum(r, g), b)
    delta = maxc - torch.minimum(torch.minimum(r, g), b)
    d = delta.clamp(min=1e-12)  # grey pixels (delta 0) get hue 0 here, and any hue gives them back unchanged below
    # Hue in sextants from the largest channel, ties to red, then green (as torchvision's argmax).
    h = torch.where(r == maxc, (g - b) / d, torch.where(g == maxc, (b - r) / d + 2, (r - g) / d + 4))
    # HSV->RGB in closed form: c_n = v - (v - min) * clamp(min(k, 4 - k), 0, 1), k = (n + h) mod 6, n = 5, 3, 1.
    three = torch.arange(3, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
    k = (h + (6 * shift.float()).view(-1, 1, 1, 1) + (5 - 2 * three)).remainder(6)
    return maxc - delta * torch.minimum(k, 4 - k).clamp(0, 1)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """torchvision's rgb_to_grayscale, same operations in the same order: (m, 1, H, W)."""
    return x[:, 0:1].mul(GRAY[0]).add_(x[:, 1:2], alpha=GRAY[1]).add_(x[:, 2:3], alpha=GRAY[2])


def colour(x: torch.Tensor, a: torch.Tensor, sat: torch.Tensor, con: torch.Tensor, hue_on: torch.Tensor,
           hue: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
    """Clamp to [0, 1], colour jitter, grayscale. x (m, 3, H, W); per image: a, sat, con (m, 6), the blends of
    the 3 slots before hue and the 3 after; hue_on, hue, gray (m, 1). Every op is computed for every image and a
    mask or an identity (a=1, sat=con=0) keeps what applies: static shapes, no data-dependent control flow, so on
    CUDA torch.compile fuses the elementwise ops into a few passes over the batch (they are bandwidth-bound:
    passes are cost)."""
    dtype = x.dtype
    a, sat, con, hue_on, hue, gray = (t.to(dtype) for t in (a, sat, con, hue_on, hue, gray))
    x = x.clamp(0, 1)

    def blend(x: torch.Tensor, r: int) -> torch.Tensor:
        g = _grey(x)
        t = torch.addcmul(con[:, r, None, None, None] * g.mean((2, 3), keepdim=True), sat[:, r, None, None, None], g)
        return torch.addcmul(t, a[:, r, None, None, None], x).clamp(0, 1)

    for r in range(3):
        x = blend(x, r)
    x = torch.where(hue_on[:, :, None, None] > 0, shift_hue(x, hue[:, 0]).to(dtype), x)
    for r in range(3, 6):
        x = blend(x, r)
    return rows_layout(torch.where(gray[:, :, None, None] > 0, _grey(x).expand_as(x), x))


def rows_layout(x: torch.Tensor) -> torch.Tensor:
    """x (m, 3, H, W) with its memory ordered (m, H, 3, W): the layout the resize writes and the blur's matrix
    products read without a copy. A no-op when x is laid out so already; inside a compiled function it only tells
    the compiler where to write."""
    return x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)


_compiled: dict = {}
AHEAD = 2  # batches made in advance on CUDA: one in the queue covers a step's jitter; two, a slow one's


def _on_cuda_compiled(fn, **options):
    """fn, compiled on CUDA (once per shape: fullgraph, static shapes; Inductor's `options`) and eager elsewhere. If
    compiling fails (no working Triton, say), it warns once and every such function stays eager: slower, same
    result."""
    name = fn.__name__

    def run(x: torch.Tensor, *args):
        if x.device.type != "cuda" or _compiled.get("failed"):
            return fn(x, *args)
        if name not in _compiled:
            _compiled[name] = torch.compile(fn, dynamic=False, fullgraph=True, options=options or None)
        try:
            return _compiled[name](x, *args)
        except Exception as e:  # the compiler stack raises many types; eager is always a correct fallback
            warnings.warn(f"device augmentation runs eager: torch.compile failed ({type(e).__name__}: {str(e)[:200]})")
            _compiled["failed"] = True
            return fn(x, *args)

    return run


def work_dtype(device: torch.device) -> torch.dtype:
    """fp16 on CUDA (half the bytes of these bandwidth-bound ops); fp32 elsewhere (the exact reference)."""
    return torch.float16 if device.type == "cuda" else torch.float32


def jittered_and_blurred(images: torch.Tensor, p: dict, out_size: int, dtype: torch.dtype = torch.float32,
                         blur_rows: int | None = None):
    """Row i of `p` (host tensors or arrays) applied to images[i] (uint8 m x 3 x S x S on the device) up to the
    blur: (views m x 3 x out x out in [0, 1] of `dtype`, laid out as `rows_layout`; the solarize column (m, 1)).
    blur_rows: only the first this many images go through the blur's products (`blurred_first` puts every image
    that drew the blur there; 0 skips them, for views whose recipe never blurs); None: every image."""
    table, at = _plan(p, out_size)
    rows = len(table) if blur_rows is None else blur_rows
    return from_table(images, to_device(torch.from_numpy(table), images.device), at, out_size, dtype, rows)


def from_table(images: torch.Tensor, t: torch.Tensor, at: dict, out_size: int, dtype: torch.dtype, blur_rows: int):
    """`jittered_and_blurred` from `_plan`'s table already on the device, the first `blur_rows` images blurred:
    device work only, no host sync. Every image goes through every op (identities where it draws none), so the
    kernels, their shapes and their number are the same for every batch of m images with the same blur_rows, and
    one CUDA graph can replay them (ViewGraph)."""
    m, _, src, _ = images.shape

    def col(name: str) -> torch.Tensor:
        return t[:, at[name]]

    # crop + resize + flip, rows first: (Wy @ img rows) then columns @ Wx^T, 1/255 folded into Wx. The image is
    # laid out (m, S, 3, S) so both passes are plain batched matmuls; the result is a (m, 3, out, out) view.
    wy, wx = _crop_matrices(col("crop"), col("flip")[:, 0], src, out_size, dtype)
    rows = _as_rows(images, dtype).view(m, src, 3 * src)
    x = torch.bmm(wy, rows).view(m, out_size * 3, src)
    x = torch.bmm(x, wx.transpose(1, 2)).view(m, out_size, 3, out_size).permute(0, 2, 1, 3)
    x = _colour(x, col("a"), col("sat"), col("con"), col("hue_on"), col("hue"), col("gray"))
    k = blur_rows
    if not k:
        return x, col("solarize")
    # Blur, the same two products on the same layout, for the first k images: an image among them that drew no
    # blur gets the identity kernel, which leaves it as it was, bit for bit, and so do the images after them, which
    # skip the products. reshape copies only if the compiler chose another layout for colour's output.
    # built in dtype, half the bytes in fp16: at most two taps land on one entry (the reflect padding), so the
    # order the scatter adds them in cannot change the sum
    b = blur_matrices(col("blur")[:k].to(dtype), out_size)
    rows = x.permute(0, 2, 1, 3).reshape(m, out_size, 3 * out_size)
    y = torch.bmm(b, rows[:k]).view(k, out_size * 3, out_size)
    if k == m:
        x = torch.bmm(y, b.transpose(1, 2))
    else:  # the second product over the first k images, which the first has read; the rest stay as they are
        x = rows.view(m, out_size * 3, out_size)
        torch.bmm(y, b.transpose(1, 2), out=x[:k])
    return x.view(m, out_size, 3, out_size).permute(0, 2, 1, 3), col("solarize")


def blurred_first(idx: torch.Tensor, p: dict) -> tuple[torch.Tensor, dict, int, np.ndarray]:
    """The rows of a batch of views reordered so that every image that drew the blur comes first: (idx and p in
    that order, how many drew it, and `back`: views[back] puts the views made in that order back in idx's order).
    Only those images need the blur's two products: the others would pass through them unchanged (the identity
    kernel), and SimCLR blurs half its views, BYOL 55 %."""
    drew = np.asarray(p["blur"], bool).reshape(-1)
    first = np.argsort(~drew, kind="stable")
    return idx[torch.from_numpy(first)], {k: np.asarray(v)[first] for k, v in p.items()}, int(drew.sum()), \
        np.argsort(first)


def blur_cover(probs, images: int) -> int:
    """How many rows, from the first, a side's CUDA graph puts through the blur: `probs` holds the chance to draw
    it of each of the side's views, each view made for `images` images. The count drawn is a sum of such draws,
    and its mean + 5 standard deviations is passed by fewer than 2 batches in a million (binomial tails: SimCLR's
    1.7e-7, BYOL's 1.5e-6, docs/benchmarks.md), which are made eager; the rows past the count carry the identity
    kernel, bit for bit. 0 for a side that never blurs. One number per side, so its graph is captured once, at the
    first batch (ViewGraph says why never later)."""
    probs = np.asarray(probs, np.float64)
    if not probs.any():
        return 0
    mean, var = images * probs.sum(), images * (probs * (1 - probs)).sum()
    return min(images * len(probs), int(np.ceil(mean + 5 * np.sqrt(var))))


class ViewGraph:
    """CUDA: `from_table` for batches of one shape, captured once as a CUDA graph and replayed for each batch. At
    small image sizes the host's launches, not the GPU, bound the views, and on the same host as the training
    step's launches they slow the step (docs/benchmarks.md); a replay is one launch for all of them. Fill `batch`
    and `table` (the graph's inputs), then call; the outputs are overwritten by the next call, so the caller
    reads them on the same stream before it (`finish` does, writing the views into a tensor of their own).

    Captured at the first batch only, which `ahead` makes on the calling thread before training starts: a capture
    switches the default CUDA generator into capture mode for every thread, so one on the views' worker thread
    beside a training step that draws random numbers (stochastic depth: EfficientNet, ConvNeXt) fails that step
    ("Offset increment outside graph capture"). Hence one graph per side, blurring a fixed number of rows
    (`blur_cover`), not one per count drawn."""

    def __init__(self, batch_shape: tuple, width: int, at: dict, out_size: int, dtype: torch.dtype, blur_rows: int,
                 device: torch.device):
        self.batch = torch.zeros(batch_shape, dtype=torch.uint8, device=device)
        self.table = torch.zeros(batch_shape[0], width, device=device)
        self.table[:, at["crop"]] = torch.tensor([0.0, 0.0, batch_shape[-1], batch_shape[-1]], device=device)  # a valid crop
        self.args = (at, out_size, dtype, blur_rows)
        from_table(self.batch, self.table, *self.args)  # warm-up outside the capture: compiles colour(), sets up cuBLAS
        self.graph = torch.cuda.CUDAGraph()
        # A stream of its own, whichever stream the caller is on: torch refuses a capture on the default stream (a
        # probe's or a test's), and torch's shared capture stream may be capturing the training step's graphs on
        # the training thread at the same time. thread_local: the training thread may allocate while this thread
        # captures (its own calls are the ones that must not touch the allocator's or the driver's state then).
        # A replay runs on the caller's current stream, whichever stream captured it.
        with torch.cuda.graph(self.graph, stream=torch.cuda.Stream(device), capture_error_mode="thread_local"):
            self.out = from_table(self.batch, self.table, *self.args)

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.graph.replay()
        return self.out


_graphs: dict = {}  # (device, batch shape, out size, dtype, blur rows) -> ViewGraph: captured once per process


def forget_graphs() -> None:
    """Drop every ViewGraph: the next call captures afresh, from the caller's stream (a test's, a probe's)."""
    _graphs.clear()


def graphed_views(batch_of, p: dict, out_size: int, dtype: torch.dtype, blur_rows: int, shape: tuple,
                  device: torch.device):
    """`jittered_and_blurred` (the first blur_rows images blurred) through the ViewGraph of this shape and
    blur_rows: `batch_of(buffer)` writes the batch's uint8 images into the graph's input buffer."""
    table, at = _plan(p, out_size)
    key = (device, shape, out_size, dtype, blur_rows)
    if key not in _graphs:
        _graphs[key] = ViewGraph(shape, table.shape[1], at, out_size, dtype, blur_rows, device)
    g = _graphs[key]
    batch_of(g.batch)
    g.table.copy_(torch.from_numpy(table).pin_memory(), non_blocking=True)
    return g()


def as_rows(images: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 (m, 3, S, S) -> `dtype` laid out (m, S, 3, S), what the resize's row product reads. Compiled on CUDA,
    where torch's own copy kernel reads the channel planes strided: 0.34 ms for SimCLR's 512 views of 256 px images
    on an H200, against 0.07 ms for the tiled kernel the compiler writes (benchmarks/results/h200-views-passes/).
    One copy, cast and layout together: `.to(dtype)` alone keeps the permuted strides, and a `.contiguous()` after it
    would copy a second time where this runs eager (CPU, MPS)."""
    return images.permute(0, 2, 1, 3).to(dtype, memory_format=torch.contiguous_format)


def solarized(x: torch.Tensor, solarize: torch.Tensor) -> torch.Tensor:
    """Solarize (1 - x at and above one half) the images whose column is set."""
    return torch.where((solarize[:, :, None, None] > 0) & (x >= 0.5), 1 - x, x)


def apply_views(images: torch.Tensor, p: dict, out_size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Row i of `p` applied to images[i] (uint8 m x 3 x S x S on the device); returns m x 3 x out x out in [0, 1]
    of `dtype`, not normalised, as augment.apply_view would for each image."""
    return solarized(*jittered_and_blurred(images, p, out_size, dtype))


def standardise(x: torch.Tensor, solarize: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                channels_last: bool, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Solarize, then x * scale + shift as fp32, written in the memory format the model wants: one pass on CUDA.
    rows (int64, optional): output image i is x's image rows[i] (views made in another order, put back)."""
    if rows is not None:
        x, solarize = x.index_select(0, rows), solarize.index_select(0, rows)
    y = torch.addcmul(shift, solarized(x, solarize).float(), scale)
    return y.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@functools.lru_cache(maxsize=None)
def _standardisation(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(1 / std, -mean / std) as (1, 3, 1, 1) tensors on `device`, made once: per batch they were four more
    launches on a host-bound step. Shared: never modify them in place."""
    scale = 1.0 / augment.device_constant(augment.STD, device).view(1, 3, 1, 1)
    return scale, -augment.device_constant(augment.MEAN, device).view(1, 3, 1, 1) * scale


def finish(x: torch.Tensor, solarize: torch.Tensor, channels_last: bool,
           rows: torch.Tensor | None = None) -> torch.Tensor:
    """The views the model reads: solarized where drawn, then (x - mean) / std (ImageNet's, as every path uses);
    rows: as `standardise`'s (the views of `blurred_first`'s order put back)."""
    return _standardise(x, solarize, *_standardisation(x.device), channels_last, rows)


_colour_compiled = _on_cuda_compiled(colour)


def _colour(x: torch.Tensor, *args: torch.Tensor) -> torch.Tensor:
    """colour(): on CUDA as the two Triton kernels of train/colour_kernel.py (two passes over the batch where the
    compiled colour() makes a dozen); if they cannot run (no Triton), compiled, with one warning; elsewhere eager."""
    if x.device.type == "cuda" and not _compiled.get("no colour kernels"):
        try:
            from train import colour_kernel
            return colour_kernel.colour(x, *args)
        except Exception as e:  # an import or a Triton compile error: the compiled colour() is a correct fallback
            warnings.warn(f"colour jitter runs compiled: its Triton kernels failed ({type(e).__name__}: {str(e)[:200]})")
            _compiled["no colour kernels"] = True
    return _colour_compiled(x, *args)


# Inductor's coordinate-descent tuning: the pass is a transpose from the resize's layout to channels last, and the
# default config ran it at under half an H100's bandwidth (0.307 ms for SimCLR's 512 views at 224 px), the tuned one
# at 0.180 ms (benchmarks/results/h100-views-blurred-first/)
_standardise = _on_cuda_compiled(standardise, coordinate_descent_tuning=True)
_as_rows = _on_cuda_compiled(as_rows)
_crop_matrices = _on_cuda_compiled(crop_matrices)


def side_views(images: torch.Tensor, idx: torch.Tensor, p: dict, out_size: int, cover: int, dtype: torch.dtype,
               channels_last: bool, device: torch.device, graphs: bool = False) -> torch.Tensor:
    """The views of one side for the images `idx` (host int64) picks, row i of `p` for image idx[i], normalised
    as the model reads them: what a step's batch holds for the views of that side. `images` on the device or on
    the host; cover: the side's `blur_cover` (0: it never blurs); graphs (CUDA): through the ViewGraph of this
    shape, whose blur covers that many rows."""

    def batch_of(out=None):
        if images.device.type == device.type:
            return torch.index_select(images, 0, to_device(idx, device), out=out)
        if out is None:
            return to_device(images[idx], device)
        return out.copy_(images[idx].pin_memory(), non_blocking=True)  # straight into the graph's input

    shape = (len(idx), *images.shape[1:])
    back, drew = None, 0
    if cover:
        idx, p, drew, back = blurred_first(idx, p)
        back = to_device(torch.from_numpy(back), device)
    if graphs and drew <= cover:
        made = graphed_views(batch_of, p, out_size, dtype, cover, shape, device)
    else:  # eager, also where more drew the blur than the graph covers: never a capture here (ViewGraph says why)
        made = jittered_and_blurred(batch_of(), p, out_size, dtype, drew)
    return finish(*made, channels_last, back)


def device_view_batches(images: torch.Tensor, recipes, out_size: int, batch_size: int, seed: int, epoch: int,
                        start_batch: int, device: torch.device, shard: tuple[int, int] = (0, 1),
                        channels_last: bool = False, graphs: bool = False):
    """Yield a list of normalised float batches on `device` per step, one per recipe at its side in a run of
    out_size px, for one epoch, from batch `start_batch` on; this process's share (rank of world) of each global
    batch. `images` may live on the device (no copy per step) or on the host (the batch's images are copied over
    each step). On CUDA, the next batches are made by a worker thread on a side stream while the caller trains
    (_made_ahead), and with `graphs` each side's views are one CUDA graph's replay (ViewGraph)."""
    graphs = graphs and device.type == "cuda"
    rank, world = shard
    per_rank = batch_size // world
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    src = images.shape[-1]
    dtype = work_dtype(device)
    order = np.asarray(augment.epoch_batches(images.shape[0], batch_size, seed, epoch), dtype=np.int64).reshape(-1, batch_size)
    sides = [view_side(r, out_size) for r in recipes]
    # The views of each side, made as one batch: every two-view method's are one side, so one pass makes both.
    by_side = [[v for v, s in enumerate(sides) if s == side] for side in dict.fromkeys(sides)]
    covers = [blur_cover([recipes[v].blur_p for v in which], per_rank) for which in by_side]

    def make(b: int) -> list[torch.Tensor]:
        drawn = draw_params(batch_size, recipes, src, seed, epoch, b)
        views: list = [None] * len(recipes)
        for which, cover in zip(by_side, covers):
            p = rows_of(drawn, which, rows)
            idx = torch.from_numpy(np.tile(order[b, rows], len(which)))  # these views of this rank's images
            x = side_views(images, idx, p, sides[which[0]], cover, dtype, channels_last, device, graphs)
            for v, part in zip(which, x.split(per_rank)):
                views[v] = part
        return views

    if device.type != "cuda":
        for b in range(start_batch, len(order)):
            yield make(b)
        return
    yield from _made_ahead(make, start_batch, len(order), device)


def _made_ahead(make, first: int, end: int, device: torch.device):
    """CUDA: batches first..end-1 of `make`, each made on a side stream by a worker thread (`ahead`) while the
    caller trains on the one before. A thread, not a second process: the views stay on the GPU. It pays because
    most of a batch's host time is spent launching kernels, which torch does with the GIL released, so the
    worker's launches run beside the training step's instead of before them: at small image sizes the host, not
    the GPU, is the limit of a step (docs/benchmarks.md)."""
    main = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    # Once: the images may just have been copied on the main stream. Not per batch: waiting for the main stream
    # there would hold each batch's views until the training step before it had finished, in series with
    # training instead of beside it.
    side.wait_stream(main)

    def made(b: int):
        with torch.cuda.stream(side):
            views = make(b)
            done = torch.cuda.Event()
            done.record(side)
        return views, done

    for views, done in ahead(made, first, end, lambda: torch.cuda.device(device)):
        main.wait_event(done)
        for x in views:
            x.record_stream(main)  # the allocator must not reuse it before the main stream is done with it
        yield views


def ahead(produce, first: int, end: int, in_worker=contextlib.nullcontext, depth: int = AHEAD):
    """Yield produce(b) for b in first..end-1, in order. The first is produced in the calling thread (so
    torch.compile compiles there); the rest by a worker thread up to `depth` items ahead of the caller. A worker's
    exception is raised in the caller; closing the generator early stops and joins the worker. `in_worker`: a
    context the worker runs in (its CUDA device: the current device is per thread)."""
    if first >= end:
        return
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            with in_worker():
                for b in range(first + 1, end):
                    if not hand_over(("item", produce(b))):
                        return
            hand_over(("end", None))
        except BaseException as e:  # handed to the caller, who raises it: a worker's error must not vanish
            hand_over(("error", e))

    kind, item = "item", produce(first)
    worker = threading.Thread(target=work, name="device-augment", daemon=True)
    worker.start()
    try:
        while kind != "end":
            if kind == "error":
                raise item
            yield item
            kind, item = ready.get()
    finally:
        stop.set()
        worker.join()
