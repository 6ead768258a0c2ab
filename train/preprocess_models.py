"""Core ML preprocessing models: the per-image pixel work of the CPU augmentation path as small ML Programs, so a
Dataset's __getitem__ on a Mac can hand it to the Neural Engine / GPU instead of the CPU workers.

Each model is written with coremltools' MIL builder from torchvision's definition of the same transform
(`train.preprocess.TorchPreprocess` is the reference it is tested against), for one fixed image side: the random
draws (blur sigma, jitter factors and their order) are inputs drawn in Python, so a model is a pure function of its
inputs. Only ops the reference evaluator (export/mil_eval.py) runs are used, so each model is checked on Linux.

Tensors: image in and out as fp32 1 x 3 x S x S (values 0..1); each factor an fp32 (1,). Compute in fp16, what the
Neural Engine computes in, except the blur kernel (k numbers: free) and the contrast mean, a sum over every pixel
(50k at 224 px) that fp16 would round far coarser than the pixels themselves: both stay fp32.

`build_cached(name, **dims)` writes ~/.cache/ssl-edge-pipeline/preprocess/<name>-<dims>-<hash>.mlpackage once
(atomically, one builder at a time); the hash covers this file and the coremltools version, so a changed builder
never serves a stale model.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import numpy as np

from core.errors import PipelineError
from core.views import JITTER_OPS, blur_kernel_size

INPUT = "image"
OUTPUT = "output"
GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights (ITU-R 601-2)
BLEND_OPS = JITTER_OPS[:3]  # the jitter ops color_jitter computes, by their codes in the draws (hue stays in torch)
JITTER_SKIP = len(JITTER_OPS)  # an `order` code no jitter op has: a round that leaves the image as it is
FP32_PREFIX = "fp32_"  # ops named so stay fp32 in the fp16 program
DEPLOYMENT_TARGET = "macOS13"  # its opset (iOS16) holds every op used here; the models only ever run on a training Mac
CACHE_ENV = "SSL_EDGE_CACHE"  # overrides the cache root (default ~/.cache/ssl-edge-pipeline)


def _ct():
    from core.quiet import import_coremltools

    return import_coremltools()


def _target():
    return getattr(_ct().target, DEPLOYMENT_TARGET)


def _specs(size: int, factors: tuple[str, ...] = ()):
    from coremltools.converters.mil import Builder as mb

    return [mb.TensorSpec(shape=(1, 3, size, size))] + [mb.TensorSpec(shape=(1,)) for _ in factors]


def reflect_index(size: int, pad: int) -> np.ndarray:
    """Source pixel of each position of a row padded by `pad` on both sides, reflect mode (edge not repeated), as
    torch's pad(mode="reflect") that torchvision's gaussian_blur uses. A gather with it pads inside the model."""
    j = np.abs(np.arange(-pad, size + pad))
    return np.where(j >= size, 2 * (size - 1) - j, j).astype(np.int32)


def _grey(mb, x, name: str):
    """1 x 1 x S x S luma: one 1x1 conv with torchvision's weights."""
    return mb.conv(x=x, weight=np.array(GRAY, np.float32).reshape(1, 3, 1, 1), name=name)


def gaussian_blur(size: int):
    """image, sigma -> torchvision's gaussian_blur with the training kernel (augment.blur_kernel_size): the kernel
    exp(-t^2 / (2 sigma^2)) / sum over t = -k//2..k//2 is computed from sigma inside, then applied as two depthwise
    convs (rows, then columns) over reflect padding. torchvision convolves once with the outer product of the same
    1-D kernel: the same sum, in another order. The result is clipped to 0..1, where torchvision's already is."""
    from coremltools.converters.mil import Builder as mb

    k = blur_kernel_size(size)
    half = k // 2
    pad = reflect_index(size, half)
    taps = np.arange(-half, half + 1, dtype=np.float32)  # torchvision: linspace(-(k-1)/2, (k-1)/2, k), the same

    @mb.program(input_specs=_specs(size, ("sigma",)), opset_version=_target())
    def prog(image, sigma):
        z = mb.real_div(x=taps, y=sigma, name=FP32_PREFIX + "z")
        pdf = mb.exp(x=mb.mul(x=mb.mul(x=z, y=z, name=FP32_PREFIX + "z2"), y=np.float32(-0.5), name=FP32_PREFIX + "e"),
                     name=FP32_PREFIX + "pdf")
        total = mb.reduce_sum(x=pdf, axes=[0], keep_dims=True, name=FP32_PREFIX + "sum")
        kernel = mb.real_div(x=pdf, y=total, name=FP32_PREFIX + "kernel")
        across = mb.tile(x=mb.reshape(x=kernel, shape=[1, 1, 1, k]), reps=[3, 1, 1, 1])  # one filter per channel
        down = mb.reshape(x=across, shape=[3, 1, k, 1])
        x = mb.gather(x=mb.gather(x=image, indices=pad, axis=3), indices=pad, axis=2)
        x = mb.conv(x=mb.conv(x=x, weight=across, groups=3, pad_type="valid"), weight=down, groups=3, pad_type="valid")
        # fp16 taps may sum to a hair over 1: keep the image in 0..1, or 255.5 would wrap to 0 as uint8
        return mb.clip(x=x, alpha=np.float32(0), beta=np.float32(1), name=OUTPUT)

    return prog


