"""Pretraining stage: SSL on unlabelled images, exactly resumable.

setup (config, data, split, model, optimizer) -> train (steps, logs, checkpoints) -> done. Writes into RUN_DIR:
config.yaml, split.json, skipped.txt (if any), metrics.jsonl, checkpoints/last.pt (+ epoch_NNNN.pt every N epochs).

Several processes (torchrun, or `pipeline pretrain --gpus N`): batch_size is the global batch, each rank trains on
its share of every step's images (stages/distributed.py), gradients are averaged by DDP, and rank 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from pipeline import __version__, rundir
from pipeline.config import to_dict
from pipeline.device import select_device
from pipeline.errors import PipelineError
from stages import distributed, preprocess, recipes
from stages.backbones import uses_small_stem
from stages.configs import PretrainConfig
from stages.data import load_data, make_split
from stages.runspec import chosen_recipe, peak_lr, seed_everything, store_size_for, validate
from stages.views import MEAN, STD
from stages.training import (augment_mode, build_training, default_workers, keep_on_device, rng_state,
                             set_rng_state, train_step, view_batches)


def run(cfg: PretrainConfig, run_dir: Path, resume: bool = False, say=print) -> dict:
    validate(cfg)
    device = distributed.setup(select_device(cfg.device))
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    if not main:
        say = lambda *a, **k: None  # noqa: E731  rank 0 alone talks and writes
    recipe, recipe_why = chosen_recipe(cfg)
    cfg = dataclasses.replace(cfg, recipe=recipe)  # config.yaml and the checkpoint record the recipe that ran
    if cfg.batch_size % world:
        raise PipelineError(f"batch size {cfg.batch_size} does not split over {world} processes: use a multiple of {world}")
    seed_everything(cfg.seed)
    run_dir.mkdir(parents=True, exist_ok=True)

    # --- data and split
    data = load_data(cfg.data, store_size_for(cfg), seed=cfg.seed)
    if data.skipped and main:
        rundir.write_text_atomic(run_dir / rundir.SKIPPED, "".join(f"{f}\t{why}\n" for f, why in data.skipped))
    split = make_split(data, cfg.val_fraction, cfg.seed)
    split_path = run_dir / rundir.SPLIT
    if resume and split_path.is_file():
        old = rundir.load_json(split_path, "split")
        if old["train_sources"] != split["train_sources"]:
            raise PipelineError(f"--resume: the images of {cfg.data} changed since {split_path} was written")
    train_images = data.images[torch.as_tensor(split["train"], dtype=torch.long)]
    if cfg.batch_size > len(train_images):
        raise PipelineError(f"batch size {cfg.batch_size} is larger than the {len(train_images)} training images of {cfg.data}")

    mode = augment_mode(cfg.augment, device)
    pre, pre_note = preprocess.for_training(cfg.preprocess, mode, cfg.image_size)  # coreml where it cannot run fails here
    if mode == "device":
        train_images = keep_on_device(train_images, device)

    # --- model, optimizer, schedule
    steps_per_epoch = len(train_images) // cfg.batch_size
    training, feat_dim = build_training(cfg, device, steps_per_epoch)
    model, optimizer, scheduler, scaler = training.model, training.optimizer, training.scheduler, training.scaler
    total_steps = training.total_steps
    lr = peak_lr(cfg)
    step = 0
    if resume:
        ckpt = rundir.load_checkpoint(run_dir / rundir.LAST_CHECKPOINT)
        trained_on = ckpt.get("meta", {}).get("world_size", 1)
        if trained_on != world:
            raise PipelineError(f"--resume: {run_dir} was trained by {trained_on} process(es), this is {world}: "
                                f"resume with --gpus {trained_on}")
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        scaler.load_state_dict(ckpt["scaler"])
        set_rng_state(ckpt["rng"])
        step = ckpt["step"]
    elif main:
        rundir.write_json_atomic(split_path, split)
        (run_dir / rundir.METRICS).unlink(missing_ok=True)
    # Said only now, after every check of the input above: a bad input's error stays the one line printed.
    say(f"recipe {recipe} ({recipe_why}): {recipes.RECIPES[recipe][cfg.method].source}")
    if data.skipped:
        say(f"warning: skipped {len(data.skipped)} unreadable or non-image files (listed in {run_dir / rundir.SKIPPED})")
    if resume:
        say(f"resuming {run_dir} at step {step} (epoch {step // steps_per_epoch})")
    # The header states what the numbers below meant for this run (YAML ignores it when the file is read back).
    lr_rule = {"linear": f"x {cfg.batch_size}/256", "sqrt": f"x sqrt({cfg.batch_size}/256)", "none": "(unscaled)"}[cfg.lr_scaling]
    header = (f"# {world} process(es) x {cfg.batch_size // world} images per process = global batch {cfg.batch_size}; "
              f"peak lr {lr:.6g} = lr {cfg.lr} {lr_rule} ({cfg.lr_scaling} scaling)\n"
              f"# recipe {recipe}: {recipe_why}\n")
    if main:
        rundir.write_text_atomic(run_dir / rundir.CONFIG, header + yaml.safe_dump(to_dict(cfg), sort_keys=False))

    meta = {"method": cfg.method, "backbone": cfg.backbone, "feat_dim": feat_dim, "image_size": cfg.image_size,
            "small_stem": uses_small_stem(cfg.small_stem, cfg.image_size), "mean": list(MEAN),
            "std": list(STD), "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
            "peak_lr": lr, "pipeline_version": __version__, "world_size": world,
            "per_process_batch": cfg.batch_size // world, "global_batch": cfg.batch_size, "lr_scaling": cfg.lr_scaling,
            "device": str(device)}  # config.yaml keeps what was asked (often `auto`); the report shows what ran
    # Training wall time summed over every resume, so the report can say what the whole run cost.
    wall_before = ckpt.get("meta", {}).get("wall_s", 0.0) if resume else 0.0
    t_start = time.perf_counter()

    def save(path: Path, epoch_done: int) -> None:
        if not main:
            return
        rundir.torch_save_atomic({
            "model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict(), "step": step, "epochs_done": epoch_done, "rng": rng_state(),
            "config": to_dict(cfg), "meta": {**meta, "wall_s": wall_before + time.perf_counter() - t_start},
        }, path)

    # --- train
    stop_at = min(total_steps, cfg.max_steps) if cfg.max_steps > 0 else total_steps
    views = recipes.views_for(recipe, cfg.method, cfg.image_size)
    workers = default_workers(cfg.num_workers)
    say(f"pretraining {cfg.method}/{cfg.backbone} on {cfg.data}: {len(train_images)} train images, "
        f"{steps_per_epoch} steps/epoch, {total_steps} steps, device {device} x {world}, augment {mode}, "
        f"preprocess {pre_note}, channels_last {training.channels_last}, CUDA graphs {training.cuda_graphs}, "
        f"peak lr {lr:.4g}")
    model.train()
    bar = tqdm(total=stop_at, initial=step, desc="pretrain", unit="step", dynamic_ncols=True, disable=None if main else True)
    last_loss = float("nan")
    knn_monitor = None  # built at the first monitored epoch
    waited = 0.0  # host seconds spent waiting for batches, since the start
    window = (step, time.perf_counter(), waited)  # where the current log window began: step, clock, waited
    # Each step's loss is looked at (NaN check, log line) one step late: reading it at once would make the host
    # wait for the GPU to finish the step, leaving the GPU idle while the next step is queued.
    pending = None
    last_write = time.perf_counter()  # when last.pt was last written (or training began)

    def look(done: tuple) -> None:
        nonlocal last_loss, window
        at, epoch_of, loss_t, lr_now, clock, waited_then = done
        value = float(loss_t)
        if not math.isfinite(value):
            raise PipelineError(f"loss became {value} at step {at}: stopped; the last good checkpoint "
                                f"{run_dir / rundir.LAST_CHECKPOINT} is kept (try a lower --lr or --precision fp32)")
        last_loss = value
        if (at + 1) % cfg.log_every == 0 or at + 1 == stop_at:
            dt = max(clock - window[1], 1e-9)
            rec = {"step": at + 1, "epoch": epoch_of, "loss": value, "lr": lr_now,
                   "img_s": (at + 1 - window[0]) * cfg.batch_size / dt, "data_wait": (waited_then - window[2]) / dt}
            if main:
                rundir.append_jsonl(run_dir / rundir.METRICS, rec)
            bar.set_postfix(loss=f"{value:.4f}", img_s=f"{rec['img_s']:.0f}", wait=f"{100 * rec['data_wait']:.0f}%")
            window = (at + 1, clock, waited_then)

    try:
        while step < stop_at:
            epoch, start_batch = divmod(step, steps_per_epoch)
            batches = view_batches(mode, train_images, views, cfg.image_size, cfg.batch_size, cfg.seed,
                                         epoch, start_batch, device, workers, (rank, world), training.channels_last,
                                         pre)
            t_wait = time.perf_counter()
            for x1, x2 in batches:
                waited += time.perf_counter() - t_wait
                loss = train_step(training, x1, x2, step)
                if pending is not None:
                    look(pending)
                # the clock after queueing a step: on a GPU the host runs at most a step or two ahead of it
                pending = (step, epoch, loss, scheduler.get_last_lr()[0], time.perf_counter(), waited)
                step += 1
                bar.update(1)
                if step >= stop_at:
                    break
                t_wait = time.perf_counter()
            if pending is not None:
                look(pending)
                pending = None
            epochs_done = step // steps_per_epoch
            if step >= stop_at or time.perf_counter() - last_write >= cfg.checkpoint_every_s:
                save(run_dir / rundir.LAST_CHECKPOINT, epochs_done)
                last_write = time.perf_counter()
            if cfg.save_every and step % steps_per_epoch == 0 and epochs_done % cfg.save_every == 0:
                save(run_dir / rundir.CHECKPOINTS / f"epoch_{epochs_done:04d}.pt", epochs_done)
            # Online kNN monitor (stages/knn.py): val queries against the train bank, eval mode, fp32, no RNG drawn.
            if main and cfg.knn_every > 0 and step % steps_per_epoch == 0 and epochs_done % cfg.knn_every == 0:
                if knn_monitor is None:
                    from stages.knn import make_monitor
                    knn_monitor = make_monitor(data, split, cfg.image_size, device, say) or (lambda backbone: None)
                top1 = knn_monitor(model.backbone)
                if top1 is not None:
                    rundir.append_jsonl(run_dir / rundir.METRICS, {"step": step, "epoch": epochs_done - 1, "knn_top1": top1})
    finally:
        bar.close()
    say(f"done: step {step}/{total_steps}, loss {last_loss:.4f}, checkpoint {run_dir / rundir.LAST_CHECKPOINT}")
    distributed.cleanup()
    return {"step": step, "loss": last_loss, "model": model}
