"""Strip stage: the shippable backbone out of a pretraining checkpoint, with the proof that nothing else came along.

Reads RUN/config.yaml and RUN/checkpoints/last.pt; writes RUN/export/encoder.pt (the keys `export.encoder.load_encoder`
reads: state_dict = backbone only, backbone, backbone_args (what its builder was called with: the network is rebuilt
from exactly these), small_stem, feat_dim, image_size, mean, std, l2_normalize, metadata).

The stored config decides what the checkpoint must be: the full method model is rebuilt from it and the weights are
loaded strictly, so a checkpoint of another method or backbone is refused instead of half-loaded. The proof, run on
every strip: the stripped backbone's features equal the full model's `.backbone` features exactly on random input,
its output width is the backbone's feature dimension, and its state holds backbone tensors and nothing else.
"""

from __future__ import annotations

from pathlib import Path

import torch

from core import __version__, rundir
from core.errors import PipelineError
from core.rundir import encoder_path
from core import provenance
from train.backbones import build_from_args, check_image_size
from train.configs import PretrainConfig
from export.configs import StripConfig
from train.runspec import backbone_args, build_model, read_run, small_stem
from core.views import MEAN, STD



def _load_strict(model: torch.nn.Module, weights: dict, ckpt_path: Path, cfg: PretrainConfig) -> None:
    """load_state_dict(strict=True), with the mismatch summarised on one line instead of torch's key dump."""
    if not isinstance(weights, dict):
        raise PipelineError(f"{ckpt_path}: `model` is not a state dict; the file was not written by `pipeline pretrain`")
    expected = model.state_dict()
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    resized = [k for k in expected if k in weights and tuple(weights[k].shape) != tuple(expected[k].shape)]
    if missing or unexpected or resized:
        parts = [f"{len(v)} {what} (e.g. {v[0]})" for what, v in
                 (("missing", missing), ("unexpected", unexpected), ("with another shape", resized)) if v]
        raise PipelineError(f"{ckpt_path} does not fit its config ({cfg.method}/{cfg.backbone}, {cfg.image_size} px): "
                            f"{'; '.join(parts)} tensors: it is a checkpoint of another method or backbone")
    model.load_state_dict(weights, strict=True)


def strip_projection_head(model: torch.nn.Module, cfg: PretrainConfig) -> tuple[dict, dict]:
    """(backbone state, what was dropped). Heads, predictors, momentum networks and queues all live outside
    `model.backbone` (see train/methods), so the backbone's own state dict is exactly what ships."""
    full = model.state_dict()
    kept = {k: v.detach().clone() for k, v in model.backbone.state_dict().items()}
    reference, _ = build_from_args(cfg.backbone, backbone_args(cfg))
    if set(kept) != set(reference.state_dict()):
        raise PipelineError(f"stripped state of {cfg.backbone} has keys a fresh {cfg.backbone} lacks: not stripped cleanly")
    dropped = sorted(k for k in full if not k.startswith("backbone."))
    modules = sorted({k.split(".")[0] for k in dropped})
    return kept, {"dropped_modules": modules, "dropped_tensors": len(dropped), "kept_tensors": len(kept),
                  "dropped_params": sum(full[k].numel() for k in dropped),
                  "kept_params": sum(v.numel() for v in kept.values())}


def prove_strip(model: torch.nn.Module, kept: dict, cfg: PretrainConfig, feat_dim: int, batch: int, seed: int) -> dict:
    """Rebuild a bare backbone from the stripped state and compare with the full model's backbone, bit for bit."""
    stripped, _ = build_from_args(cfg.backbone, backbone_args(cfg))
    stripped.load_state_dict(kept, strict=True)
    stripped.eval()
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=gen)
    with torch.no_grad():
        full_feats = model.backbone(x)
        feats = stripped(x)
    if tuple(feats.shape) != (batch, feat_dim):
        raise PipelineError(f"stripped {cfg.backbone} outputs {tuple(feats.shape)}, expected ({batch}, {feat_dim})")
    if not torch.equal(feats, full_feats):
        diff = (feats - full_feats).abs().max().item()
        raise PipelineError(f"stripped backbone features differ from the full model's by {diff:.3g}: strip refused")
    return {"input_shape": list(x.shape), "seed": seed, "output_dim": feat_dim, "equal": True, "max_abs_diff": 0.0}


def stale_reason(run_dir: Path) -> str | None:
    """Why export/encoder.pt must be (re)made before exporting, or None: missing, or stripped from another
    checkpoint than checkpoints/last.pt (core/provenance.py)."""
    out = encoder_path(run_dir)
    if not out.is_file():
        return f"no {out}"
    now = provenance.current(run_dir)
    try:
        state = torch.load(out, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # a damaged encoder.pt is made again
        return f"{out} is unreadable"
    if now is not None and not provenance.same(provenance.of_encoder(state), now):
        return f"{out} comes from an earlier checkpoint than {run_dir / rundir.LAST_CHECKPOINT}"
    return None


def run(cfg: StripConfig, run_dir: Path, say=print) -> dict:
    if cfg.proof_batch < 1:
        raise PipelineError(f"proof_batch must be >= 1, got {cfg.proof_batch}")
    ckpt_path = run_dir / rundir.LAST_CHECKPOINT
    ckpt = rundir.load_checkpoint(ckpt_path)
    pcfg = read_run(run_dir, ckpt)
    if warning := provenance.unfinished(ckpt, run_dir):
        say(warning)
    small = small_stem(pcfg)
    try:
        check_image_size(pcfg.backbone, small, pcfg.image_size)
    except PipelineError as e:
        raise PipelineError(f"{run_dir / rundir.CONFIG}: {e}") from None
    model, feat_dim = build_model(pcfg)
    _load_strict(model, ckpt[rundir.CKPT_MODEL], ckpt_path, pcfg)
    kept, dropped = strip_projection_head(model, pcfg)
    proof = prove_strip(model, kept, pcfg, feat_dim, cfg.proof_batch, cfg.seed)
    meta = ckpt.get(rundir.CKPT_META) or {}
    state = {
        "state_dict": kept, "backbone": pcfg.backbone, "backbone_args": backbone_args(pcfg), "small_stem": small,
        "feat_dim": feat_dim,
        "image_size": pcfg.image_size, "mean": list(meta.get("mean", MEAN)), "std": list(meta.get("std", STD)),
        "l2_normalize": cfg.l2_normalize,
        "metadata": {"method": pcfg.method, "run_id": run_dir.resolve().name, "step": ckpt.get(rundir.CKPT_STEP),
                     "checkpoint_id": ckpt.get(rundir.CKPT_ID),
                     "epochs_done": ckpt.get(rundir.CKPT_EPOCHS_DONE), "epochs": pcfg.epochs, "data": pcfg.data,
                     "seed": pcfg.seed, "pipeline_version": __version__,
                     "checkpoint": rundir.LAST_CHECKPOINT,  # in the run: an absolute path would differ per clone
                     "frozen_parameters": meta.get("frozen_parameters", []), **dropped, "proof": proof},
    }
    out = encoder_path(run_dir)
    rundir.torch_save_atomic(out, state)
    say(f"stripped {pcfg.method}/{pcfg.backbone}: kept {dropped['kept_params']:,} backbone parameters, dropped "
        f"{dropped['dropped_params']:,} ({', '.join(dropped['dropped_modules']) or 'nothing'}); features equal the "
        f"full model's on {cfg.proof_batch} random images; {feat_dim}-d -> {out}")
    return state
