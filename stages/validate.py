"""Validate stage: every exported artifact is run and compared with PyTorch before it leaves the pipeline.

Reads RUN/export/encoder.pt (the fp32 PyTorch reference), RUN/export/encoder.json (which artifacts exist, in which
precision, made from which encoder.pt), RUN/config.yaml + RUN/split.json (the val images); writes
RUN/validate/parity.json and fails, naming the artifact and the metric, when a gate is not met.

Images go in as an app hands them over: RGB, cropped/resized to the model's side, pixels 0..255 (the val split
at the stored size, center-cropped; `--images DIR` adds files decoded like a photo library would).

Runtimes, per artifact: its format's checker (export/formats.py; each row of the report says which runtime produced
its numbers):
- .mlpackage: `mil-eval`, the ML Program executed op by op with torch (export/mil_eval.py), fp16 rounded per op
- .mlmodel: `nn-eval`, the NeuralNetwork layers with torch (export/nn_eval.py), fp16 activations when the weights
  are fp16 (what the GPU/Neural Engine of an iPad does), fp32 otherwise (Core ML's CPU path)
- .onnx: `onnxruntime` on the CPU
- on macOS with Core ML available, also `coreml CPU_ONLY` and `coreml ALL` (the real runtime, MLModel.predict)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from export import compression, parity
from export.encoder import OUTPUT_NAME, load_encoder
from export.formats import COREML, FORMATS
from core import rundir
from core.rundir import PARITY, SIDECAR, artifact_digest, encoder_path, file_sha256
from core.config import to_dict
from core.errors import PipelineError
from core import provenance
from export.configs import ValidateConfig


# What a user does about a compressed file that fails (docs/export.md measures which compressions keep which
# backbone's answers): the common cause is a compression too strong for the backbone, not a broken export.
COMPRESSED_WHY = ("a compressed file that fails moves this encoder's embeddings too far for an app: export a milder "
                  "--compress (palettize-6, or int8, which keeps the most) or ship the fp16 file")


def few_labelled_why(cfg: ValidateConfig, n_val: int) -> str:
    """Why a drop gate failed on a single image, and the two ways out: more labelled val images, or the drops
    left to the other gates."""
    needed = parity.labelled_needed(cfg.compressed_max_knn_drop, cfg.compressed_max_probe_drop)
    return (f"on {n_val} labelled val images one image that changes its answer exceeds the drop bounds, which need "
            f"{needed} or more: hold out more (pretrain --val-fraction, or more photos per folder), or judge the "
            f"file by its top-k and cosine gates alone (--compressed-max-knn-drop 1 --compressed-max-probe-drop 1)")


def check(cfg: ValidateConfig) -> None:
    if cfg.max_images < 1:
        raise PipelineError(f"--max-images must be >= 1, got {cfg.max_images}")
    if cfg.max_train_images < 1:
        raise PipelineError(f"--max-train-images must be >= 1, got {cfg.max_train_images}")
    if cfg.top_k < 1:
        raise PipelineError(f"--top-k must be >= 1, got {cfg.top_k}")
    if not (cfg.fp32_max_abs >= 0 and cfg.fp16_max_rel_l2 >= 0):
        raise PipelineError("--fp32-max-abs and --fp16-max-rel-l2 must be >= 0")
    if not (0 <= cfg.fp32_min_cosine <= 1 and 0 <= cfg.fp16_min_topk <= 1):
        raise PipelineError("--fp32-min-cosine and --fp16-min-topk must be in [0, 1]")
    for name in ("compressed_min_topk", "compressed_max_knn_drop", "compressed_max_probe_drop", "compressed_min_cosine"):
        if not 0 <= getattr(cfg, name) <= 1:
            raise PipelineError(f"--{name.replace('_', '-')} must be in [0, 1], got {getattr(cfg, name)}")


# ---------------------------------------------------------------- images, as an app hands them over

def spread(indices: list[int], cap: int) -> list[int]:
    """At most `cap` of the indices, evenly spaced (all of them when they fit): a split stored in index order, which
    for most sets is class order, keeps every class in the sample, where its first `cap` would keep the first few."""
    n = len(indices)
    return list(indices) if n <= cap else [indices[i * n // cap] for i in range(cap)]


def split_images(run_dir: Path, size: int, part: str, cap: int) -> tuple[torch.Tensor, list[str], np.ndarray | None]:
    """Up to `cap` images of one part ("train" or "val") of the run's recorded split (spread over it), center view
    at the model's side, uint8 RGB N x 3 x S x S, with their sources and labels (None for an unlabelled set)."""
    from train.augment import center_views
    from train.data import load_data
    from train.runspec import read_run, recorded_split, store_size_for

    cfg = read_run(run_dir)
    data = load_data(cfg.data, store_size_for(cfg), seed=cfg.seed)
    split = recorded_split(run_dir, data, "validate on a folder with --images")
    idx = spread(split[part], cap)
    images = center_views(data.images[torch.as_tensor(idx, dtype=torch.long)], size) if idx else \
        torch.empty(0, 3, size, size, dtype=torch.uint8)
    labels = data.labels[torch.as_tensor(idx, dtype=torch.long)].numpy() if data.labels is not None and idx else None
    return images.to(torch.uint8), [data.sources[i] for i in idx], labels


