"""Pretraining stage: SSL on unlabelled images, exactly resumable.

setup (config, data, split, model, optimizer) -> train (steps, logs, checkpoints) -> done. Writes into RUN_DIR:
config.yaml, split.json, skipped.txt (if any), metrics.jsonl, checkpoints/last.pt (+ epoch_NNNN.pt every N epochs).

Several processes (torchrun, or `pipeline pretrain --gpus N`): batch_size is the global batch, each rank trains on
its share of every step's images (stages/distributed.py), gradients are averaged from one flat buffer after the
(CUDA-graphed) backward (DDP only with SyncBN), and rank 0 alone writes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml
from tqdm import tqdm

from pipeline import __version__, rundir
from pipeline.config import load_config, to_dict
from pipeline.device import precision_for, select_device
from pipeline.errors import PipelineError
from stages import augment, distributed, preprocess, recipes
from stages.backbones import build_backbone, min_image_size, uses_small_stem
from stages.configs import PretrainConfig
from stages.data import count_train_images, load_data, make_split
from stages.data import store_size_for as data_store_size
from stages.methods import METHODS
from stages.optim import build_optimizer, warmup_cosine


def chosen_recipe(cfg: PretrainConfig) -> tuple[str, str]:
    """(recipe, why) for this run's scale: train images (counted from the SPEC without decoding), steps, image size."""
    n_train = count_train_images(cfg.data, cfg.val_fraction)
    steps = n_train // cfg.batch_size * cfg.epochs
    return recipes.choose(cfg.recipe, n_train, steps, cfg.image_size)


def resolve(cfg: PretrainConfig) -> PretrainConfig:
    """Fill every None with the chosen recipe's value for the method (stages/recipes.py), so config.yaml records
    what actually ran; `recipe` itself stays as asked (run() records the one chosen)."""
    name, _ = chosen_recipe(cfg)
    defaults = {"temperature": 0.5, "proj_dim": 128, "proj_hidden_dim": 2048, "pred_hidden_dim": 4096,
                "momentum_base": 0.99, "queue_size": 0, "crop_min_scale": recipes.crop_min_scale(name, cfg.method),
                **recipes.values(name, cfg.method)}
    filled = {k: (defaults[k] if getattr(cfg, k) is None and k in defaults else getattr(cfg, k)) for k in to_dict(cfg)}
    return PretrainConfig(**filled)


# Bounds of the numeric options (None = the method's default, always valid): a value outside them would train on
# nonsense (a negative rate ascends the loss, a momentum above 1 extrapolates) instead of stopping with its name.
BOUNDS = {  # key: (lowest, highest, whether the lowest itself is allowed)
    "lr": (0.0, math.inf, False), "temperature": (0.0, math.inf, False), "weight_decay": (0.0, math.inf, True),
    "momentum_base": (0.0, 1.0, True), "crop_min_scale": (0.0, 1.0, False), "warmup_epochs": (0.0, math.inf, True),
    "proj_dim": (1, math.inf, True), "proj_hidden_dim": (1, math.inf, True), "pred_hidden_dim": (1, math.inf, True),
    "queue_size": (0, math.inf, True), "max_steps": (0, math.inf, True), "log_every": (1, math.inf, True),
    "save_every": (0, math.inf, True), "knn_every": (0, math.inf, True), "num_workers": (-1, math.inf, True),
}


def validate(cfg: PretrainConfig) -> None:
    for key, (lo, hi, lo_ok) in BOUNDS.items():
        value = getattr(cfg, key)
        if value is not None and not ((lo <= value if lo_ok else lo < value) and value <= hi):
            bound = f"{'>=' if lo_ok else '>'} {lo:g}" + (f" and <= {hi:g}" if hi < math.inf else "")
            raise PipelineError(f"`{key}` must be {bound}, got {value!r}")
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
    if cfg.lars_eta <= 0:
        raise PipelineError(f"lars_eta must be > 0, got {cfg.lars_eta}")
    if cfg.checkpoint_every_s < 0:
        raise PipelineError(f"checkpoint_every_s must be >= 0 (0 = every epoch), got {cfg.checkpoint_every_s}")
    if cfg.queue_size and cfg.method != "mocov3":
        raise PipelineError(f"queue_size is a MoCo v3 option; method is {cfg.method}")


