"""Where the per-image pixel work of the CPU augmentation path runs: colour jitter, grayscale and
Gaussian blur of train/augment.apply_view.

BACKENDS:
- torch: the pixel work stays in the DataLoader worker, on uint8 images (PilPreprocess): Pillow's C ops
  where they compute what torchvision's float ops compute (colour matrices, rounded once), numpy integer
  arithmetic for hue, scipy's separable filter for blur. What torchvision does on PIL images, only closer to the
  float reference (each op within half a uint8 level of it on the same input) and faster. TorchPreprocess,
  torchvision's float ops on tensors, stays the reference the other backends are tested against
  (augment.apply_view).
- coreml: the same transforms as Core ML models (train/preprocess_models.py), called per image from the Dataset's
  __getitem__, so on a Mac the Neural Engine / GPU does the pixel work and the CPU workers only crop, flip, draw
  the parameters and shift hue (an HSV round trip with no model: it stays torch, between the Core ML calls, so
  each image's random jitter order is kept). The models compute in fp16, so views differ from the torch path's
  by fp16 rounding (bounded in tests/train/test_preprocess_models.py) and a run's losses are not the torch path's.
`resolve_backend` turns --preprocess auto|torch|coreml into a backend name and the reason for it; asking for
coreml where Core ML cannot run is a one-line error naming why.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torchvision.transforms.v2.functional as TF
from PIL import Image
from scipy import ndimage

from core import coreml_runtime
from core.errors import PipelineError
from train.configs import PREPROCESS_CHOICES as CHOICES
from core.views import HUE, blur_kernel_size

COMPUTE_UNITS = "ALL"  # Core ML places each op on the Neural Engine, GPU or CPU: the point is to spare the CPU workers
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2)


class TorchPreprocess:
    """torchvision's float ops on 3 x S x S tensors in [0, 1]: the reference (augment.apply_view). Stateless, so it
    crosses into DataLoader workers as is."""

    name = "torch"
    pixels = "float"  # what its ops take and return: float tensors (augment.apply_view makes its views)

    def color_jitter(self, x: torch.Tensor, order, brightness: float, contrast: float, saturation: float,
                     hue: float) -> torch.Tensor:
        """The four jitter ops in `order` (codes as views.JITTER_OPS), as torchvision's ColorJitter applies them."""
        for op in order:
            if op == 0:
                x = TF.adjust_brightness(x, brightness)
            elif op == 1:
                x = TF.adjust_contrast(x, contrast)
            elif op == 2:
                x = TF.adjust_saturation(x, saturation)
            else:
                x = TF.adjust_hue(x, hue)
        return x

    def grayscale(self, x: torch.Tensor) -> torch.Tensor:
        return TF.rgb_to_grayscale(x, num_output_channels=3)

    def gaussian_blur(self, x: torch.Tensor, kernel_size: int, sigma: float) -> torch.Tensor:
        return TF.gaussian_blur(x, [kernel_size, kernel_size], [sigma, sigma])


TORCH_PREPROCESS = TorchPreprocess()


def shift_hue(rgb: np.ndarray, shift: float) -> np.ndarray:
    """torchvision's adjust_hue (RGB -> HSV, rotate by `shift` turns, back) on a uint8 H x W x 3 array, in int16.
    Pillow's HSV mode (torchvision's PIL path) rounds hue, saturation and value to 8 bits each way, up to 12 levels
    off the float result; here a pixel's hue stays a position round the hexagon in units of its chroma
    d = max - min, an integer, and only the shift, 6 d * shift, is rounded: within half a level of the float
    result. A channel comes out as min + clamp(dist - d, 0, d), dist the distance round the hexagon (6 d long)
    from where that channel is lowest: 3 d for red, 5 d for green, d for blue."""
    r, g, b = rgb.transpose(2, 0, 1).astype(np.int16)
    hi = np.maximum(np.maximum(r, g), b)
    lo = np.minimum(np.minimum(r, g), b)
    d = hi - lo
    # hue in units of d: red largest -> g - b, green -> 2d + b - r, blue -> 4d + r - g; ties pick red, then green,
    # as torchvision does (grey pixels have d = 0, and any hue gives them back)
    pos = np.where(r == hi, g - b, np.where(g == hi, 2 * d + b - r, 4 * d + r - g))
    pos += np.rint(np.arange(256) * ((6.0 * shift) % 6.0)).astype(np.int16)[d]  # the shift, per chroma value
    six = 6 * d
    np.add(pos, six, out=pos, where=pos < 0)  # pos was in [-d, 11 d): now in [0, 6 d)
    np.subtract(pos, six, out=pos, where=pos >= six)
    pos -= 3 * d  # in [-3 d, 3 d): the distance from red's lowest point is |pos|
    green = np.abs(pos - 2 * d)
    np.minimum(green, six - green, out=green)  # round the hexagon, whichever way is shorter
    blue = np.abs(pos + 2 * d)
    np.minimum(blue, six - blue, out=blue)
    out = np.empty(rgb.shape, np.uint8)
    below = lo - d
    for c, dist in enumerate((np.abs(pos), green, blue)):
        dist += below  # min + clamp(dist - d, 0, d) = clamp(dist + min - d, min, max)
        np.maximum(dist, lo, out=dist)
        np.minimum(dist, hi, out=dist)
        out[..., c] = dist
    return out