def color_jitter(size: int):
    """image, brightness, contrast, saturation, order -> torchvision's adjust_brightness / adjust_contrast /
    adjust_saturation, in the order given: order (3,) int32 holds the op of each round (0 brightness, 1 contrast,
    2 saturation, JITTER_SKIP none). All three are one blend y = clamp(a*x + s*grey(x) + c*mean(grey(x)), 0, 1):
    brightness a=f; contrast a=f, c=1-f; saturation a=f, s=1-f; none a=1 (x itself). Each round computes the
    blend with the coefficients its order code selects, so any order runs in one call with no control flow."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import types

    specs = _specs(size, BLEND_OPS) + [mb.TensorSpec(shape=(3,), dtype=types.int32)]

    @mb.program(input_specs=specs, opset_version=_target())
    def prog(image, brightness, contrast, saturation, order):
        x = image
        for r in range(3):
            op = mb.slice_by_index(x=order, begin=[r], end=[r + 1])
            is_b, is_c, is_s = (mb.equal(x=op, y=np.int32(code)) for code in range(len(BLEND_OPS)))
            a = mb.select(cond=is_b, a=brightness,
                          b=mb.select(cond=is_c, a=contrast, b=mb.select(cond=is_s, a=saturation, b=np.float32(1))))
            c = mb.select(cond=is_c, a=mb.sub(x=np.float32(1), y=contrast), b=np.float32(0))
            s = mb.select(cond=is_s, a=mb.sub(x=np.float32(1), y=saturation), b=np.float32(0))
            g = _grey(mb, x, f"grey{r}")
            mean = mb.reduce_mean(x=g, axes=[2, 3], keep_dims=True, name=f"{FP32_PREFIX}mean{r}")
            y = mb.add(x=mb.add(x=mb.mul(x=a, y=x), y=mb.mul(x=s, y=g)), y=mb.mul(x=c, y=mean))
            x = mb.clip(x=y, alpha=np.float32(0), beta=np.float32(1), name=OUTPUT if r == 2 else f"round{r}")
        return x

    return prog


def grayscale(size: int):
    """image -> torchvision's rgb_to_grayscale(num_output_channels=3): the luma in all three channels."""
    from coremltools.converters.mil import Builder as mb

    @mb.program(input_specs=_specs(size), opset_version=_target())
    def prog(image):
        return mb.tile(x=_grey(mb, image, "grey"), reps=[1, 3, 1, 1], name=OUTPUT)

    return prog


# name -> builder(**dims) returning a MIL program; its inputs after `image`, in order, are `MODEL_INPUTS[name]`.
MODELS: dict[str, Callable] = {
    "gaussian_blur": gaussian_blur,
    "color_jitter": color_jitter,
    "grayscale": grayscale,
}
MODEL_INPUTS: dict[str, tuple[str, ...]] = {
    "gaussian_blur": ("sigma",),
    "color_jitter": (*BLEND_OPS, "order"),
    "grayscale": (),
}


def cache_dir() -> Path:
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ssl-edge-pipeline"
    return Path(root) / "preprocess"


def model_key(name: str, **dims: int) -> str:
    """<name>-<dims>-<hash of this file, coremltools' version, name and dims>: a new builder, a new file."""
    ct = _ct()
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(f"{ct.__version__}|{name}|{sorted(dims.items())}".encode())
    return "-".join([name, *(f"{k}{v}" for k, v in dims.items()), h.hexdigest()[:12]])


def build(name: str, path: Path | str, **dims: int) -> Path:
    """Convert model `name` at `dims` to an fp16 ML Program at `path` (not cached: `build_cached` is)."""
    if name not in MODELS:
        raise PipelineError(f"unknown preprocessing model {name!r} (known: {', '.join(MODELS)})")
    ct = _ct()
    keep_fp32 = lambda op: not op.name.startswith(FP32_PREFIX)  # noqa: E731  (op_selector: True = fp16)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # coremltools' own internal registry
            model = ct.convert(MODELS[name](**dims), convert_to="mlprogram", skip_model_load=True,
                               compute_precision=ct.transform.FP16ComputePrecision(op_selector=keep_fp32),
                               minimum_deployment_target=_target())
    except PipelineError:
        raise
    except Exception as e:  # coremltools raises many types; the message names the op it could not lower
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PipelineError(f"building preprocessing model {name} {dims} failed ({type(e).__name__}: {first})") from None
    model.short_description = f"ssl-edge-pipeline preprocessing model {name} (train/preprocess_models.py)"
    model.user_defined_metadata.update({"preprocess_model": name, **{k: str(v) for k, v in dims.items()}})
    model.save(str(path))
    return Path(path)


def build_cached(name: str, root: Path | str | None = None, **dims: int) -> Path:
    """The cached package for (name, dims), built on first use. One process builds while others wanting the same
    package wait on a lock file (DataLoader workers, DDP ranks, parallel tests), then use it. It is built in a
    temporary folder beside its place and renamed there, so a crash never leaves half a package."""
    root = Path(root) if root is not None else cache_dir()
    path = root / f"{model_key(name, **dims)}.mlpackage"
    if (path / "Manifest.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if (path / "Manifest.json").is_file():  # built by whoever held the lock before
            return path
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}.", dir=root))
        try:
            os.replace(build(name, tmp / path.name, **dims), path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path
