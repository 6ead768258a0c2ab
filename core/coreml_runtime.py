"""Whether the real Core ML runtime can run here (macOS with coremltools' native module), and why not; and, where
it can, predictions from it with the compute units an app would choose."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np

from core.errors import PipelineError

COMPUTE_UNITS = ("CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE", "ALL")  # coremltools.ComputeUnit names


def coreml_can_predict() -> tuple[bool, str]:
    if platform.system() != "Darwin":
        return False, f"Core ML runs only on macOS (this is {platform.system()}); the reference evaluator is used instead"
    try:
        from core.quiet import import_coremltools

        import_coremltools()  # its import-time lines filtered before the native module is asked for
        from coremltools import libcoremlpython  # noqa: F401  (the native bridge predict() needs)
    except Exception as e:  # missing wheel build, wrong arch
        return False, f"coremltools has no native runtime here ({type(e).__name__}); reinstall coremltools for macOS"
    return True, ""


def coreml_predict(path: Path | str, images, compute_units: str, output: str) -> np.ndarray:
    """Run a saved Core ML model with `MLModel.predict`, one picture at a time as Vision does.

    images: N x 3 x H x W RGB pixels 0..255 (uint8 or float, torch or numpy), already at the model's size. Each is
    handed over as an RGB PIL image, so Core ML itself reorders channels for a BGR model and applies the model's
    image scale/bias: exactly the path an app's pixels take. Returns N x D float32 of output `output`."""
    from PIL import Image

    model = coreml_load(path, compute_units)
    inputs = model.get_spec().description.input
    if len(inputs) != 1 or inputs[0].type.WhichOneof("Type") != "imageType":
        raise PipelineError(f"{path}: expected one image input, found {[i.name for i in inputs]}")
    name = inputs[0].name
    arr = np.asarray(images.numpy() if hasattr(images, "numpy") else images)
    rows = []
    for chw in arr:
        hwc = np.clip(np.rint(chw.astype(np.float64)), 0, 255).astype(np.uint8).transpose(1, 2, 0)
        out = model.predict({name: Image.fromarray(np.ascontiguousarray(hwc), "RGB")})
        if output not in out:
            raise PipelineError(f"{path}: Core ML returned no output {output!r} (got {', '.join(out)})")
        rows.append(np.asarray(out[output], dtype=np.float32).reshape(-1))
    return np.stack(rows) if rows else np.zeros((0, 0), np.float32)


def coreml_load(path: Path | str, compute_units: str):
    """A saved Core ML model, loaded (compiled for this Mac) once for many predictions: loading costs far more than
    a small model's prediction. Refusals and Core ML compiler errors are one line."""
    ok, why = coreml_can_predict()
    if not ok:
        raise PipelineError(why)
    if compute_units not in COMPUTE_UNITS:
        raise PipelineError(f"compute units must be one of {', '.join(COMPUTE_UNITS)}, got {compute_units!r}")
    from core.quiet import import_coremltools

    ct = import_coremltools()
    try:
        return ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, compute_units))
    except Exception as e:  # the Core ML compiler rejects the model: a real failure, reported on one line
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise PipelineError(f"{path}: Core ML cannot load it with {compute_units} ({type(e).__name__}: {first})") from None


def coreml_predict_arrays(model, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
    """One prediction of a model with tensor (MultiArray) inputs, from `coreml_load`: output `output` as float32."""
    out = model.predict(feeds)
    if output not in out:
        raise PipelineError(f"Core ML returned no output {output!r} (got {', '.join(out)})")
    return np.asarray(out[output], dtype=np.float32)
