"""Pretraining stage: SSL on unlabelled images, exactly resumable.

setup (config, data, split, model, optimizer) -> train (steps, logs, checkpoints) -> done. Writes into RUN_DIR:
config.yaml, split.json, skipped.txt (if any), metrics.jsonl, checkpoints/last.pt (+ epoch_NNNN.pt every N epochs).
A folder that holds a run is trained into only with --resume (go on from last.pt) or --overwrite (its files are
deleted first: rundir.check_out, rundir.remove_run). SIGINT or SIGTERM stops training after the step under way,
writes last.pt at that step and returns, so `--resume` goes on exactly where it stopped (training.StopRequest).

Several processes (torchrun, or `pipeline pretrain --gpus N`): batch_size is the global batch, each rank trains on
its share of every step's images (train/distributed.py), gradients are averaged from one flat buffer after the
(CUDA-graphed) backward (DDP only with SyncBN), and rank 0 alone writes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from core import __version__, rundir
from core.config import to_dict
from core.device import precision_for, select_device
from core.errors import PipelineError
from train import distributed, preprocess, recipes
from core import provenance
from train.configs import PretrainConfig
from train.data import ImageData, load_data, make_split
from train.data_spec import n_files, named
from train.optim import load_optimizer
from train.runspec import check_max_steps, chosen_recipe, peak_lr, seed_everything, small_stem, store_size_for, validate
from train.training import (StopRequest, Training, augment_mode, build_training, compile_note, default_workers, fp32_backbone, keep_on_device, rng_state, set_rng_state, train_step, view_batches)
from core.views import MEAN, STD


@dataclass
class Checkpoints:
    """checkpoints/*.pt of this run: everything a resumed run needs to continue exactly, under the keys in
    core/rundir.py (strip and linear-eval read the same keys). Rank 0 alone writes."""

    run_dir: Path
    cfg: PretrainConfig
    training: Training
    meta: dict  # what ran (device, batch per process, peak lr, ...): config.yaml keeps what was asked
    main: bool
    wall_before: float = 0.0  # training seconds of the runs before this one (--resume): the report shows the sum
    started: float = field(default_factory=time.perf_counter)
    last_write: float = field(default_factory=time.perf_counter)  # of last.pt (or the start)

    def save(self, path: Path, step: int, epochs_done: int) -> None:
        if not self.main:
            return
        t = self.training
        model = t.model.state_dict()
        rundir.torch_save_atomic(path, {
            rundir.CKPT_MODEL: model, rundir.CKPT_OPTIMIZER: t.optimizer.state_dict(),
            rundir.CKPT_SCHEDULER: t.scheduler.state_dict(), rundir.CKPT_SCALER: t.scaler.state_dict(),
            rundir.CKPT_STEP: step, rundir.CKPT_EPOCHS_DONE: epochs_done, rundir.CKPT_RNG: rng_state(),
            rundir.CKPT_CONFIG: to_dict(self.cfg), rundir.CKPT_ID: provenance.weights_id(model),
            rundir.CKPT_META: {**self.meta, "wall_s": self.wall_before + time.perf_counter() - self.started},
        })

    def save_last(self, step: int, epochs_done: int) -> None:
        self.save(self.run_dir / rundir.LAST_CHECKPOINT, step, epochs_done)
        self.last_write = time.perf_counter()


def check_world(meta: dict, world: int, run_dir: Path) -> None:
    """Only the process count a run was trained with continues it exactly."""
    trained_on = meta.get("world_size", 1)
    if trained_on != world:
        raise PipelineError(f"--resume: {run_dir} was trained by {trained_on} process(es), this is {world}: "
                            f"resume with --gpus {trained_on}")


def finished(cfg: PretrainConfig, run_dir: Path, world: int) -> str | None:
    """For --resume: the line saying the run is already trained to the end its config now sets (nothing is read
    beyond the checkpoint's step and meta, nothing written), or None when steps remain."""
    ckpt = rundir.load_checkpoint(run_dir / rundir.LAST_CHECKPOINT, mmap=True)
    meta = ckpt.get(rundir.CKPT_META) or {}
    check_world(meta, world, run_dir)
    step, per_epoch = ckpt.get(rundir.CKPT_STEP), meta.get("steps_per_epoch")
    if not (isinstance(step, int) and isinstance(per_epoch, int)):
        return None
    end = provenance.steps_to_train(cfg.epochs, cfg.max_steps, per_epoch)
    if step < end:
        return None
    more = ("`--resume --max-steps 0` trains on through every epoch" if end < per_epoch * cfg.epochs
            else f"`--resume --epochs N` with N above {cfg.epochs} trains on")
    return (f"{run_dir} has finished training (step {step} of {end}): nothing to resume, "
            f"{run_dir / rundir.LAST_CHECKPOINT} is unchanged; {more}")


def restore(t: Training, run_dir: Path, world: int) -> tuple[int, float]:
    """Load last.pt into a freshly built training (weights, optimizer, schedule, scaler, RNG): (step, wall seconds
    so far)."""
    ckpt = rundir.load_checkpoint(run_dir / rundir.LAST_CHECKPOINT)
    meta = ckpt.get(rundir.CKPT_META, {})
    check_world(meta, world, run_dir)
    t.model.load_state_dict(ckpt[rundir.CKPT_MODEL])
    load_optimizer(t.optimizer, ckpt[rundir.CKPT_OPTIMIZER])
    t.scheduler.load_state_dict(ckpt[rundir.CKPT_SCHEDULER])
    t.scaler.load_state_dict(ckpt[rundir.CKPT_SCALER])
    set_rng_state(ckpt[rundir.CKPT_RNG])
    return ckpt[rundir.CKPT_STEP], meta.get("wall_s", 0.0)


def train_split(cfg: PretrainConfig, run_dir: Path, resume: bool) -> tuple[ImageData, dict, torch.Tensor]:
    """(data, split, the train images): decoded once, the split checked against the one a resumed run was
    trained on, the step count against --max-steps. Writes nothing: a bad input leaves the folder as it was."""
    data = load_data(cfg.data, store_size_for(cfg), seed=cfg.seed)
    split = make_split(data, cfg.val_fraction, cfg.seed)
    split_path = run_dir / rundir.SPLIT
    if resume and split_path.is_file():
        old = rundir.load_json(split_path, "split")
        if old["train_sources"] != split["train_sources"]:
            raise PipelineError(f"--resume: the images of {cfg.data} changed since {split_path} was written")
    train_images = data.images[torch.as_tensor(split["train"], dtype=torch.long)]
    if cfg.batch_size > len(train_images):
        raise PipelineError(f"batch size {cfg.batch_size} is larger than the {len(train_images)} training images of {cfg.data}")
    check_max_steps(cfg, len(train_images))  # counted from the decoded images: a skipped file made fewer steps
    return data, split, train_images


def config_header(cfg: PretrainConfig, world: int, why: str) -> str:
    """What the numbers in config.yaml meant for this run (YAML ignores it when the file is read back)."""
    lr_rule = {"linear": f"x {cfg.batch_size}/256", "sqrt": f"x sqrt({cfg.batch_size}/256)", "none": "(unscaled)"}[cfg.lr_scaling]
    return (f"# {world} process(es) x {cfg.batch_size // world} images per process = global batch {cfg.batch_size}; "
            f"peak lr {peak_lr(cfg):.6g} = lr {cfg.lr} {lr_rule} ({cfg.lr_scaling} scaling)\n"
            f"# recipe {cfg.recipe}: {why}\n")


@dataclass
class Run:
    """One pretraining process, set up: what the loop reads."""

    cfg: PretrainConfig
    run_dir: Path
    device: torch.device
    shard: tuple[int, int]  # (rank, world)
    data: ImageData
    split: dict
    train_images: torch.Tensor
    mode: str  # where views are made (training.augment_mode)
    pre: object  # the CPU path's pixel backend (train/preprocess.py)
    pre_note: str
    training: Training
    checkpoints: Checkpoints
    steps_per_epoch: int
    step: int  # steps done (a resumed run starts where last.pt ended)
    say: object
    stop_at: int  # where training ends: every epoch, or --max-steps


def setup(cfg: PretrainConfig, run_dir: Path, resume: bool, say) -> Run:
    """Device and processes, recipe, data and split, model and optimizer (or the checkpoint's, on --resume), and
    config.yaml: every input is checked before anything is said or trained."""
    device = distributed.setup(select_device(cfg.device))
    precision_for(device, cfg.precision)  # fp64 off the CPU is refused here, before the data is read
    rank, world = distributed.rank(), distributed.world_size()
    main = rank == 0
    if not main:
        say = lambda *a, **k: None  # noqa: E731  rank 0 alone talks and writes
    recipe, recipe_why = chosen_recipe(cfg)
    cfg = dataclasses.replace(cfg, recipe=recipe)  # config.yaml and the checkpoint record the recipe that ran
    if cfg.batch_size % world:
        raise PipelineError(f"batch size {cfg.batch_size} does not split over {world} processes: use a multiple of {world}")
    seed_everything(cfg.seed)
    data, split, train_images = train_split(cfg, run_dir, resume)
    mode = augment_mode(cfg.augment, device)
    pre, pre_note = preprocess.for_training(cfg.preprocess, mode, cfg.image_size)  # coreml where it cannot run fails here
    if mode == "device":
        train_images = keep_on_device(train_images, device)
    steps_per_epoch = len(train_images) // cfg.batch_size
    training, feat_dim = build_training(cfg, device, steps_per_epoch)
    step, wall_before = restore(training, run_dir, world) if resume else (0, 0.0)
    # The run folder is made only now, after every check of the input: a refused run leaves no folder behind.
    if main:
        if not resume:  # an --overwrite's old run, or what a pretraining stopped before its first checkpoint left
            rundir.remove_run(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if data.skipped:
            rundir.write_text_atomic(run_dir / rundir.SKIPPED, "".join(f"{f}\t{why}\n" for f, why in data.skipped))
    if main and not resume:
        rundir.write_json_atomic(run_dir / rundir.SPLIT, split)
    if main and resume and (run_dir / rundir.METRICS).is_file():  # steps past last.pt are trained and logged again
        logged = (run_dir / rundir.METRICS).read_text().splitlines(keepends=True)  # a cut-off last line is dropped
        rundir.write_text_atomic(run_dir / rundir.METRICS, "".join(
            line for line in logged if line.endswith("\n") and json.loads(line)["step"] <= step))
    # Said only now, after every check of the input above: a bad input's error stays the one line printed.
    over = {k: getattr(cfg, k) for k, v in recipes.values(recipe, cfg.method, cfg.backbone).items() if getattr(cfg, k) != v}
    said_over = f"; set over it: {', '.join(f'{k} {v}' for k, v in over.items())}" if over else ""
    say(f"recipe {recipe} ({recipe_why}): {recipes.source(recipe, cfg.method, cfg.backbone)}{said_over}")
    if data.skipped:
        say(f"warning: skipped {n_files(len(data.skipped))} of {cfg.data} that are not readable images: "
            f"{named(data.skipped, Path(cfg.data.partition(':')[2]))} (all listed in {run_dir / rundir.SKIPPED})")
    if resume:
        say(f"resuming {run_dir} at step {step} (epoch {step // steps_per_epoch})")
    if main:
        rundir.write_text_atomic(run_dir / rundir.CONFIG, config_header(cfg, world, recipe_why)
                                 + yaml.safe_dump(to_dict(cfg), sort_keys=False))
    meta = {"method": cfg.method, "backbone": cfg.backbone, "feat_dim": feat_dim, "image_size": cfg.image_size,
            "small_stem": small_stem(cfg), "mean": list(MEAN), "std": list(STD),
            "steps_per_epoch": steps_per_epoch, "total_steps": training.total_steps, "peak_lr": peak_lr(cfg),
            "pipeline_version": __version__, "world_size": world, "per_process_batch": cfg.batch_size // world,
            "global_batch": cfg.batch_size, "lr_scaling": cfg.lr_scaling, "device": str(device),
            "frozen_parameters": sorted(n for n, p in training.model.backbone.named_parameters() if not p.requires_grad)}
    checkpoints = Checkpoints(run_dir, cfg, training, meta, main, wall_before)
    stop_at = provenance.steps_to_train(cfg.epochs, cfg.max_steps, steps_per_epoch)
    return Run(cfg, run_dir, device, (rank, world), data, split, train_images, mode, pre, pre_note, training,
               checkpoints, steps_per_epoch, step, say, stop_at)


@dataclass
class LossLog:
    """Each step's loss is looked at (NaN check, metrics.jsonl line) one step late: reading it at once would make
    the host wait for the GPU to finish the step, leaving the GPU idle while the next step is queued."""

    r: Run
    stop_at: int
    bar: tqdm
    window: tuple  # where the current log window began: (step, clock, seconds waited for batches)
    last_loss: float = math.nan

    def look(self, done: tuple) -> None:
        at, epoch_of, loss_t, lr_now, clock, waited_then = done
        cfg = self.r.cfg
        value = float(loss_t)
        if not math.isfinite(value):
            raise PipelineError(f"loss became {value} at step {at}: stopped; the last good checkpoint "
                                f"{self.r.run_dir / rundir.LAST_CHECKPOINT} is kept (try a lower --lr or --precision fp32)")
        self.last_loss = value
        if (at + 1) % cfg.log_every == 0 or at + 1 == self.stop_at:
            dt = max(clock - self.window[1], 1e-9)
            rec = {"step": at + 1, "epoch": epoch_of, "loss": value, "lr": lr_now,
                   "img_s": (at + 1 - self.window[0]) * cfg.batch_size / dt,
                   "data_wait": (waited_then - self.window[2]) / dt}
            if self.r.checkpoints.main:
                rundir.append_jsonl(self.r.run_dir / rundir.METRICS, rec)
            self.bar.set_postfix(loss=f"{value:.4f}", img_s=f"{rec['img_s']:.0f}", wait=f"{100 * rec['data_wait']:.0f}%")
            self.window = (at + 1, clock, waited_then)


def epoch_end(r: Run, step: int, stop_at: int, knn: dict, stopping: bool = False) -> None:
    """After each epoch's steps, and where a signal stopped training: last.pt when due (always at the end and at a
    stop), epoch_NNNN.pt every save_every epochs, and the online kNN monitor (train/knn.py: val queries against
    the train bank, eval mode, fp32, no RNG drawn). The epoch's own hooks run at an epoch end only, whichever of
    the two it is, so a stopped and resumed run writes what an uninterrupted one writes."""
    cfg, spe = r.cfg, r.steps_per_epoch
    epochs_done = step // spe
    if step >= stop_at or stopping or time.perf_counter() - r.checkpoints.last_write >= cfg.checkpoint_every_s:
        r.checkpoints.save_last(step, epochs_done)
    if cfg.save_every and step % spe == 0 and epochs_done % cfg.save_every == 0:
        r.checkpoints.save(r.run_dir / rundir.CHECKPOINTS / f"epoch_{epochs_done:04d}.pt", step, epochs_done)
    if r.checkpoints.main and cfg.knn_every > 0 and step % spe == 0 and epochs_done % cfg.knn_every == 0:
        if "monitor" not in knn:  # built at the first monitored epoch
            from train.knn import make_monitor
            knn["monitor"] = make_monitor(r.data, r.split, cfg.image_size, r.device, r.say) or (lambda backbone: None)
        top1 = knn["monitor"](fp32_backbone(r.training))
        if top1 is not None:
            rundir.append_jsonl(r.run_dir / rundir.METRICS, {"step": step, "epoch": epochs_done - 1, "knn_top1": top1})


def train(r: Run) -> tuple[int, float, int]:
    """The steps from r.step to the end (or max_steps), or to the step a SIGINT/SIGTERM came during: (steps
    done, last loss, the signal that stopped training or 0). The step under way when a signal comes is finished,
    never dropped half-applied; last.pt is then written at it, with every later signal ignored until it is."""
    cfg, t, spe, stop_at = r.cfg, r.training, r.steps_per_epoch, r.stop_at
    views = recipes.views_for(cfg.recipe, cfg.method, cfg.image_size, cfg.crop_min_scale, cfg.solarize_p)
    workers = default_workers(cfg.num_workers)
    r.say(f"pretraining {cfg.method}/{cfg.backbone} on {cfg.data}: {len(r.train_images)} train images, "
          f"{spe} steps/epoch, {t.total_steps} steps, device {r.device} x {r.shard[1]}, augment {r.mode}, "
          f"preprocess {r.pre_note}, channels_last {t.channels_last}, CUDA graphs {t.captured or 'off'}, "
          f"compiled {compile_note(t, cfg, r.shard[1])}, peak lr {peak_lr(cfg):.4g}")
    t.model.train()
    step, waited, pending, knn = r.step, 0.0, None, {}  # waited: host seconds spent waiting for batches
    bar = tqdm(total=stop_at, initial=step, desc="pretrain", unit="step", dynamic_ncols=True,
               disable=None if r.checkpoints.main else True)
    log = LossLog(r, stop_at, bar, (step, time.perf_counter(), waited))
    stopped = 0
    with StopRequest() as stop, bar:  # the bar closes also when training fails
        while step < stop_at and not stopped:
            epoch, start_batch = divmod(step, spe)
            batches = view_batches(r.mode, r.train_images, views, cfg.image_size, cfg.batch_size, cfg.seed, epoch,
                                   start_batch, r.device, workers, r.shard, t.channels_last, r.pre, t.cuda_graphs)
            t_wait = time.perf_counter()
            for batch in batches:  # one batch per view
                waited += time.perf_counter() - t_wait
                loss = train_step(t, batch, step)
                if pending is not None:
                    log.look(pending)
                # the clock after queueing a step: on a GPU the host runs at most a step or two ahead of it
                pending = (step, epoch, loss, t.scheduler.get_last_lr()[0], time.perf_counter(), waited)
                step += 1
                bar.update(1)
                if step >= stop_at:
                    break
                stopped = stop.agreed()  # asked after every step but the last, on every rank alike
                if stopped:
                    break
                t_wait = time.perf_counter()
            if pending is not None:
                log.look(pending)
                pending = None
            epoch_end(r, step, stop_at, knn, stopping=bool(stopped))
    return step, log.last_loss, stopped


def run(cfg: PretrainConfig, run_dir: Path, resume: bool = False, say=print, overwrite: bool = False) -> dict:
    """setup -> train -> finish. The process group is left also when training fails (no rank waits for it then).
    {"step", "loss", "model", "stopped"}: `stopped` is the line for a run a signal stopped (the CLI exits 130
    with it), "" otherwise; a --resume of a finished run says so and returns {"finished": line} untouched."""
    validate(cfg)
    rundir.check_out(run_dir, resume, overwrite)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's; the group is joined in setup
    if resume and (line := finished(cfg, run_dir, world)):
        if distributed.env_rank() == 0:
            say(line)
        return {"finished": line}
    ended = False
    try:
        r = setup(cfg, run_dir, resume, say)
        step, loss, stopped = train(r)
        ended = True
    finally:
        distributed.cleanup(wait=ended)
    last = run_dir / rundir.LAST_CHECKPOINT
    if stopped:
        line = (f"stopped by {signal.Signals(stopped).name} at step {step} of {r.stop_at}: {last} holds it; "
                f"`{rundir.resume_command(run_dir, world)}` goes on from step {step}")
    else:
        line = ""
        r.say(f"done: step {step}/{r.training.total_steps}, loss {loss:.4f}, checkpoint {last}")
    return {"step": step, "loss": loss, "model": r.training.model, "stopped": line}