def store_size_for(cfg: PretrainConfig) -> int:
    return data_store_size(cfg.data, cfg.image_size, cfg.store_size)


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
        for key in ("method", "recipe", "backbone", "image_size", "small_stem", "data", "batch_size", "seed", "proj_dim",
                    "proj_hidden_dim", "pred_hidden_dim", "queue_size", "val_fraction"):
            if getattr(cfg, key) is not None and getattr(old, key) is not None and getattr(cfg, key) != getattr(old, key):
                raise PipelineError(f"--resume: `{key}` is {getattr(old, key)!r} in {saved}, cannot change it to {getattr(cfg, key)!r}")
    else:
        cfg = load_config(PretrainConfig, config_file, overrides)
    cfg = resolve(cfg)
    validate(cfg)  # a bad value fails here, before a process is launched or a file written
    return cfg


def use_channels_last(choice: str, device: torch.device) -> bool:
    return choice == "on" or (choice == "auto" and device.type == "cuda")


def keep_on_device(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The uint8 train set on the training device when it takes at most a quarter of the free memory there (no
    host work or copy per step then); otherwise it stays on the host and each batch's images are copied over."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        fits = images.numel() <= free // 4
    elif device.type == "mps" and hasattr(torch.mps, "recommended_max_memory"):
        fits = images.numel() <= torch.mps.recommended_max_memory() // 4
    else:
        fits = device.type == "cpu"
    return images.to(device) if fits else images


def use_cuda_graphs(choice: str, device: torch.device, world: int, compiled: bool, sync_bn: bool = False) -> bool:
    """CUDA graphs need CUDA; torch.compile brings its own graphs, and SyncBatchNorm's collectives (it runs under
    DDP) would sit inside the captured forward and backward: those cases stay eager. Several processes otherwise
    graph the backbone as one does and average gradients after it (distributed.flat_gradients)."""
    possible = device.type == "cuda" and not compiled and not (world > 1 and sync_bn)
    if choice == "on" and not possible:
        raise PipelineError("--cuda-graphs on needs CUDA without --compile or --sync-bn (this run: device "
                            f"{device.type}, {world} process(es), compile {compiled}, sync_bn {sync_bn}); use auto or off")
    return choice != "off" and possible


def graph_backbone(backbone: torch.nn.Module, batch: int, image_size: int, channels_last: bool, precision) -> None:
    """Capture the backbone's training forward and backward for `batch` images (torch.cuda.make_graphed_callables,
    in place: the module keeps its parameters and state_dict, eval mode still runs the plain forward). Every
    step then costs two graph launches instead of the layer-by-layer launches from Python. The capture's warm-up
    passes move the BatchNorm statistics; they are put back, so training starts exactly where it would have."""
    device = next(backbone.parameters()).device
    saved = [b.detach().clone() for b in backbone.buffers()]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    own = torch.Generator(device).manual_seed(0)  # not the global CUDA generator: its state is the run's
    sample = torch.randn(batch, 3, image_size, image_size, device=device, generator=own).contiguous(memory_format=fmt)
    amp = (torch.autocast(device.type, dtype=precision.backbone_dtype, cache_enabled=False)  # capture needs no cache
           if precision.backbone_dtype is not None else contextlib.nullcontext())
    # The capture's warm-up runs on make_graphed_callables' own stream, and autograd remembers that stream for each
    # parameter's gradient accumulator: every backward then adds a GPU-side event wait per parameter (no host
    # wait; measured: the step runs at 0.965 x its ceiling) and torch warns once, already during the capture (seen
    # on an H200 with torch 2.11). Expected here, so not shown: the switch torch offers where it has one, and a
    # filter for exactly that message (its first sentence), both set before the capture.
    if hasattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch"):
        torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)
    warnings.filterwarnings("ignore", message=r"The AccumulateGrad node's stream does not match the stream of the "
                                              r"node that produced the incoming gradient", category=UserWarning)
    with amp:
        torch.cuda.make_graphed_callables(backbone, (sample,))
    with torch.no_grad():
        for b, s in zip(backbone.buffers(), saved):
            b.copy_(s)  # in place: the graphs hold these addresses