def val_images(run_dir: Path, size: int, cap: int) -> tuple[torch.Tensor, list[str]]:
    """The run's val split (up to `cap`, spread over it), as an app hands images over."""
    return split_images(run_dir, size, "val", cap)[:2]


def labelled_val_images(run_dir: Path, size: int, cap: int) -> tuple[torch.Tensor, list[str], np.ndarray | None]:
    """val_images with the images' labels (None for an unlabelled set): the compressed artifacts' kNN and probe
    gates."""
    return split_images(run_dir, size, "val", cap)


def train_images(run_dir: Path, size: int, cap: int) -> tuple[torch.Tensor, list[str], np.ndarray | None]:
    """Up to `cap` train images of the run's split with their labels: the rows each model's own probe is fitted
    on (the compressed artifacts' probe gate). Never a val image: the split is the recorded one."""
    return split_images(run_dir, size, "train", cap)


def folder_images(folder: Path, size: int, cap: int, say=print) -> tuple[torch.Tensor, list[str]]:
    """Every readable image under `folder` (sorted, recursive), decoded to size x size RGB like a photo: EXIF
    orientation applied, shorter side resized, center-cropped. Unreadable files are skipped and counted."""
    from train.data import decode_image
    from train.data_spec import n_files, named

    if not folder.is_dir():
        raise PipelineError(f"--images {folder}: not a directory")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.parts))
    arrays, sources, skipped = [], [], []
    for f in files:
        if len(arrays) >= cap:
            break
        try:
            arrays.append(decode_image(f, size))
            sources.append(str(f))
        except Exception as e:  # PIL raises many types for non-images and truncated files
            skipped.append((str(f), type(e).__name__))
    if not arrays:
        raise PipelineError(f"--images {folder}: no readable images ({n_files(len(skipped))} skipped: "
                            f"{named(skipped, folder)})")
    if skipped:
        say(f"warning: skipped {len(skipped)} unreadable or non-image files under {folder}: {named(skipped, folder)}")
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous(), sources


COMPUTE_UNITS = ("CPU_ONLY", "ALL")


def is_compressed(entry: dict) -> bool:
    return entry.get("compression") not in (None, compression.NONE)


def gate_kind(entry: dict, actual: str | None, runtime: str) -> str:
    """Compressed weights are gated on use (export/parity.py); everything else by its precision."""
    if is_compressed(entry):
        return "compressed"
    return gate_precision(entry["format"], entry.get("precision", "fp32"), actual, runtime)


def gate_precision(fmt: str, declared: str, actual: str | None, runtime: str) -> str:
    """fp32 gates if the sidecar or the file says fp32 (the stricter claim wins: a file that computes in fp32
    gets no fp16 slack, and a sidecar that promised fp32 is held to it). The real runtime's GPU/Neural Engine
    computes NeuralNetwork models in fp16 whatever their weights."""
    if fmt == "mlmodel" and runtime == "coreml ALL":
        return "fp16"
    if declared == "fp32" or actual == "fp32":
        return "fp32"
    return "fp16"


