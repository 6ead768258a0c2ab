"""Pretraining stage: SSL on unlabelled images, exactly resumable.

setup (config, data, split, model, optimizer) -> train (steps, logs, checkpoints) -> done. Writes into RUN_DIR:
config.yaml, split.json, skipped.txt (if any), metrics.jsonl, checkpoints/last.pt (+ epoch_NNNN.pt every N epochs).
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from pipeline import __version__, rundir
from pipeline.config import load_config, opt, to_dict
from pipeline.device import precision_for, select_device
from pipeline.errors import PipelineError
from stages import augment
from stages.backbones import BACKBONES, build_backbone, min_image_size, uses_small_stem
from stages.data import load_data, make_split
from stages.methods import METHODS
from stages.methods import byol, mocov3, simclr
from stages.optim import build_optimizer, warmup_cosine

METHOD_DEFAULTS = {"simclr": simclr.DEFAULTS, "byol": byol.DEFAULTS, "mocov3": mocov3.DEFAULTS}


@dataclass
class PretrainConfig:
    method: str = opt("simclr", "SSL method", choices=tuple(METHODS))
    data: str = opt("digits", "data SPEC: digits | folder:PATH | cifar10:PATH | cifar100:PATH | synthetic:N")
    backbone: str = opt("resnet18", "torchvision ResNet, random init", choices=tuple(BACKBONES))
    small_stem: str = opt("auto", "3x3 stem without max-pool; auto = on for images <= 64 px", choices=("auto", "on", "off"))
    image_size: int = opt(32, "training crop side in pixels; 32 keeps the CPU default run within minutes")
    store_size: int = opt(0, "side at which images are decoded and kept; 0 = image size for array datasets, 8/7 x for folders")
    epochs: int = opt(10, "passes over the train split")
    batch_size: int = opt(128, "images per step (each gives two views)")
    lr: float | None = opt(None, "base learning rate per 256 images; None = the method's paper value")
    lr_scaling: str = opt("linear", "peak lr = lr x batch/256 (linear, as the papers) or lr x sqrt(batch/256)", choices=("linear", "sqrt", "none"))
    optimizer: str | None = opt(None, "None = the method's paper optimizer (LARS)", choices=("lars", "sgd", "adamw"))
    weight_decay: float | None = opt(None, "None = the method's paper value")
    warmup_epochs: float = opt(1.0, "linear warm-up before the cosine decay; short runs need a short warm-up")
    temperature: float | None = opt(None, "softmax temperature (SimCLR, MoCo v3); None = paper value")
    proj_dim: int | None = opt(None, "projector output size; None = paper value")
    proj_hidden_dim: int | None = opt(None, "projector hidden size; None = paper value")
    pred_hidden_dim: int | None = opt(None, "predictor hidden size (BYOL, MoCo v3); None = paper value")
    momentum_base: float | None = opt(None, "EMA start of the momentum network, rises to 1 on a cosine (BYOL, MoCo v3)")
    queue_size: int | None = opt(None, "MoCo v3 only: extra negatives from a ring buffer of past keys; 0 = none")
    val_fraction: float = opt(0.1, "held out for evaluation, never trained on (CIFAR uses its own test set)")
    device: str = opt("auto", "auto picks mps > cuda > cpu", choices=("auto", "cpu", "cuda", "mps"))
    precision: str = opt("auto", "auto: bf16 on CUDA, fp16 backbone on MPS, fp32 on CPU; fp32 everywhere to debug", choices=("auto", "fp32"))
    num_workers: int = opt(-1, "augmentation workers; -1 = one per spare core, up to 8")
    seed: int = opt(0, "seeds init, split, order and every augmentation draw")
    max_steps: int = opt(0, "stop after this many total steps (0 = run all epochs); the schedule still spans all epochs")
    log_every: int = opt(10, "steps between metrics.jsonl lines")
    save_every: int = opt(0, "also keep checkpoints/epoch_NNNN.pt every N epochs (0 = only last.pt)")


def resolve(cfg: PretrainConfig) -> PretrainConfig:
    """Fill every None with the method's paper default so config.yaml records what actually ran."""
    defaults = {"temperature": 0.5, "proj_dim": 128, "proj_hidden_dim": 2048, "pred_hidden_dim": 4096,
                "momentum_base": 0.99, "queue_size": 0, **METHOD_DEFAULTS[cfg.method]}
    filled = {k: (defaults[k] if getattr(cfg, k) is None and k in defaults else getattr(cfg, k)) for k in to_dict(cfg)}
    return PretrainConfig(**filled)


