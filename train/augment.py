"""SSL augmentation with per-sample random parameters, on the CPU: each image's views as its method declares
them (two for SimCLR, BYOL and MoCo v3; a multi-crop method's smaller ones at their own size).

Parameters are drawn first (`sample_params`, one row per image) and applied second (`apply_view`), so any other
applier (the device path) can reuse the exact same draws and be checked against this one pixel for pixel. The
draws for an image depend only on (seed, epoch, index): results do not depend on worker count, and a resumed run
sees the same views as an uninterrupted one.

`apply_view` is the float reference (torchvision's ops on tensors). Training's per-image path makes its views with
`uint8_view` instead: the same row of parameters applied to uint8 PIL images by Pillow's C ops, as
torchvision does on PIL images, within a few uint8 levels of the reference and several times faster; blur is
Pillow's box-approximated Gaussian (tests/train/test_augment.py bounds both).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF
from PIL import Image

from train.methods import METHODS
from train.preprocess import PIL_PREPROCESS, TORCH_PREPROCESS
from core.views import MEAN, STD, ViewRecipe, blur_kernel_size, view_side


def recipes_for(method: str, image_size: int) -> tuple[ViewRecipe, ...]:
    """Each paper's views (its spec's); blur is dropped from a view of <= 64 px, as SimCLR's CIFAR setup does (it
    erases small images)."""
    return tuple(ViewRecipe(**{**v.__dict__, "blur_p": 0.0}) if view_side(v, image_size) <= 64 else v
                 for v in METHODS[method].views)


def view_sizes(method: str, image_size: int) -> tuple[int, ...]:
    """The side of each of the method's views in a run of image_size px, in the order its forward receives them."""
    return tuple(view_side(v, image_size) for v in METHODS[method].views)


CROP_TRIES = 10  # RandomResizedCrop's tries of (area, aspect) per image, as torchvision's
# How many numbers of the stream each parameter takes per image, in the order they are drawn: the one layout both
# draw_views (per batch) and sample_row (per image) read the stream by.
DRAWS = {"scale": CROP_TRIES, "ratio": CROP_TRIES, "top": 1, "left": 1, "flip": 1, "jitter": 1, "brightness": 1,
         "contrast": 1, "saturation": 1, "hue": 1, "jitter_order": 4, "gray": 1, "blur": 1, "sigma": 1, "solarize": 1}
SPAN = {k: slice(at, at + width)  # where each parameter's numbers sit in one image's row
        for (k, width), at in zip(DRAWS.items(), itertools.accumulate(DRAWS.values(), initial=0))}
ROW_DRAWS = sum(DRAWS.values())  # the numbers one image's view takes from its generator
# sample_row's single numbers, read by name in one C call (it runs per image and view): their order here is the
# order sample_row unpacks them in, whatever DRAWS' order
ROW_SINGLES = operator.itemgetter(*(SPAN[k].start for k in ("top", "left", "flip", "jitter", "brightness", "contrast",
                                                           "saturation", "hue", "gray", "blur", "sigma", "solarize")))


