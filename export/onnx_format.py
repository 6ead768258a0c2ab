"""ONNX writer: one self-contained .onnx file (no external weights), dynamic batch, the run's metadata in
`metadata_props`, passing `onnx.checker` with full_check (shape inference included) and run once by onnxruntime.

An ExportedProgram goes through `torch.onnx.export(..., dynamo=True)` (the torch.export-based exporter, the default
since torch 2.9; it writes opset 18 and up natively); a TorchScript fallback trace goes through the TorchScript
exporter (`dynamo=False`) with the batch axis declared dynamic.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.encoder import INPUT_NAME, OUTPUT_NAME
from export.metadata import as_strings, input_description, output_description
from core.errors import PipelineError

BATCH_DIM = "batch"  # the symbolic name of the free batch axis in the file
TOLERANCE = 1e-4  # |onnxruntime - traced program| on the example input before the file is accepted


def _export_proto(program, x: torch.Tensor, opset: int):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice; the choice is deliberate
        if isinstance(program, torch.export.ExportedProgram):
            onnx_program = torch.onnx.export(program, (x,), dynamo=True, input_names=[INPUT_NAME],
                                             output_names=[OUTPUT_NAME], opset_version=opset, verbose=False)
            return onnx_program.model_proto, "torch.onnx.export(dynamo=True)"
        import onnx

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "encoder.onnx"
            torch.onnx.export(program, (x,), str(path), dynamo=False, input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                              dynamic_axes={INPUT_NAME: {0: BATCH_DIM}, OUTPUT_NAME: {0: BATCH_DIM}}, opset_version=opset)
            return onnx.load(str(path)), "torch.onnx.export(dynamo=False) (TorchScript exporter)"


def _name_batch_dim(model) -> None:
    """The exporter calls the free batch axis after its internal symbol (e.g. `s40`); rename it `batch` everywhere."""
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    if not dim.dim_param:
        raise PipelineError("the ONNX export fixed the batch dimension: the traced encoder has no dynamic batch")
    old = dim.dim_param
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param == old:
                d.dim_param = BATCH_DIM


def _set_metadata(model, meta: dict[str, Any]) -> None:
    strings = as_strings(meta)
    keep = [p for p in model.metadata_props if p.key not in strings]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    for key, value in strings.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    model.doc_string = meta["description"]
    model.graph.input[0].doc_string = input_description(meta)
    model.graph.output[0].doc_string = output_description(meta)


def _run_once(path: Path, program, x: torch.Tensor) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run([OUTPUT_NAME], {INPUT_NAME: x.numpy().astype(np.float32)})[0]
    module = program.module() if isinstance(program, torch.export.ExportedProgram) else program
    with torch.no_grad():
        ref = module(x).numpy()
    if got.shape != ref.shape:
        raise PipelineError(f"onnxruntime returns {got.shape} for input {tuple(x.shape)}, the traced encoder {ref.shape}")
    return float(np.abs(got - ref).max())


def write_onnx(program, path: Path, meta: dict[str, Any], precision: str, options: dict[str, Any]) -> dict[str, Any]:
    import onnx

    opset = options["opset"]
    x = options["example"]
    try:
        model, exporter = _export_proto(program, x, opset)
    except PipelineError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise PipelineError(f"ONNX export failed ({type(e).__name__}: {first}); nothing was written") from None
    written = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if written != opset:
        raise PipelineError(f"the ONNX exporter wrote opset {written}, not the requested {opset}: use --opset {written}")
    _name_batch_dim(model)
    detail = {"precision": precision, "opset": opset, "exporter": exporter, "precision_detail": "fp32 weights and activations"}
    _set_metadata(model, {**meta, "format": "onnx", **detail})
    onnx.save_model(model, str(path), save_as_external_data=False)
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except onnx.checker.ValidationError as e:
        raise PipelineError(f"the exported ONNX model fails onnx.checker ({str(e).splitlines()[0][:200]})") from None
    diff = _run_once(path, program, torch.cat([x, x[:1]]))  # one more than the example batch: the batch is free
    if diff > TOLERANCE:
        raise PipelineError(f"onnxruntime differs from the traced encoder by {diff:.3g} (> {TOLERANCE:g}): refused")
    return {**detail, "onnxruntime_max_abs_diff": diff}


def check_onnx(path: Path, images: torch.Tensor) -> tuple[str, np.ndarray, str | None]:
    """The format table's checker (run by validate): onnxruntime on the CPU, one batch of 64 at a time (one image at
    a time for a file with a fixed batch of 1)."""
    import onnxruntime as ort

    try:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise PipelineError(f"{path}: onnxruntime cannot load it ({type(e).__name__}: {first})") from None
    inp = session.get_inputs()[0]
    half = inp.type == "tensor(float16)"
    x = images.float().numpy().astype(np.float16 if half else np.float32)
    fixed_batch = isinstance(inp.shape[0], int) and inp.shape[0] == 1
    batches = [x[i: i + 1] for i in range(len(x))] if fixed_batch else [x[i: i + 64] for i in range(0, len(x), 64)]
    try:
        out = [session.run([OUTPUT_NAME], {inp.name: b})[0] for b in batches]
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise PipelineError(f"{path}: onnxruntime failed to run it ({type(e).__name__}: {first})") from None
    return "onnxruntime (CPU)", np.concatenate(out).astype(np.float32).reshape(len(x), -1), "fp16" if half else None