def validate(cfg: PretrainConfig) -> None:
    small = uses_small_stem(cfg.small_stem, cfg.image_size)
    lo = min_image_size(small)
    if not lo <= cfg.image_size <= 1024:
        raise PipelineError(f"image size {cfg.image_size} is impossible for {cfg.backbone} with the "
                            f"{'small' if small else 'ImageNet'} stem: use {lo}..1024")
    if cfg.batch_size < 2:
        raise PipelineError(f"batch size must be at least 2 (contrastive losses need negatives), got {cfg.batch_size}")
    if cfg.epochs < 1:
        raise PipelineError(f"epochs must be >= 1, got {cfg.epochs}")
    if cfg.store_size and cfg.store_size < cfg.image_size:
        raise PipelineError(f"store_size {cfg.store_size} is smaller than image_size {cfg.image_size}")
    if cfg.queue_size and cfg.method != "mocov3":
        raise PipelineError(f"queue_size is a MoCo v3 option; method is {cfg.method}")


def store_size_for(cfg: PretrainConfig) -> int:
    if cfg.store_size:
        return cfg.store_size
    return round(cfg.image_size * 8 / 7) if cfg.data.startswith("folder:") else cfg.image_size


def peak_lr(cfg: PretrainConfig) -> float:
    ratio = cfg.batch_size / 256
    return cfg.lr * {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[cfg.lr_scaling]


def default_workers(requested: int) -> int:
    if requested >= 0:
        return requested
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def build_model(cfg: PretrainConfig) -> tuple[torch.nn.Module, int]:
    """The method's module around a fresh backbone; later stages rebuild it from the stored config."""
    backbone, feat_dim = build_backbone(cfg.backbone, uses_small_stem(cfg.small_stem, cfg.image_size))
    return METHODS[cfg.method](backbone, feat_dim, cfg), feat_dim


def config_for_run(config_file, overrides: dict, run_dir: Path, resume: bool) -> PretrainConfig:
    """A resumed run starts from its own config.yaml; flags may still change e.g. max_steps or epochs, but not
    what would make the checkpoint meaningless."""
    saved = run_dir / rundir.CONFIG
    if resume:
        if not (run_dir / rundir.LAST_CHECKPOINT).is_file():
            raise PipelineError(f"--resume: no checkpoint at {run_dir / rundir.LAST_CHECKPOINT}")
        cfg = load_config(PretrainConfig, config_file or saved, overrides)
        old = load_config(PretrainConfig, saved)
        for key in ("method", "backbone", "image_size", "small_stem", "data", "batch_size", "seed", "proj_dim",
                    "proj_hidden_dim", "pred_hidden_dim", "queue_size", "val_fraction"):
            if getattr(cfg, key) is not None and getattr(old, key) is not None and getattr(cfg, key) != getattr(old, key):
                raise PipelineError(f"--resume: `{key}` is {getattr(old, key)!r} in {saved}, cannot change it to {getattr(cfg, key)!r}")
        return resolve(cfg)
    return resolve(load_config(PretrainConfig, config_file, overrides))


def run(cfg: PretrainConfig, run_dir: Path, resume: bool = False, say=print) -> dict:
    validate(cfg)
    device = select_device(cfg.device)
    precision = precision_for(device, cfg.precision)
    seed_everything(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)

    # --- data and split
    data = load_data(cfg.data, store_size_for(cfg), seed=cfg.seed)
    if data.skipped:
        rundir.write_text_atomic(run_dir / rundir.SKIPPED, "".join(f"{f}\t{why}\n" for f, why in data.skipped))
        say(f"warning: skipped {len(data.skipped)} unreadable or non-image files (listed in {run_dir / rundir.SKIPPED})")
    split = make_split(data, cfg.val_fraction, cfg.seed)
    split_path = run_dir / rundir.SPLIT
    if resume and split_path.is_file():
        old = rundir.load_json(split_path, "split")
        if old["train_sources"] != split["train_sources"]:
            raise PipelineError(f"--resume: the images of {cfg.data} changed since {split_path} was written")
    train_images = data.images[torch.as_tensor(split["train"], dtype=torch.long)]
    if cfg.batch_size > len(train_images):
        raise PipelineError(f"batch size {cfg.batch_size} is larger than the {len(train_images)} training images of {cfg.data}")

    # --- model, optimizer, schedule
    model, feat_dim = build_model(cfg)
    model.to(device)
    steps_per_epoch = len(train_images) // cfg.batch_size
    total_steps = steps_per_epoch * cfg.epochs
    lr = peak_lr(cfg)
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), lr, cfg.weight_decay)
    scheduler = warmup_cosine(optimizer, round(cfg.warmup_epochs * steps_per_epoch), total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    step = 0
    if resume:
        ckpt = rundir.load_checkpoint(run_dir / rundir.LAST_CHECKPOINT)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        _set_rng_state(ckpt["rng"])
        step = ckpt["step"]
        say(f"resuming {run_dir} at step {step} (epoch {step // steps_per_epoch})")
    else:
        rundir.write_json_atomic(split_path, split)
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    rundir.write_yaml_atomic(run_dir / rundir.CONFIG, to_dict(cfg))

    meta = {"method": cfg.method, "backbone": cfg.backbone, "feat_dim": feat_dim, "image_size": cfg.image_size,
            "small_stem": uses_small_stem(cfg.small_stem, cfg.image_size), "mean": list(augment.MEAN),
            "std": list(augment.STD), "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
            "peak_lr": lr, "pipeline_version": __version__}

    def save(path: Path, epoch_done: int) -> None:
        rundir.torch_save_atomic({
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "step": step, "epochs_done": epoch_done, "rng": _rng_state(),
            "config": to_dict(cfg), "meta": meta,
        }, path)

    # --- train
    stop_at = min(total_steps, cfg.max_steps) if cfg.max_steps > 0 else total_steps
    recipes = augment.recipes_for(cfg.method, cfg.image_size)
    workers = default_workers(cfg.num_workers)
    say(f"pretraining {cfg.method}/{cfg.backbone} on {cfg.data}: {len(train_images)} train images, "
        f"{steps_per_epoch} steps/epoch, {total_steps} steps, device {device}, peak lr {lr:.4g}")
    model.train()
    bar = tqdm(total=stop_at, initial=step, desc="pretrain", unit="step", dynamic_ncols=True, disable=None)
    last_loss = float("nan")
    window_imgs, window_wait, window_t0 = 0, 0.0, time.perf_counter()
    try:
        while step < stop_at:
            epoch, start_batch = divmod(step, steps_per_epoch)
            views = augment.cpu_view_batches(train_images, recipes, cfg.image_size, cfg.batch_size, cfg.seed,
                                             epoch, start_batch, device, workers)
            t_wait = time.perf_counter()
            for x1, x2 in views:
                window_wait += time.perf_counter() - t_wait
                loss = model(x1, x2, precision)
                if not torch.isfinite(loss):
                    raise PipelineError(f"loss became {loss.item()} at step {step}: stopped; the last good checkpoint "
                                        f"{run_dir / rundir.LAST_CHECKPOINT} is kept (try a lower --lr or --precision fp32)")
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                step += 1
                model.after_step(step / total_steps)
                window_imgs += x1.shape[0]
                bar.update(1)
                if step % cfg.log_every == 0 or step == stop_at:
                    last_loss = loss.item()
                    dt = time.perf_counter() - window_t0
                    rec = {"step": step, "epoch": epoch, "loss": last_loss, "lr": scheduler.get_last_lr()[0],
                           "img_s": window_imgs / dt, "data_wait": window_wait / dt}
                    rundir.append_jsonl(run_dir / rundir.METRICS, rec)
                    bar.set_postfix(loss=f"{last_loss:.4f}", img_s=f"{rec['img_s']:.0f}", wait=f"{100 * rec['data_wait']:.0f}%")
                    window_imgs, window_wait, window_t0 = 0, 0.0, time.perf_counter()
                if step >= stop_at:
                    break
                t_wait = time.perf_counter()
            epochs_done = step // steps_per_epoch
            save(run_dir / rundir.LAST_CHECKPOINT, epochs_done)
            if cfg.save_every and step % steps_per_epoch == 0 and epochs_done % cfg.save_every == 0:
                save(run_dir / rundir.CHECKPOINTS / f"epoch_{epochs_done:04d}.pt", epochs_done)
    finally:
        bar.close()
    say(f"done: step {step}/{total_steps}, loss {last_loss:.4f}, checkpoint {run_dir / rundir.LAST_CHECKPOINT}")
    return {"step": step, "loss": last_loss}
