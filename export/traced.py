"""The traced encoder as a file: what `pipeline trace` writes into RUN/export/ and `pipeline export` reads back.

The camera-like example input both stages feed it, and the loader that refuses a trace made from another
encoder.pt (the file names are core/rundir.py's).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch

from core import rundir
from core.errors import PipelineError
from core.rundir import TRACE_INFO, TRACED, encoder_path, file_sha256


def example_input(batch: int, image_size: int, seed: int = 0) -> torch.Tensor:
    """Camera-like input: RGB pixels 0..255 as float, what Vision hands the model."""
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(batch, 3, image_size, image_size, generator=gen) * 255.0


def load_traced(run_dir: Path):
    """(program, trace info) for the export stage: refuses a missing trace, or one made from an older encoder.pt."""
    export_dir = run_dir / rundir.EXPORT
    info = rundir.load_json(export_dir / TRACE_INFO, "trace record (run `pipeline trace` first)")
    path = export_dir / str(info.get("file"))
    if info.get("method") not in TRACED or not path.is_file():
        raise PipelineError(f"{export_dir / TRACE_INFO} names no traced encoder that exists: re-run `pipeline trace`")
    enc_path = encoder_path(run_dir)
    if not enc_path.is_file():
        raise PipelineError(f"no stripped encoder at {enc_path}: run `pipeline strip` then `pipeline trace`")
    if file_sha256(enc_path) != info.get("encoder_sha256"):
        raise PipelineError(f"{path} was traced from an older {enc_path}: re-run `pipeline trace`")
    try:
        if info["method"] == "torch.export":
            program = torch.export.load(path)
            # torch.export.load re-creates the unused outputs of multi-output ops (batch norm's saved mean and
            # variance) as dead `getitem` nodes; coremltools 9.0 cannot bind them. They are dead: removing them is exact.
            program.graph_module.graph.eliminate_dead_code()
            program.graph_module.recompile()
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                program = torch.jit.load(io.BytesIO(path.read_bytes()), map_location="cpu")
    except Exception as e:
        raise PipelineError(f"{path} is unreadable or truncated ({type(e).__name__}): re-run `pipeline trace`") from None
    return program, info