def _row(entry: dict, runtime: str, precision: str, metrics: dict, failures: list[str], sources: list[str]) -> dict:
    worst = metrics.get("worst_image")
    return {"artifact": entry["file"], "format": entry["format"], "runtime": runtime, "precision": precision,
            "compression": entry.get("compression", compression.NONE), "size_bytes": entry.get("size_bytes"),
            **{k: v for k, v in metrics.items() if k != "worst_image"},
            "worst_image_source": sources[worst] if worst is not None and worst < len(sources) else None,
            "passed": not failures, "failures": failures}


def listed_artifacts(run_dir: Path) -> list[dict]:
    """The artifacts export/encoder.json lists, each known to the format table and present on disk."""
    export_dir, sidecar_path = run_dir / rundir.EXPORT, run_dir / rundir.EXPORT / SIDECAR
    if not sidecar_path.is_file():
        raise PipelineError(f"nothing exported yet (no {sidecar_path}): run `pipeline export` first")
    sidecar = rundir.load_json(sidecar_path, "export sidecar")
    artifacts = sidecar.get("artifacts") if isinstance(sidecar, dict) else None
    if not artifacts:
        raise PipelineError(f"{sidecar_path} lists no artifacts: run `pipeline export`")
    for entry in artifacts:
        path = export_dir / str(entry.get("file"))
        if entry.get("format") not in FORMATS:
            raise PipelineError(f"{sidecar_path}: unknown artifact format {entry.get('format')!r}")
        if not path.exists():
            raise PipelineError(f"{path} is listed in {sidecar_path} but missing: re-run `pipeline export`")
    return artifacts


def check_images(cfg: ValidateConfig, run_dir: Path, size: int, say) -> tuple[torch.Tensor, list[str], int, np.ndarray | None]:
    """(images, their sources, how many of them are val images (the first ones), the val images' labels): the run's
    val split and/or --images."""
    images, sources, labels = torch.empty(0, 3, size, size, dtype=torch.uint8), [], None
    if (run_dir / rundir.SPLIT).is_file() and (run_dir / rundir.CONFIG).is_file():
        images, sources, labels = labelled_val_images(run_dir, size, cfg.max_images)
    elif not cfg.images:
        raise PipelineError(f"{run_dir} has no {rundir.SPLIT} / {rundir.CONFIG} to take val images from: pass --images DIR")
    n_val = len(sources)
    if cfg.images:
        extra, extra_sources = folder_images(Path(cfg.images), size, cfg.max_images, say)
        images, sources = torch.cat([images, extra]), sources + extra_sources
    if len(sources) < 2:
        raise PipelineError(f"only {len(sources)} image(s) to validate with; retrieval agreement needs at least 2: "
                            f"add a folder with --images")
    return images, sources, n_val, labels


def outputs(fmt: str, path: Path, images: torch.Tensor, real_ok: bool) -> tuple[list[tuple], str | None]:
    """([(runtime, features or the PipelineError it raised)], the precision the file computes in): the reference
    evaluator of the format, plus the real Core ML runtime where it runs. An artifact a runtime cannot run (an op
    the evaluator lacks, a model Core ML rejects) is a failed row with the reason, not the end of the report."""
    from core.coreml_runtime import coreml_predict

    try:
        runtime, out, actual = FORMATS[fmt].checker(path, images)
        results = [(runtime, out)]
    except PipelineError as e:
        actual, results = None, [(f"{fmt} reference evaluator", e)]
    if real_ok and FORMATS[fmt].to == COREML:
        for units in COMPUTE_UNITS:
            try:
                results.append((f"coreml {units}", coreml_predict(path, images, units, OUTPUT_NAME)))
            except PipelineError as e:
                results.append((f"coreml {units}", e))
    return results, actual


def check_made_from(run_dir: Path, state: dict, artifacts: list[dict], encoder_sha: str) -> None:
    """Refuse, before anything runs, an export that is not of checkpoints/last.pt: encoder.pt stripped from an
    earlier checkpoint, or an artifact converted from another encoder.pt. `pipeline export` makes both again."""
    again = provenance.command("export", run_dir)
    provenance.check(encoder_path(run_dir), provenance.of_encoder(state), run_dir, again)
    for entry in artifacts:
        if entry.get("encoder_sha256") not in (None, encoder_sha):
            raise PipelineError(f"{run_dir / rundir.EXPORT / str(entry['file'])} was made from another encoder.pt than "
                                f"{encoder_path(run_dir)}: run `{again}`")