def blur_kernel(kernel_size: int, sigma: float) -> np.ndarray:
    """torchvision's Gaussian kernel (kernel_size taps, renormalised) less the taps beyond 4 sigma, whose weight
    (< 7e-5 of the whole) cannot move a uint8 level: a 23-tap kernel at sigma 0.5 has 5 taps that matter."""
    half = min(kernel_size // 2, math.ceil(4 * sigma))
    x = np.arange(-half, half + 1) / sigma
    w = np.exp(-0.5 * x * x)
    return (w / w.sum()).astype(np.float32)


class PilPreprocess:
    """The same transforms on uint8 PIL images, for the training path (augment.uint8_view). Brightness, contrast,
    saturation and grayscale are affine maps of a pixel's RGB (contrast's offset from the image's mean grey, exact
    from its histogram), and Pillow's convert(matrix) applies one in a single C pass with rounding and clipping:
    torchvision's float result on the same input, rounded. Hue: shift_hue. Blur: torchvision's separable kernel
    with reflected borders, by scipy's correlate1d in float32 (one C pass per axis), rounded once: as exact as
    Pillow's GaussianBlur (three box passes, edge pixels repeated: up to 40 levels off at the borders) and no
    slower. Stateless, so it crosses into DataLoader workers as is."""

    name = "torch"  # the --preprocess choice: the pixel work stays in the CPU workers
    pixels = "uint8"  # what its ops take and return: RGB (or, after grayscale, L) PIL images

    def color_jitter(self, im: Image.Image, order, brightness: float, contrast: float, saturation: float,
                     hue: float) -> Image.Image:
        """The four jitter ops in `order` (codes as views.JITTER_OPS), as torchvision's ColorJitter applies them."""
        for op in order:
            if op == HUE:
                im = Image.fromarray(shift_hue(np.asarray(im), hue))
                continue
            f, offset, grey = brightness, 0.0, 0.0  # out_c = f * x_c + grey * gray(x) + offset
            if op == 1:
                sums = np.asarray(im.histogram(), np.float64).reshape(3, 256) @ np.arange(256)
                f, offset = contrast, (1 - contrast) * float(np.dot(GRAY, sums)) / (im.width * im.height)
            elif op == 2:
                f, grey = saturation, 1 - saturation
            im = im.convert("RGB", (f + grey * GRAY[0], grey * GRAY[1], grey * GRAY[2], offset,
                                    grey * GRAY[0], f + grey * GRAY[1], grey * GRAY[2], offset,
                                    grey * GRAY[0], grey * GRAY[1], f + grey * GRAY[2], offset))
        return im

    def grayscale(self, im: Image.Image) -> Image.Image:
        """One channel ("L"): the later ops do a third of the work, and the view is three copies of it."""
        return im.convert("L", (*GRAY, 0.0))

    def gaussian_blur(self, im: Image.Image, kernel_size: int, sigma: float) -> Image.Image:
        w = blur_kernel(kernel_size, sigma)
        x = ndimage.correlate1d(np.asarray(im), w, axis=0, mode="mirror", output=np.float32)  # mirror: torch's reflect
        x = ndimage.correlate1d(x, w, axis=1, mode="mirror")
        x += 0.5  # then truncation: rounding
        return Image.fromarray(x.astype(np.uint8))



PIL_PREPROCESS = PilPreprocess()


class CoreMLPreprocess:
    """The same transforms as Core ML models for images of one side, through core.coreml_runtime.

    The models are built (or found in the cache) when the backend is made, in the main process, so DataLoader
    workers never race to build them. A loaded MLModel cannot be pickled into a worker, so each process loads
    (compiles) its models once, on first use; pickling drops them."""

    name = "coreml"
    pixels = "float"

    def __init__(self, size: int, cache_root=None, compute_units: str = COMPUTE_UNITS):
        from train import preprocess_models as models

        self.size, self.cache_root, self.compute_units = size, cache_root, compute_units
        self.kernel_size = blur_kernel_size(size)
        self.paths = {name: models.build_cached(name, cache_root, size=size)
                      for name in ("color_jitter", "grayscale", "gaussian_blur")}
        self._loaded: dict = {}

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_loaded": {}}

    def _predict(self, key: str, x: torch.Tensor, **factors: np.ndarray) -> torch.Tensor:
        from train.preprocess_models import INPUT, OUTPUT

        model = self._loaded.get(key)
        if model is None:
            model = self._loaded[key] = coreml_runtime.coreml_load(self.paths[key], self.compute_units)
        image = np.ascontiguousarray(x.detach().to(torch.float32).numpy()[None])
        out = coreml_runtime.coreml_predict_arrays(model, {INPUT: image, **factors}, OUTPUT)
        return torch.from_numpy(np.ascontiguousarray(out.reshape(out.shape[-3:])))

    def _check(self, x: torch.Tensor, what: str) -> None:
        if tuple(x.shape) != (3, self.size, self.size):
            raise PipelineError(f"the Core ML {what} model takes 3 x {self.size} x {self.size} images, "
                                f"got {tuple(x.shape)}: make the backend for this view size")

    def color_jitter(self, x: torch.Tensor, order, brightness: float, contrast: float, saturation: float,
                     hue: float) -> torch.Tensor:
        """Each run of consecutive brightness/contrast/saturation codes in `order` is one Core ML call (the
        model's own order input keeps their order); hue runs in torch where it falls."""
        from train.preprocess_models import JITTER_SKIP

        self._check(x, "color_jitter")
        factors = {name: np.array([v], np.float32)
                   for name, v in (("brightness", brightness), ("contrast", contrast), ("saturation", saturation))}
        blends: list[int] = []
        for op in [*order, None]:  # None: the end, where a pending run is flushed
            if op is not None and op != HUE:
                blends.append(op)
                continue
            if blends:
                codes = np.array(blends + [JITTER_SKIP] * (3 - len(blends)), np.int32)
                x = self._predict("color_jitter", x, **factors, order=codes)
                blends = []
            if op == HUE:
                x = TF.adjust_hue(x, hue)
        return x

    def grayscale(self, x: torch.Tensor) -> torch.Tensor:
        self._check(x, "grayscale")
        return self._predict("grayscale", x)

    def gaussian_blur(self, x: torch.Tensor, kernel_size: int, sigma: float) -> torch.Tensor:
        self._check(x, "gaussian_blur")
        if kernel_size != self.kernel_size:
            raise PipelineError(f"the Core ML blur model for {self.size} px uses a {self.kernel_size}-px kernel "
                                f"(augment.blur_kernel_size), asked for {kernel_size}")
        return self._predict("gaussian_blur", x, sigma=np.array([sigma], np.float32))


# name -> factory(view size, cache_root) of a backend
BACKENDS = {
    "torch": lambda size, cache_root=None: PIL_PREPROCESS,
    "coreml": CoreMLPreprocess,
}


def _why_not(why: str) -> str:
    """coreml_can_predict's reason, less its advice for the validate stage (no evaluator stands in here)."""
    return why.split("; the reference evaluator")[0]


def resolve_backend(choice: str) -> tuple[str, str]:
    """--preprocess auto|torch|coreml -> (backend name, why it was picked)."""
    if choice not in CHOICES:
        raise PipelineError(f"--preprocess must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "torch":
        return "torch", "asked for"
    ok, why = coreml_runtime.coreml_can_predict()
    if choice == "coreml":
        if not ok:
            raise PipelineError(f"--preprocess coreml: Core ML cannot run here: {_why_not(why)} (use --preprocess torch or auto)")
        return "coreml", "asked for"
    if ok:
        return "coreml", "auto: Core ML can run here"
    return "torch", f"auto: Core ML cannot run here: {_why_not(why)}"


def make_backend(name: str, size: int, cache_root=None):
    return BACKENDS[name](size, cache_root=cache_root)


def for_training(choice: str, augment_mode: str, size: int, cache_root=None):
    """(backend, note for the log line) for pretraining. The backends serve the per-image CPU path only: with
    --augment device the views are made batched on the device and no backend is used."""
    name, why = resolve_backend(choice)  # coreml where Core ML cannot run fails here, whatever the augment mode
    if augment_mode != "cpu":
        if choice == "coreml":
            raise PipelineError("--preprocess coreml serves the per-image CPU augmentation: add --augment cpu "
                                f"(--augment {augment_mode} makes the views batched on the training device)")
        return TORCH_PREPROCESS, f"unused (--augment {augment_mode})"
    return make_backend(name, size, cache_root), f"{name} ({why})"
