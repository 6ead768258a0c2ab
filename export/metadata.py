"""The one metadata dict: built once from the run, written into every artifact (Core ML `user_defined_metadata`,
ONNX `metadata_props`) and into the sidecar RUN/export/encoder.json, so an app never has to guess the image size,
the normalisation or what the vector means.

Sources: RUN/export/encoder.pt (its preprocessing and the strip metadata), RUN/export/trace.json, and
RUN/eval/linear.json when present and made from the same checkpoint step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from export.encoder import INPUT_NAME, OUTPUT_NAME
from core import __version__, rundir
from train.backbones import BACKBONES
from train.methods import METHODS


def linear_eval_scores(run_dir: Path, step: int | None, say=print, checkpoint_id: str | None = None) -> dict[str, float]:
    """top-1 scores of eval/linear.json, only when it measured this checkpoint (same step and checkpoint id, the
    one every write of a checkpoint gets: core/provenance.py); else nothing."""
    path = run_dir / rundir.EVAL / rundir.LINEAR_EVAL
    if not path.is_file():
        return {}
    result = rundir.load_json(path, "linear-eval result")
    record = result.get("checkpoint") or {}
    measured = record.get("step")
    if (measured is not None and step is not None and measured != step) or record.get("id") != checkpoint_id:
        say(f"warning: {path} measured {'another checkpoint of ' if measured == step else ''}step {measured}, the "
            f"encoder is step {step}: its top-1 is left out of the metadata (re-run `pipeline linear-eval`)")
        return {}
    return {key: float(result[key]) for key in ("top1", "knn_top1") if isinstance(result.get(key), (int, float))}


def build_metadata(run_dir: Path, state: dict, trace_info: dict, author: str, license_: str, version: str | None,
                   description: str | None, say=print) -> dict[str, Any]:
    """Everything the app needs to know, with typed values (the sidecar keeps them typed; artifacts get strings)."""
    strip_meta = state.get("metadata") or {}
    method, backbone = strip_meta.get("method", "unknown"), state["backbone"]
    size, dim, l2 = state["image_size"], state["feat_dim"], bool(state.get("l2_normalize", True))
    run_id = strip_meta.get("run_id") or run_dir.resolve().name
    epochs = strip_meta.get("epochs_done")
    scores = linear_eval_scores(run_dir, strip_meta.get("step"), say, strip_meta.get("checkpoint_id"))
    meta: dict[str, Any] = {
        "author": author,
        "license": license_,
        "version": version or f"{__version__}+{run_id}.e{epochs}",
        "description": description or (
            f"{METHODS[method].title if method in METHODS else method} {BACKBONES[backbone].title if backbone in BACKBONES else backbone} image encoder: RGB "
            f"{size}x{size} image -> {dim}-d {'L2-normalised ' if l2 else ''}embedding"),
        "method": method,
        "backbone": backbone,
        "embedding_dim": dim,
        "image_size": size,
        "mean": [float(v) for v in state["mean"]],
        "std": [float(v) for v in state["std"]],
        "l2_normalized": l2,
        "small_stem": bool(state["small_stem"]),
        "input_name": INPUT_NAME,
        "input_format": f"RGB, {size}x{size}, pixel values 0..255; (x/255 - mean)/std is inside the model",
        "output_name": OUTPUT_NAME,
        "vision_crop_and_scale": "centerCrop",  # evaluation views are center crops; scaleFill would distort
        "run_id": run_id,
        "epochs": epochs,
        "step": strip_meta.get("step"),
        "checkpoint_id": strip_meta.get("checkpoint_id"),  # of checkpoints/last.pt when stripped: core/provenance.py
        "data": strip_meta.get("data"),
        "linear_top1": scores.get("top1"),
        "knn_top1": scores.get("knn_top1"),
        "trace": trace_info.get("method"),
        "encoder_sha256": trace_info.get("encoder_sha256"),
        "pipeline_version": __version__,
    }
    return {k: v for k, v in meta.items() if v is not None}


def as_strings(meta: dict[str, Any]) -> dict[str, str]:
    """Core ML and ONNX metadata are string -> string: lists and booleans as JSON, numbers as Python prints them."""
    out = {}
    for key, value in meta.items():
        if value is None:
            continue
        out[key] = value if isinstance(value, str) else json.dumps(value)
    return out


def input_description(meta: dict[str, Any]) -> str:
    return (f"RGB image {meta['image_size']}x{meta['image_size']}, pixel values 0..255 (what Vision hands a Core ML "
            f"model); normalisation with mean {meta['mean']} and std {meta['std']} is inside the model")


def output_description(meta: dict[str, Any]) -> str:
    unit = "L2-normalised: cosine similarity is a dot product" if meta["l2_normalized"] else "not normalised"
    return f"{meta['embedding_dim']}-d float32 image embedding ({meta['method']} {meta['backbone']}), {unit}"