def encode(encoder: torch.nn.Module, images: torch.Tensor) -> np.ndarray:
    """The fp32 PyTorch reference features, 64 images at a time."""
    with torch.no_grad():
        return torch.cat([encoder(images[i: i + 64].float()) for i in range(0, len(images), 64)]).numpy()


def probe_reference(cfg: ValidateConfig, run_dir: Path, size: int, encoder, ref_val: np.ndarray,
                    val_labels: np.ndarray) -> tuple[dict, torch.Tensor | None, np.ndarray | None]:
    """(what parity.json records of the probe gate, the train images every compressed artifact also runs, their
    labels): the fp32 encoder's own probe on the run's train rows, C chosen on them by linear-eval's rule. Without
    labelled train rows to fit on, the probe gate is not measured, and the record says why."""
    from train.configs import EvalConfig
    from train.runspec import read_run

    images, sources, labels = train_images(run_dir, size, cfg.max_train_images)
    if labels is None:
        return {"measured": False, "why": "the run has no labelled train images"}, None, None
    reference = parity.reference_probe(encode(encoder, images), labels, ref_val, val_labels,
                                       EvalConfig().holdout_fraction, read_run(run_dir).seed)
    if reference is None:
        return {"measured": False, "why": "the train images hold fewer than 2 classes or one image a class"}, None, None
    return {"measured": True, **reference,
            "rule": "each model's own probe (train/probe.py), fitted on its features of the run's train images and "
                    "scored on its val features; one C for all, chosen on the fp32 encoder's train rows alone",
            "train_images": len(sources), "train_sources": sources}, images, labels


def run(cfg: ValidateConfig, run_dir: Path, say=print) -> dict:
    check(cfg)
    artifacts = listed_artifacts(run_dir)  # first: with nothing exported, `pipeline export` is what to run
    encoder, state = load_encoder(encoder_path(run_dir))
    size = int(state["image_size"])
    encoder_sha = file_sha256(encoder_path(run_dir))
    check_made_from(run_dir, state, artifacts, encoder_sha)
    images, sources, n_val, labels = check_images(cfg, run_dir, size, say)
    say(f"validating {len(artifacts)} artifacts on {len(sources)} images ({n_val} val"
        f"{f', {len(sources) - n_val} from {cfg.images}' if cfg.images else ''}) at {size}x{size}")
    ref = encode(encoder, images)
    train, train_labels = None, None
    if not any(is_compressed(e) for e in artifacts):
        probe = {"measured": False, "why": "no compressed artifact"}
    elif labels is None:
        probe = {"measured": False, "why": "no labelled val images"}
    else:
        probe, train, train_labels = probe_reference(cfg, run_dir, size, encoder, ref[:n_val], labels)
        if probe["measured"]:
            say(f"probe gate: each model's own probe on {probe['train_images']} train images (C {probe['c']:g}, "
                f"fp32 val top-1 {probe['top1']:.3f})")

    from core.coreml_runtime import coreml_can_predict

    real_ok, real_why = coreml_can_predict() if cfg.coreml_runtime == "auto" else (False, "--coreml-runtime off")
    rows = []
    for entry in artifacts:
        fmt, path = entry["format"], run_dir / rundir.EXPORT / str(entry["file"])
        if entry.get("sha256") and artifact_digest(path)[1] != entry["sha256"]:
            say(f"warning: {path} changed since `pipeline export` wrote it (sha256 differs from {SIDECAR})")
        probed = train is not None and is_compressed(entry)
        batch = torch.cat([images, train]) if probed else images  # the train images after: one run per runtime
        results, actual = outputs(fmt, path, batch, real_ok)
        for runtime, out in results:
            precision = gate_kind(entry, actual, runtime)
            if isinstance(out, PipelineError):
                metrics = {"error": str(out)}
            elif len(out) != len(batch):
                metrics = {"error": f"{len(out)} output rows for {len(batch)} images"}
            else:
                out = np.asarray(out)
                metrics = parity.compare(ref, out[:len(images)], cfg.top_k)
            if "error" not in metrics:  # on the labelled val images (the first n_val): what the report plots
                metrics.update(parity.use_metrics(ref[:n_val], out[:n_val], labels, cfg.top_k))
                if probed:
                    metrics.update(parity.probe_metrics(probe, out[len(images):], train_labels,
                                                        out[:n_val], labels))
            failures = parity.gate_failures(metrics, precision, **cfg.gates())
            rows.append(_row(entry, runtime, precision, metrics, failures, sources))

    result = {
        "run": str(run_dir), "image_size": size, "embedding_dim": int(ref.shape[1]),
        "images": {"count": len(sources), "val": n_val, "extra_folder": cfg.images or None, "sources": sources},
        "reference": "PyTorch fp32, export/encoder.pt (normalisation and L2 inside the model)",
        "coreml_runtime": "used" if real_ok else f"not used: {real_why}",
        "probe": probe,
        "config": to_dict(cfg), "passed": all(r["passed"] for r in rows), "rows": rows,
        # what was validated, for `pipeline show` and `pipeline report` to tell a result of older files
        "checkpoint": provenance.of_encoder(state), "encoder_sha256": encoder_sha,
        "artifacts_sha256": {str(e["file"]): e.get("sha256") for e in artifacts},
    }
    rundir.write_json_atomic(run_dir / rundir.VALIDATE / PARITY, result)
    say(format_table(result))
    say(f"wrote {run_dir / rundir.VALIDATE / PARITY}")
    failed = [r for r in rows if not r["passed"]]
    if failed:
        raise PipelineError(failure_message(failed, cfg, n_val))
    return result