@dataclass
class Training:
    """What one optimisation step needs. `run` and stages/bench.py both use it, so the benchmark times the very
    step that training runs."""

    model: torch.nn.Module  # the method module: state_dict, after_step
    forward: torch.nn.Module  # the model, or its DistributedDataParallel wrapper with several processes
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    precision: object
    total_steps: int
    channels_last: bool
    cuda_graphs: bool = False
    grads: torch.Tensor | None = None  # several processes without SyncBN: the flat gradient buffer averaged each step


def build_training(cfg: PretrainConfig, device: torch.device, steps_per_epoch: int) -> tuple[Training, int]:
    """Model (memory format, SyncBN, compile, CUDA graphs, gradient averaging), optimizer, schedule, scaler for this process; (training, feat_dim)."""
    model, feat_dim = build_model(cfg)
    model.to(device)
    channels_last = use_channels_last(cfg.channels_last, device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # shapes never change: cuDNN times its conv algorithms once, then reuses the fastest
    world = distributed.world_size()
    if world > 1 and cfg.sync_bn:
        if device.type != "cuda":
            raise PipelineError("--sync-bn needs CUDA: torch's SyncBatchNorm has no CPU kernel (drop --sync-bn on CPU)")
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    if cfg.compile:
        model.backbone.compile()  # in place: state_dict keys stay those of the plain module
    precision = precision_for(device, cfg.precision)
    graphs = use_cuda_graphs(cfg.cuda_graphs, device, world, cfg.compile, cfg.sync_bn)
    if graphs:  # both views of this process's images go through the backbone as one batch
        graph_backbone(model.backbone, 2 * (cfg.batch_size // world), cfg.image_size, channels_last, precision)
    total_steps = steps_per_epoch * cfg.epochs
    optimizer = build_optimizer(cfg.optimizer, model.parameters(), peak_lr(cfg), cfg.weight_decay, cfg.lars_eta)
    scheduler = warmup_cosine(optimizer, round(cfg.warmup_epochs * steps_per_epoch), total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    forward, grads = model, None
    if world > 1:
        distributed.broadcast_from_main(model)
        if cfg.sync_bn:  # SyncBatchNorm is supported under DDP only (torch's documentation)
            forward = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
        else:  # one all-reduce of one flat buffer after the (graphed) backward: see distributed.flat_gradients
            grads = distributed.flat_gradients(model.parameters())
    return Training(model, forward, optimizer, scheduler, scaler, precision, total_steps, channels_last, graphs,
                    grads), feat_dim


def train_step(t: Training, x1: torch.Tensor, x2: torch.Tensor, step: int) -> torch.Tensor:
    """One optimisation step (step = steps done before it). Returns the loss averaged over processes, detached and
    still on the device: reading it waits for the GPU, so the caller chooses when (the loop reads it a step late)."""
    loss = t.forward(x1, x2, t.precision)
    if t.grads is None:
        t.optimizer.zero_grad(set_to_none=True)
    else:
        t.grads.zero_()  # the grads are views of this buffer: they must stay
    t.scaler.scale(loss).backward()
    if t.grads is not None:
        distributed.average_(t.grads)
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.scheduler.step()
    t.model.after_step((step + 1) / t.total_steps)
    return distributed.mean(loss)


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

    mode = augment.augment_mode(cfg.augment, device)
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
        _set_rng_state(ckpt["rng"])
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
            "small_stem": uses_small_stem(cfg.small_stem, cfg.image_size), "mean": list(augment.MEAN),
            "std": list(augment.STD), "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
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
            "scaler": scaler.state_dict(), "step": step, "epochs_done": epoch_done, "rng": _rng_state(),
            "config": to_dict(cfg), "meta": {**meta, "wall_s": wall_before + time.perf_counter() - t_start},
        }, path)

    # --- train
    stop_at = min(total_steps, cfg.max_steps) if cfg.max_steps > 0 else total_steps
    views = recipes.views_for(recipe, cfg.method, cfg.image_size, cfg.crop_min_scale)
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
            batches = augment.view_batches(mode, train_images, views, cfg.image_size, cfg.batch_size, cfg.seed,
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
