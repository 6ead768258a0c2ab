"""Evaluation stage: linear probe and kNN on frozen features, beside the same backbone with no training at all.

Reads RUN/checkpoints/last.pt (whose stored config names the data and the architecture) and RUN/split.json; writes
RUN/eval/linear.json and caches features in RUN/eval/features_{pretrained,random}.pt (`--data SPEC`: the same
names with a suffix for that SPEC). The ways an SSL number gets inflated are closed by construction:
- val images in training: the run's own data is evaluated on its recorded split (val was never pretrained on,
  and the sources are checked to be the same images); `--data` refuses a val image that was a pretraining image.
- model selection on val: `choose_c` receives only the train split; val is touched once, by the final model.
- a "random" baseline that is secretly trained or ImageNet-pretrained: it is rebuilt exactly as pretraining
  started (seed, then build_model; torchvision weights=None) and its weight hash is recorded beside the trained one.
- fp16 or augmented evaluation: train.features extracts in fp32, eval mode, center view only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import torch

from core import rundir
from core.device import select_device
from core.errors import PipelineError
from core import provenance
from train.configs import EvalConfig, PretrainConfig
from train.data import ImageData, load_data, make_split, parse_spec
from train.features import extract_features
from train.knn import knn_scores, topk_accuracy
from train.probe import C_GRID, CV_BELOW, CV_FOLDS, MAX_ITER, choose_c, fit_probe
from train.runspec import build_model, read_run, read_split, recorded_split, seed_everything, store_size_for

METRICS = ("top1", "top5", "knn_top1", "knn_majority_top1")
MAX_EXTRA_UPSCALE = 2.0  # --data images may be upscaled at most this much more than the run's own images were
NATIVE_SAMPLE = 1000  # folder images whose header is read to estimate the native size (evenly spaced, not random)
CACHE_VERSION = 1


def validate(cfg: EvalConfig) -> None:
    if cfg.labels_per_class < 0 or cfg.labels_per_class == 1:
        raise PipelineError(f"--labels-per-class must be 0 (off) or at least 2 (one image per class to fit, one to "
                            f"choose C on), got {cfg.labels_per_class}")
    if cfg.label_draws < 1:
        raise PipelineError(f"--label-draws must be >= 1 (draws of K images per class to average), got {cfg.label_draws}")
    if not 0.0 < cfg.holdout_fraction < 1.0:
        raise PipelineError(f"--holdout-fraction must be in (0, 1), got {cfg.holdout_fraction}")
    if cfg.knn_k < 1 or cfg.majority_k < 1:
        raise PipelineError(f"--knn-k and --majority-k must be >= 1, got {cfg.knn_k} and {cfg.majority_k}")
    if cfg.knn_temperature <= 0:
        raise PipelineError(f"--knn-temperature must be > 0, got {cfg.knn_temperature}")
    if cfg.batch_size < 1:
        raise PipelineError(f"--batch-size must be >= 1, got {cfg.batch_size}")


# --- backbones: the trained one and the exact init it started from

def load_trained_backbone(run_dir: Path) -> tuple[torch.nn.Module, PretrainConfig, dict]:
    """(backbone, run config, checkpoint). The method module is rebuilt to load the state, then only its
    backbone is kept: projector, predictor and momentum networks are dropped with the module."""
    path = run_dir / rundir.LAST_CHECKPOINT
    ckpt = rundir.load_checkpoint(path)
    cfg = read_run(run_dir, ckpt)
    model, _ = build_model(cfg)
    try:
        model.load_state_dict(ckpt[rundir.CKPT_MODEL])
    except RuntimeError as e:
        raise PipelineError(f"{path}: weights do not fit {cfg.method}/{cfg.backbone} ({str(e).splitlines()[0]})") from None
    return model.backbone, cfg, ckpt


def random_backbone(cfg: PretrainConfig) -> torch.nn.Module:
    """The backbone pretraining started from: pretrain.run seeds, then calls build_model (weights=None), in
    this order, before any other draw. tests/stages/test_linear_eval.py holds this equal to step 0."""
    seed_everything(cfg.seed)
    model, _ = build_model(cfg)
    return model.backbone


def weights_sha256(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --- data: the run's own split, or another labelled set checked against the run

def _source_identity(spec: str, source: str) -> str:
    """What makes two sources the same image: a folder file by its real path; an array set by index within the
    same set (cifar10 at any path is the same set, synthetic:N depends on N)."""
    kind, _ = parse_spec(spec)
    if kind == "folder":
        return os.path.realpath(source)
    return f"{spec}/{source}" if kind == "synthetic" else source


def native_side(spec: str, sources: list[str]) -> float | None:
    """The side images of a SPEC have before any resize: digits 8, CIFAR 32, a folder the median shorter side
    (header reads of up to NATIVE_SAMPLE files); None where unknown or free (synthetic is drawn at any size)."""
    kind, _ = parse_spec(spec)
    if kind == "digits":
        return 8.0
    if kind in ("cifar10", "cifar100"):
        return 32.0
    if kind == "synthetic" or not sources:
        return None
    from PIL import Image

    sides = []
    for s in sources[:: max(1, len(sources) // NATIVE_SAMPLE)]:
        try:
            with Image.open(s) as im:  # lazy: reads the header only
                sides.append(min(im.size))
        except OSError:
            continue
    return float(np.median(sides)) if sides else None


def check_image_size(spec: str, sources: list[str], run_cfg: PretrainConfig, run_sources: list[str]) -> None:
    """A --data SPEC does not match the run when its images would reach the run's image size only by upscaling
    more than MAX_EXTRA_UPSCALE x beyond what the run's own images needed (at least 1x): features of blown-up
    thumbnails say nothing about the encoder. (The stem cannot mismatch: images are always fed at the run's size.)"""
    native = native_side(spec, sources)
    if native is None:
        return
    run_native = native_side(run_cfg.data, run_sources)
    run_up = max(1.0, run_cfg.image_size / run_native) if run_native else 1.0
    up = run_cfg.image_size / native
    allowed = MAX_EXTRA_UPSCALE * run_up
    if up > allowed:
        raise PipelineError(
            f"--data {spec}: its images are {native:g} px but the run works at {run_cfg.image_size} px, a {up:.1f}x "
            f"upscale, more than {MAX_EXTRA_UPSCALE:g}x the {run_up:.1f}x its own data ({run_cfg.data}) needed: use "
            f"images of at least {math.ceil(run_cfg.image_size / allowed)} px")


def eval_data(run_cfg: PretrainConfig, run_dir: Path, spec: str) -> tuple[ImageData, dict, bool]:
    """(data, split, is the run's own data). Labelled, with val images the run never pretrained on."""
    own = not spec or spec == run_cfg.data
    if own:
        data = load_data(run_cfg.data, store_size_for(run_cfg), seed=run_cfg.seed)
        split = recorded = recorded_split(run_dir, data, "evaluate another labelled set with --data")
    else:
        recorded = read_split(run_dir)
        data = load_data(spec, store_size_for(dataclasses.replace(run_cfg, data=spec)), seed=run_cfg.seed)
        split = make_split(data, run_cfg.val_fraction, run_cfg.seed)
    if data.labels is None:
        where = "the run's data" if own else "--data"
        raise PipelineError(f"{where} {data.spec} has no labels: linear-eval needs labelled images (folder:PATH with one "
                            f"subfolder per class, digits, cifar10:PATH, ...){'; pass one with --data' if own else ''}")
    if not own:
        check_image_size(spec, data.sources, run_cfg, recorded["train_sources"])
        seen = {_source_identity(run_cfg.data, s) for s in recorded["train_sources"]}
        leaked = [s for s in split["val_sources"] if _source_identity(spec, s) in seen]
        if leaked:
            raise PipelineError(f"--data {spec}: {len(leaked)} of its val images were pretraining images of this run "
                                f"(e.g. {leaked[0]}); evaluate on images the run never saw, or omit --data")
    if not split["val"]:
        raise PipelineError(f"{data.spec}: the split has no val images (val_fraction {split['val_fraction']}): nothing to evaluate on")
    if len(np.unique(data.labels[split["train"]].numpy())) < 2:
        raise PipelineError(f"{data.spec}: the train split holds fewer than 2 classes: nothing to classify")
    return data, split, own


# --- features, cached in the run directory

def cached_features(path: Path, backbone: torch.nn.Module, step: int, data: ImageData, split: dict,
                    image_size: int, device: torch.device, batch_size: int, say=print) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(train, val, device they were extracted on). Keyed by the weights' hash, the step and the exact images,
    so a re-run after retraining, or on changed data, recomputes instead of reusing stale features."""
    sources = json.dumps([split["train_sources"], split["val_sources"]]).encode()
    key = {"version": CACHE_VERSION, "weights_sha256": weights_sha256(backbone), "step": step, "spec": data.spec,
           "image_size": image_size, "store_size": data.images.shape[-1], "sources_sha256": hashlib.sha256(sources).hexdigest()}
    if path.is_file():
        try:
            cached = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a foreign or damaged cache is only a cache: recompute
            cached = None
        if isinstance(cached, dict) and cached.get("key") == key:
            say(f"features: reusing {path}")
            return cached["train"], cached["val"], cached["device"]
    backbone.to(device)
    train = extract_features(backbone, data.images[torch.as_tensor(split["train"], dtype=torch.long)], image_size, device, batch_size)
    val = extract_features(backbone, data.images[torch.as_tensor(split["val"], dtype=torch.long)], image_size, device, batch_size)
    backbone.cpu()
    rundir.torch_save_atomic(path, {"key": key, "train": train, "val": val, "device": str(device)})
    return train, val, str(device)


# --- probes

def linear_probe(train_x, train_y, val_x, val_y, num_classes: int, holdout_fraction: float, seed: int) -> dict:
    """C chosen on train, refit on all of train with it, scored once on val. top5 is None with <= 5 classes,
    where it would be 100% whatever the features."""
    selection = choose_c(train_x, train_y, holdout_fraction, seed)
    model = fit_probe(train_x, train_y, selection["c"])
    scores = torch.full((len(val_x), num_classes), -math.inf, dtype=torch.float64)
    scores[:, torch.as_tensor(model[-1].classes_)] = torch.from_numpy(model.predict_proba(val_x))
    labels = torch.from_numpy(val_y)
    return {"top1": topk_accuracy(scores, labels, 1),
            "top5": topk_accuracy(scores, labels, 5) if num_classes > 5 else None,
            "selection": {**selection, "converged": bool(model[-1].n_iter_.max() < MAX_ITER)}}


def probes(train_x: torch.Tensor, train_y: np.ndarray, val_x: torch.Tensor, val_y: np.ndarray, num_classes: int,
           cfg: EvalConfig, seed: int) -> dict:
    lin = linear_probe(train_x.double().numpy(), train_y, val_x.double().numpy(), val_y, num_classes, cfg.holdout_fraction, seed)
    ty, vy = torch.from_numpy(train_y), torch.from_numpy(val_y)
    weighted = knn_scores(train_x, ty, val_x, num_classes, cfg.knn_k, cfg.knn_temperature)
    majority = knn_scores(train_x, ty, val_x, num_classes, cfg.majority_k, None)
    return {"top1": lin["top1"], "top5": lin["top5"], "knn_top1": topk_accuracy(weighted, vy, 1),
            "knn_majority_top1": topk_accuracy(majority, vy, 1), "selection": lin["selection"]}


def per_class_subset(labels: np.ndarray, k: int, seed: int, classes: list[str], draw: int = 0) -> np.ndarray:
    """K train indices per class, deterministic in (seed, K, draw). Classes absent from train are absent here too."""
    present, counts = np.unique(labels, return_counts=True)
    smallest = int(np.argmin(counts))
    if k > counts[smallest]:
        name = classes[present[smallest]] if present[smallest] < len(classes) else str(present[smallest])
        raise PipelineError(f"--labels-per-class {k} is more than the {counts[smallest]} train images of class "
                            f"{name!r}: use at most {counts[smallest]}")
    rng = np.random.default_rng([seed, k, draw])
    return np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:k] for c in present]))


def _both(feats: dict, rows, train_y, val_y, num_classes, cfg, seed) -> dict:
    """Same probes on the trained and the random-init features: the trained result, with the baseline inside."""
    res = {w: probes(feats[w][0][torch.as_tensor(rows)], train_y[rows], feats[w][1], val_y, num_classes, cfg, seed) for w in feats}
    sel = {"pretrained": res["pretrained"].pop("selection"), "baseline": res["random"].pop("selection")}
    return {**res["pretrained"], "baseline": res["random"], "knn_k_used": min(cfg.knn_k, len(rows)),
            "majority_k_used": min(cfg.majority_k, len(rows)), "linear_selection": sel}


def _over_draws(values: dict, reduce) -> dict:
    """reduce (np.mean or np.std) of each metric's per-draw values; None stays None (top-5 with <= 5 classes)."""
    return {m: None if None in v else float(reduce(v)) for m, v in values.items()}


def few_label_probes(feats: dict, train_y, val_y, num_classes: int, classes: list[str], cfg: EvalConfig, seed: int) -> dict:
    """The K-per-class probes once per draw, on the same rows for both backbones: means and stds over draws, and
    the paired gain, whose per-draw differences cancel what a lucky or unlucky draw does to both."""
    per_draw, selections = [], []
    for d in range(cfg.label_draws):
        rows = per_class_subset(train_y, cfg.labels_per_class, seed, classes, d)
        res = _both(feats, rows, train_y, val_y, num_classes, cfg, seed)
        selections.append(res.pop("linear_selection"))
        k_used = {key: res.pop(key) for key in ("knn_k_used", "majority_k_used")}  # every draw has the same size
        per_draw.append(res)
    pre = {m: [r[m] for r in per_draw] for m in METRICS}
    base = {m: [r["baseline"][m] for r in per_draw] for m in METRICS}
    diff = {m: [None if a is None else a - b for a, b in zip(pre[m], base[m])] for m in METRICS}
    return {"k": cfg.labels_per_class, "num_train": len(rows), "draws": cfg.label_draws, **_over_draws(pre, np.mean),
            "baseline": _over_draws(base, np.mean),
            "std": {"pretrained": _over_draws(pre, np.std), "baseline": _over_draws(base, np.std)},
            "gain": _over_draws(diff, np.mean), "gain_std": _over_draws(diff, np.std), **k_used,
            "per_draw": per_draw, "linear_selection": selections}


# --- the stage

def run(cfg: EvalConfig, run_dir: Path, say=print) -> dict:
    validate(cfg)
    run_dir = Path(run_dir)
    device = select_device(cfg.device)
    trained, run_cfg, ckpt = load_trained_backbone(run_dir)
    if warning := provenance.unfinished(ckpt, run_dir):
        say(warning)
    seed = run_cfg.seed if cfg.seed is None else cfg.seed
    data, split, own = eval_data(run_cfg, run_dir, cfg.data)
    tag = "" if own else "-" + re.sub(r"[^A-Za-z0-9]+", "_", cfg.data).strip("_")[:40] + "-" + hashlib.sha256(cfg.data.encode()).hexdigest()[:8]
    eval_dir = run_dir / rundir.EVAL
    baseline = random_backbone(run_cfg)
    hashes = {"pretrained": weights_sha256(trained), "random": weights_sha256(baseline)}
    if hashes["pretrained"] == hashes["random"]:
        say(f"warning: the backbone in {run_dir / rundir.LAST_CHECKPOINT} equals its random init: it was never trained")
    say(f"linear-eval of {run_dir} (step {ckpt[rundir.CKPT_STEP]}) on {data.spec}: {len(split['train'])} train / "
        f"{len(split['val'])} val images, features on {device}, fp32")

    feats, devices = {}, {}
    for which, net, step in (("pretrained", trained, ckpt[rundir.CKPT_STEP]), ("random", baseline, 0)):
        train_x, val_x, devices[which] = cached_features(eval_dir / rundir.tagged(rundir.FEATURES[which], tag), net, step, data, split,
                                                         run_cfg.image_size, device, cfg.batch_size, say)
        feats[which] = (train_x, val_x)
    train_y = data.labels[torch.as_tensor(split["train"], dtype=torch.long)].numpy()
    val_y = data.labels[torch.as_tensor(split["val"], dtype=torch.long)].numpy()
    num_classes = len(data.classes)
    few = few_label_probes(feats, train_y, val_y, num_classes, data.classes, cfg, seed) if cfg.labels_per_class else None
    result = _both(feats, np.arange(len(train_y)), train_y, val_y, num_classes, cfg, seed)
    selection = result.pop("linear_selection")
    del result["knn_k_used"], result["majority_k_used"]  # the protocol records them
    out = {**result, "num_train": len(train_y), "num_val": len(val_y), "num_classes": num_classes}
    # what tells a probe that cannot be read (train/verdict.py): a kNN k above a class's size, a score at chance
    out["train_per_class"] = dict(zip(data.classes, np.bincount(train_y, minlength=num_classes).tolist()))
    out["chance_top1"] = float(np.bincount(val_y, minlength=num_classes).max() / len(val_y))  # the best constant guess
    out["protocol"] = {
        "data": data.spec, "split": f"recorded {rundir.SPLIT}" if own else f"fresh per-class split (seed {run_cfg.seed}, val_fraction {run_cfg.val_fraction})",
        "image_size": run_cfg.image_size, "store_size": int(data.images.shape[-1]),
        "view": "center crop" if data.images.shape[-1] >= run_cfg.image_size else "resize",
        "precision": "fp32, eval mode, no augmentation", "feature_device": devices, "feature_dim": int(feats["pretrained"][0].shape[1]),
        "linear": {"model": "StandardScaler + LogisticRegression(lbfgs, L2)", "c_grid": list(C_GRID), "max_iter": MAX_ITER,
                   "selection": f"C by mean held-out top-1 over splits of the train rows alone (seed {seed}; ties go to "
                                f"the smaller C): stratified k-fold, k = min({CV_FOLDS}, smallest class), when the smallest "
                                f"class has 2 to {CV_BELOW - 1} rows, else a per-class held-out {cfg.holdout_fraction:g}; "
                                f"val never used",
                   **selection},
        "knn": {"metric": "cosine", "weighting": "exp(sim / T)", "k": cfg.knn_k, "k_used": min(cfg.knn_k, len(train_y)),
                "temperature": cfg.knn_temperature, "majority_k": cfg.majority_k,
                "majority_k_used": min(cfg.majority_k, len(train_y))},
    }
    out["checkpoint"] = {"path": str(run_dir / rundir.LAST_CHECKPOINT), **provenance.of_checkpoint(ckpt),
                         "epochs_done": ckpt.get(rundir.CKPT_EPOCHS_DONE),
                         "method": run_cfg.method, "backbone": run_cfg.backbone, "weights_sha256": hashes["pretrained"]}
    out["baseline_init"] = {"seed": run_cfg.seed, "weights_sha256": hashes["random"],
                            "how": "seed_everything(seed) then build_model(config): the weights pretraining started from"}
    if few is not None:
        out["labels_per_class"] = few
        out["protocol"]["labels_per_class"] = {
            "k": cfg.labels_per_class, "draws": cfg.label_draws,
            "rows": "draw d: K train images per class, seeded by (seed, K, d); the same rows for both backbones",
            "selection": "C chosen per draw and backbone on that draw's labelled rows alone, as for linear (above)",
            "summary": "mean and population std over draws; gain = mean and std of the per-draw paired differences"}
    path = eval_dir / rundir.tagged(rundir.LINEAR_EVAL, tag)
    rundir.write_json_atomic(path, out)
    say(f"wrote {path}")
    return out


def format_table(result: dict) -> str:
    """metric | pretrained | random init | gain, in percent and percentage points."""
    knn = result["protocol"]["knn"]

    def rows(k_used: int, majority_k_used: int, suffix: str = "") -> list[tuple[str, str]]:
        return [(f"linear top-1{suffix}", "top1"), (f"linear top-5{suffix}", "top5"),
                (f"kNN top-1 (k={k_used}, T={knn['temperature']:g}){suffix}", "knn_top1"),
                (f"kNN top-1 (k={majority_k_used}, majority){suffix}", "knn_majority_top1")]

    def line(name: str, a: float | None, b: float | None) -> str:
        if a is None or b is None:  # top-5 with <= 5 classes
            return f"{name:40s} {'n/a':>10s} {'n/a':>11s}"
        return f"{name:40s} {100 * a:9.1f}% {100 * b:10.1f}% {100 * (a - b):+7.1f} pt"

    out = [f"{'metric':40s} {'pretrained':>10s} {'random init':>11s} {'gain':>10s}"]
    out += [line(name, result[key], result["baseline"][key]) for name, key in rows(knn["k_used"], knn["majority_k_used"])]
    few = result.get("labels_per_class")
    if few and "per_draw" not in few:  # a linear.json from before draws: no spread to show
        out.append(f"({few['k']} labels/class: an older single-draw result; re-run linear-eval for mean ± std over draws)")
    elif few:
        def spread(m: float, s: float, sign: str = "", unit: str = "%") -> str:
            return f"{100 * m:{sign}.1f} ± {100 * s:.1f}{unit}"

        title = f"few labels: mean ± std over {few['draws']} draws"
        out.append(f"{title:40s} {'pretrained':>13s} {'random init':>13s} {'paired gain':>16s}")
        for name, key in rows(few["knn_k_used"], few["majority_k_used"], f", {few['k']}/class"):
            if key != "top5":
                out.append(f"{name:40s} {spread(few[key], few['std']['pretrained'][key]):>13s} "
                           f"{spread(few['baseline'][key], few['std']['baseline'][key]):>13s} "
                           f"{spread(few['gain'][key], few['gain_std'][key], '+', ' pt'):>16s}")
    out.append(f"({result['num_train']} train / {result['num_val']} val images, {result['num_classes']} classes, "
               f"{result['protocol']['data']}; {result['checkpoint']['method']}/{result['checkpoint']['backbone']} "
               f"at step {result['checkpoint']['step']})")
    return "\n".join(out)