def failure_message(failed: list[dict], cfg: ValidateConfig, n_val: int) -> str:
    """One line: each failed row's gates, then what to do about each kind of failure among them, once."""
    named = "; ".join(f"{r['artifact']} ({r['runtime']}): {', '.join(r['failures'])}" for r in failed)
    phrases = [f for r in failed for f in r["failures"]]
    unresolved = any(parity.UNRESOLVED in f for f in phrases)
    few = any(parity.FEW_LABELLED in f for f in phrases)
    # a compressed file failed only by drops of too few images has not shown that its compression is too strong
    compressed = any(r["precision"] == "compressed" and any(parity.FEW_LABELLED not in f for f in r["failures"])
                     for r in failed)
    return (f"parity gate failed: {named}" + (f" - {parity.UNRESOLVED_WHY}" if unresolved else "")
            + (f" - {few_labelled_why(cfg, n_val)}" if few else "") + (f" - {COMPRESSED_WHY}" if compressed else ""))


def _fmt(v, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def format_table(result: dict) -> str:
    """artifact | runtime | precision | worst cos | mean cos | worst rel L2 | max abs | top-k agree | PASS/FAIL"""
    k = max((r.get("top_k") or 0 for r in result["rows"]), default=0)
    name = max([len("artifact"), *(len(r["artifact"]) for r in result["rows"])])  # encoder.palettize-6.mlpackage is 29
    head = (f"{'artifact':{name}s} {'runtime':28s} {'prec':4s} {'worst cos':>10s} {'mean cos':>10s} {'worst relL2':>11s} "
            f"{'max abs':>9s} {f'top-{k} agree':>12s} {'kNN drop':>8s} {'probe drop':>10s}  result")
    lines = [head]
    for r in result["rows"]:
        lines.append(f"{r['artifact']:{name}s} {r['runtime']:28s} {r['precision'][:4]:4s} {_fmt(r.get('worst_cosine'), '10.7f')} "
                     f"{_fmt(r.get('mean_cosine'), '10.7f')} {_fmt(r.get('worst_rel_l2'), '11.2e')} "
                     f"{_fmt(r.get('max_abs'), '9.2e')} {_fmt(r.get('topk_agreement'), '12.3f')} "
                     f"{_fmt(r.get('knn_drop'), '8.3f')} {_fmt(r.get('probe_drop'), '10.3f')}  "
                     f"{'PASS' if r['passed'] else 'FAIL: ' + '; '.join(r['failures'])}")
    lines.append(f"({result['images']['count']} images at {result['image_size']}x{result['image_size']}; reference "
                 f"{result['reference']}; real Core ML runtime {result['coreml_runtime']})")
    return "\n".join(lines)