@functools.lru_cache(maxsize=64)
def _draw_constants(recipes: tuple[ViewRecipe, ...]) -> dict[str, np.ndarray]:
    """Each view's bounds (lo, hi - lo) and probabilities as arrays with the view first, made once per recipes: the
    device path draws every step, and rebuilding them was a tenth of its host time."""
    def span(lo_hi: list, dims: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = np.array(lo_hi, dtype=np.float64).T.reshape(2, len(recipes), *[1] * dims)
        return lo, hi - lo

    spans = {
        "scale": span([r.crop_scale for r in recipes], 2),
        "ratio": span([(math.log(r.crop_ratio[0]), math.log(r.crop_ratio[1])) for r in recipes], 2),
        "brightness": span([(1 - r.brightness, 1 + r.brightness) for r in recipes], 1),
        "contrast": span([(1 - r.contrast, 1 + r.contrast) for r in recipes], 1),
        "saturation": span([(1 - r.saturation, 1 + r.saturation) for r in recipes], 1),
        "hue": span([(-r.hue, r.hue) for r in recipes], 1),
        "sigma": span([r.blur_sigma for r in recipes], 1),
    }
    ps = {p: np.array([getattr(r, p) for r in recipes], dtype=np.float64)[:, None]
          for p in ("flip_p", "jitter_p", "gray_p", "blur_p", "solarize_p")}
    return {**spans, **ps}


def draw_views(n: int, recipes, src_size: int, g: np.random.Generator) -> dict[str, np.ndarray]:
    """Per-image random parameters of each recipe's view for n square images of side src_size: each parameter an
    array with the view first (views x n x ...). View v's parameters are the ROW_DRAWS * n numbers of g after view
    v-1's, in the order one view draws them one parameter at a time (tests/train/test_augment.py keeps that naive
    form as the reference); the views are computed together in one numpy pass each, since at a step's sizes numpy's
    per-call cost, not its arithmetic, is the time, and the device path pays it on the host every step."""
    recipes = tuple(recipes)
    views, draws, c = len(recipes), g.random((len(recipes), ROW_DRAWS * n)), _draw_constants(recipes)

    def drawn(name: str) -> np.ndarray:  # the draws of `name` for every image of every view: views x n (x its width)
        span, width = SPAN[name], DRAWS[name]
        x = draws[:, n * span.start:n * span.stop].reshape(views, n, width)
        return x[..., 0] if width == 1 else x

    def between(name: str, x: np.ndarray) -> np.ndarray:  # lo + (hi - lo) * x, each view its own (lo, hi)
        lo, width = c[name]
        return lo + width * x

    # RandomResizedCrop: ten tries of (area, aspect) per image, the first that fits wins, else the whole image.
    area = src_size * src_size
    scale = between("scale", drawn("scale"))
    ratio = np.exp(between("ratio", drawn("ratio")))
    w = np.round(np.sqrt(area * scale * ratio))
    h = np.round(np.sqrt(area * scale / ratio))
    fits = (w > 0) & (h > 0) & (w <= src_size) & (h <= src_size)
    first, found = fits.argmax(-1).ravel(), fits.any(-1)
    every = np.arange(views * n)
    w = np.where(found, w.reshape(-1, CROP_TRIES)[every, first].reshape(views, n), float(src_size))
    h = np.where(found, h.reshape(-1, CROP_TRIES)[every, first].reshape(views, n), float(src_size))
    top = np.floor(drawn("top") * (src_size - h + 1))
    left = np.floor(drawn("left") * (src_size - w + 1))
    return {
        "crop": np.stack([top, left, h, w], -1).astype(np.int64),
        "flip": drawn("flip") < c["flip_p"],
        "jitter": drawn("jitter") < c["jitter_p"],
        **{k: between(k, drawn(k)).astype(np.float32) for k in ("brightness", "contrast", "saturation", "hue")},
        "jitter_order": drawn("jitter_order").argsort(-1),  # n uniform random orders of the 4 jitter ops
        "gray": drawn("gray") < c["gray_p"],
        "blur": drawn("blur") < c["blur_p"],
        "sigma": between("sigma", drawn("sigma")).astype(np.float32),
        "solarize": drawn("solarize") < c["solarize_p"],
    }


def sample_params(n: int, recipe: ViewRecipe, src_size: int, g: np.random.Generator) -> dict[str, torch.Tensor]:
    """Per-image random parameters for one view of n square images of side src_size (draw_views of one view), as
    tensors. Drawn with numpy: many small draws cost far less in numpy than as torch's small-tensor ops."""
    return {k: torch.from_numpy(v[0]) for k, v in draw_views(n, [recipe], src_size, g).items()}


def sample_row(recipe: ViewRecipe, src_size: int, g: np.random.Generator) -> dict:
    """sample_params(1, recipe, src_size, g) as plain Python numbers, from the same draws of g in the same order
    (tests/train/test_augment.py checks they are equal): the per-image path draws one row per view, and
    sample_params' numpy calls (draw_views of one view) cost as much as a 32 px view's pixels. The crop tries are
    tried one at a time (the first usually fits); math's exp and sqrt, like numpy's, are IEEE double."""
    u = g.random(ROW_DRAWS).tolist()  # PCG64: one double per 64-bit output, so one call of N = N calls of one
    area = src_size * src_size
    lo, hi = math.log(recipe.crop_ratio[0]), math.log(recipe.crop_ratio[1])
    h = w = float(src_size)  # no try fits: the whole image
    scales, ratios = u[SPAN["scale"]], u[SPAN["ratio"]]
    for t in range(CROP_TRIES):
        scale = recipe.crop_scale[0] + (recipe.crop_scale[1] - recipe.crop_scale[0]) * scales[t]
        ratio = math.exp(lo + (hi - lo) * ratios[t])
        tw, th = round(math.sqrt(area * scale * ratio)), round(math.sqrt(area * scale / ratio))  # half to even, as np.round
        if 0 < tw <= src_size and 0 < th <= src_size:
            h, w = float(th), float(tw)
            break
    top_u, left_u, flip, jitter, bright, contrast, sat, hue, gray, blur, sigma, solarize = ROW_SINGLES(u)
    order = u[SPAN["jitter_order"]]

    def between(span: tuple[float, float], x: float) -> float:  # sample_params' u(), then its float32 rounding
        return float(np.float32(span[0] + (span[1] - span[0]) * x))

    return {
        "crop": (math.floor(top_u * (src_size - h + 1)), math.floor(left_u * (src_size - w + 1)), int(h), int(w)),
        "flip": flip < recipe.flip_p,
        "jitter": jitter < recipe.jitter_p,
        "brightness": between((1 - recipe.brightness, 1 + recipe.brightness), bright),
        "contrast": between((1 - recipe.contrast, 1 + recipe.contrast), contrast),
        "saturation": between((1 - recipe.saturation, 1 + recipe.saturation), sat),
        "hue": between((-recipe.hue, recipe.hue), hue),
        "jitter_order": sorted(range(4), key=order.__getitem__),  # argsort
        "gray": gray < recipe.gray_p,
        "blur": blur < recipe.blur_p,
        "sigma": between(recipe.blur_sigma, sigma),
        "solarize": solarize < recipe.solarize_p,
    }


def row_params(row: dict) -> dict[str, torch.Tensor]:
    """A sample_row as sample_params' one-row tensors, for apply_view."""
    return {k: torch.tensor([v]) for k, v in row.items()}


_SOLARIZE = [255 - v if v >= 128 else v for v in range(256)]  # x >= 0.5 -> 1 - x, on levels (exact)


def uint8_view(img: torch.Tensor, row: dict, out_size: int, ops=PIL_PREPROCESS) -> torch.Tensor:
    """A sample_row applied to one uint8 3xSxS image with uint8 ops (`ops`: preprocess.PilPreprocess); returns uint8
    3 x out x out, what (apply_view(...) * 255).round() gives within a few levels (tests/train/test_augment.py).
    Crop and resize by torch's uint8 antialiased bilinear kernel (the reference's filter, vectorised for uint8
    channels-last: 3x Pillow's speed), then Pillow images for the rest."""
    top, left, h, w = row["crop"]
    x = img[None, :, top:top + h, left:left + w].contiguous(memory_format=torch.channels_last)
    if (h, w) != (out_size, out_size):
        x = F.interpolate(x, size=(out_size, out_size), mode="bilinear", antialias=True)
    hwc = x[0].permute(1, 2, 0).numpy()  # channels-last memory: already H x W x 3
    im = Image.fromarray(hwc[:, ::-1] if row["flip"] else hwc)  # one copy either way
    if row["jitter"]:
        im = ops.color_jitter(im, row["jitter_order"], row["brightness"], row["contrast"], row["saturation"], row["hue"])
    if row["gray"]:
        im = ops.grayscale(im)
    if row["blur"]:
        im = ops.gaussian_blur(im, blur_kernel_size(out_size), row["sigma"])
    if row["solarize"]:
        im = im.point(_SOLARIZE * len(im.getbands()))
    out = torch.from_numpy(np.array(im))
    return out.expand(3, *out.shape) if out.dim() == 2 else out.permute(2, 0, 1)


def apply_view(img: torch.Tensor, p: dict[str, torch.Tensor], i: int, out_size: int,
               preprocess=TORCH_PREPROCESS) -> torch.Tensor:
    """Apply row i of `p` to one uint8 3xSxS image; returns float 3 x out x out in [0, 1] (not normalised).
    Jitter, grayscale and blur run on the `preprocess` backend (train/preprocess.py: torchvision, or Core ML)."""
    top, left, h, w = (int(v) for v in p["crop"][i])
    x = TF.resized_crop(img.float() / 255.0, top, left, h, w, [out_size, out_size], antialias=True).clamp_(0, 1)
    if p["flip"][i]:
        x = TF.horizontal_flip(x)
    if p["jitter"][i]:
        x = preprocess.color_jitter(x, p["jitter_order"][i].tolist(), float(p["brightness"][i]),
                                    float(p["contrast"][i]), float(p["saturation"][i]), float(p["hue"][i]))
    if p["gray"][i]:
        x = preprocess.grayscale(x)
    if p["blur"][i]:
        x = preprocess.gaussian_blur(x, blur_kernel_size(out_size), float(p["sigma"][i]))
    if p["solarize"][i]:
        x = TF.solarize(x, threshold=0.5)
    return x


def view_seed(seed: int, epoch: int, index: int) -> int:
    """A distinct, reproducible stream per (run seed, epoch, image)."""
    return ((seed * 1_000_003 + epoch) * 10_000_019 + index) % (1 << 63)  # numpy seeds must be non-negative


class ViewDataset(torch.utils.data.Dataset):
    """Item i -> one uint8 view of image indices[i] per recipe, each at its recipe's side in a run of out_size px
    (uint8 keeps the host->device copy 4x smaller). A uint8 backend (the default) makes them with uint8_view; a
    float one (Core ML) with apply_view, rounded."""

    def __init__(self, images: torch.Tensor, recipes: tuple[ViewRecipe, ...], out_size: int, seed: int, epoch: int,
                 preprocess=PIL_PREPROCESS):
        self.images, self.recipes, self.out_size, self.seed, self.epoch = images, recipes, out_size, seed, epoch
        self.sides = [view_side(r, out_size) for r in recipes]
        self.preprocess = preprocess  # where jitter, grayscale and blur run (train/preprocess.py)

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, index: int):
        g = np.random.default_rng(view_seed(self.seed, self.epoch, index))
        img = self.images[index]
        views = []
        for recipe, side in zip(self.recipes, self.sides):
            row = sample_row(recipe, img.shape[-1], g)
            if self.preprocess.pixels == "uint8":
                views.append(uint8_view(img, row, side, self.preprocess))
            else:
                x = apply_view(img, row_params(row), 0, side, self.preprocess)
                views.append((x * 255).round_().to(torch.uint8))
        return tuple(views)


