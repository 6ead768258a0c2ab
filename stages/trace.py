"""Trace stage: the Encoder (pixels 0..255 in, normalisation, backbone, optional L2) as one static graph.

Reads RUN/export/encoder.pt; writes RUN/export/encoder.pt2 (a `torch.export` ExportedProgram) or, where
torch.export fails, RUN/export/encoder.ts (TorchScript from `torch.jit.trace`), plus RUN/export/trace.json saying
which, why, and what was checked. The export stage converts this graph, never the eager module, so every format
is made from the same trace.

`run_decompositions({})` matters: recent `torch.export` returns the TRAINING dialect, which coremltools 9.0
rejects; decomposing with an empty table gives the inference dialect without lowering ops coremltools knows.
The batch dimension is traced dynamic (example batch 2: a batch of 1 would be specialised into the graph) so ONNX
keeps a free batch; Core ML fixes it to 1 at conversion, as Vision feeds one image at a time.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from export.encoder import INPUT_NAME, OUTPUT_NAME, load_encoder
from export.traced import example_input
from core import rundir
from core.rundir import TRACE_INFO, TRACED, encoder_path, file_sha256
from core.errors import PipelineError
from core import provenance
from export.configs import TraceConfig

def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def trace_with_export(encoder: torch.nn.Module, x: torch.Tensor):
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(encoder, (x,), dynamic_shapes={INPUT_NAME: {0: batch}}, strict=False)
    return program.run_decompositions({})


def trace_with_jit(encoder: torch.nn.Module, x: torch.Tensor):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.trace is deprecated": it is the fallback here
        return torch.jit.trace(encoder, x, check_trace=False)


def _call(program, x: torch.Tensor) -> torch.Tensor:
    module = program.module() if isinstance(program, torch.export.ExportedProgram) else program
    with torch.no_grad():
        return module(x)


def check_trace(program, encoder: torch.nn.Module, inputs: list[torch.Tensor], tolerance: float) -> float:
    """Largest |traced - eager| over inputs of several batch sizes (a baked-in batch fails here)."""
    worst = 0.0
    for x in inputs:
        with torch.no_grad():
            ref = encoder(x)
        out = _call(program, x)
        if tuple(out.shape) != tuple(ref.shape):
            raise PipelineError(f"traced encoder returns {tuple(out.shape)} for input {tuple(x.shape)}, eager {tuple(ref.shape)}")
        worst = max(worst, (out - ref).abs().max().item())
    if worst > tolerance:
        raise PipelineError(f"traced encoder differs from eager by {worst:.3g} (> tolerance {tolerance:g})")
    return worst


def save_program(program, path: Path) -> None:
    with rundir.atomic_path(path) as tmp:
        with open(tmp, "wb") as f:  # a file object: torch.export.save warns on a path not ending in .pt2
            if isinstance(program, torch.export.ExportedProgram):
                torch.export.save(program, f)
            else:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.save is deprecated": the fallback
                    torch.jit.save(program, f)


def run(cfg: TraceConfig, run_dir: Path, say=print) -> dict:
    if cfg.example_batch < 2:
        raise PipelineError(f"example_batch must be >= 2 (a batch of 1 is specialised into the graph), got {cfg.example_batch}")
    enc_path = encoder_path(run_dir)
    encoder, state = load_encoder(enc_path)
    made_from = provenance.of_encoder(state)
    provenance.check(enc_path, made_from, run_dir, provenance.command("strip", run_dir))
    size = state["image_size"]
    x = example_input(cfg.example_batch, size, cfg.seed)
    checks = [x, example_input(1, size, cfg.seed + 1), example_input(cfg.example_batch + 1, size, cfg.seed + 2)]

    program, used, reason, diff = None, None, None, None
    if cfg.method in ("auto", "export"):
        try:
            program = trace_with_export(encoder, x)
            diff = check_trace(program, encoder, checks, cfg.tolerance)
            used = "torch.export"
        except Exception as e:  # any tracer failure: fall back (auto) or report (export)
            if cfg.method == "export":
                raise PipelineError(f"torch.export failed on the encoder ({_first_line(e)}): try `--method jit`") from None
            reason = f"torch.export failed: {_first_line(e)}"
            say(f"warning: {reason}; falling back to torch.jit.trace")
            program = None
    if program is None:
        if cfg.method == "jit":
            reason = "forced by --method jit"
        try:
            program = trace_with_jit(encoder, x)
            diff = check_trace(program, encoder, checks, cfg.tolerance)
        except PipelineError:
            raise
        except Exception as e:
            raise PipelineError(f"torch.jit.trace failed on the encoder ({_first_line(e)})") from None
        used = "jit.trace"

    export_dir = run_dir / rundir.EXPORT
    out = export_dir / TRACED[used]
    save_program(program, out)
    for other in TRACED.values():  # a stale trace of the other kind would be ambiguous
        if other != TRACED[used]:
            (export_dir / other).unlink(missing_ok=True)
    info = {
        "method": used, "file": TRACED[used], "reason": reason,
        "input_name": INPUT_NAME, "input_shape": ["batch", 3, size, size], "input_range": [0, 255],
        "output_name": OUTPUT_NAME, "output_shape": ["batch", state["feat_dim"]],
        "example_batch": cfg.example_batch, "checked_batches": [int(c.shape[0]) for c in checks],
        "max_abs_diff": diff, "l2_normalize": state.get("l2_normalize", True),
        "torch_version": torch.__version__, "encoder_sha256": file_sha256(enc_path), "checkpoint": made_from,
    }
    rundir.write_json_atomic(export_dir / TRACE_INFO, info)
    say(f"traced with {used}{' (' + reason + ')' if reason else ''}: max |traced - eager| {diff:.2g} over batches "
        f"{info['checked_batches']} -> {out}")
    return info


def stale_reason(run_dir: Path) -> str | None:
    """Why the trace must be (re)made before exporting, or None: no trace record, its file gone, or traced from
    another encoder.pt than the one in export/ now."""
    export_dir = run_dir / rundir.EXPORT
    record = export_dir / TRACE_INFO
    if not record.is_file():
        return f"no {record}"
    try:
        info = rundir.load_json(record, "trace record")
    except PipelineError:
        return f"{record} is unreadable"
    if info.get("method") not in TRACED or not (export_dir / str(info.get("file"))).is_file():
        return f"{record} names no traced encoder that exists"
    enc_path = encoder_path(run_dir)
    if enc_path.is_file() and file_sha256(enc_path) != info.get("encoder_sha256"):
        return f"the trace was made from an older {enc_path}"
    return None