@functools.lru_cache(maxsize=None)
def device_constant(values: tuple[float, ...], device: torch.device) -> torch.Tensor:
    """A small constant tensor, made once per device: `torch.tensor(..., device=cuda)` copies from pageable host
    memory, and such a copy first waits for all queued GPU work, stalling the pipeline every batch. Never modify
    the result in place: it is shared."""
    return torch.tensor(values, device=device)


def normalize(x_uint8_or_float: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 (0..255) or float (0..1) NCHW -> normalised float32 on `device`."""
    x = x_uint8_or_float.to(device, non_blocking=True)
    x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    mean = device_constant(MEAN, x.device).view(1, 3, 1, 1)
    std = device_constant(STD, x.device).view(1, 3, 1, 1)
    return (x - mean) / std


def center_views(images: torch.Tensor, out_size: int) -> torch.Tensor:
    """Evaluation view: center crop of out_size from the stored square (resize when the store is smaller)."""
    if images.shape[-1] < out_size:
        return TF.resize(images, [out_size, out_size], antialias=True)
    return TF.center_crop(images, [out_size, out_size])


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A CPU generator of this run's epoch alone, never torch's global one (whose state the run's random ops use)."""
    return torch.Generator().manual_seed(seed * 7919 + epoch)


def epoch_batches(n: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's shuffled batches (last partial batch dropped: contrastive losses want full batches)."""
    order = torch.randperm(n, generator=epoch_generator(seed, epoch)).tolist()
    return [order[i : i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]


def cpu_view_batches(images: torch.Tensor, recipes, out_size: int, batch_size: int, seed: int, epoch: int,
                     start_batch: int, device: torch.device, num_workers: int, shard: tuple[int, int] = (0, 1),
                     channels_last: bool = False, preprocess=PIL_PREPROCESS):
    """Yield a list of normalised float batches on `device` per step, one per recipe, for one epoch, from batch
    `start_batch` on; this process's share (rank of world) of each global batch. Per-sample augmentation runs in
    DataLoader workers; this is the reference path and the CPU fallback."""
    rank, world = shard
    per_rank = batch_size // world
    batches = [b[rank * per_rank:(rank + 1) * per_rank]
               for b in epoch_batches(images.shape[0], batch_size, seed, epoch)[start_batch:]]
    if not batches:
        return
    ds = ViewDataset(images, recipes, out_size, seed, epoch, preprocess)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=batches, num_workers=num_workers,
        pin_memory=device.type == "cuda",  # pinned memory is a CUDA concept; elsewhere it only costs
        prefetch_factor=4 if num_workers > 0 else None,
        # Its own generator: each iterator draws its workers' base seed from it, and from torch's global one
        # without it. A resumed run's iterator starts mid-epoch, where the uninterrupted run made none, and that
        # extra draw would shift the global generator that the backbone's random ops (stochastic depth) use.
        generator=epoch_generator(seed, epoch),
    )
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for views in loader:
        yield [normalize(v, device).contiguous(memory_format=fmt) for v in views]
