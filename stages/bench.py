"""`pipeline bench`: pretraining throughput in one process, end to end and against the model-step ceiling.

For one configuration it reports
- e2e img/s: the training step (training.train_step) fed by the real batch source (training.view_batches: the
  device path, or CPU DataLoader workers with --augment cpu), reading each loss one step late as the loop does;
- ceiling img/s: the same step on ready views already on the device (no augmentation, no data movement);
  the step is a long run's: compiled where the backbone's row says compiling repays, for the method (use_compile);
- ratio = e2e / ceiling; data-wait %: share of the e2e time the host spent waiting for its next batch (for the
  device path that is the time to draw parameters and queue the augmentation kernels, whose GPU time shows in the
  ratio instead); augment ms: the batch source alone, per step; peak memory (CUDA: allocated by torch; CPU: the
  process's peak resident set, DataLoader workers not included); setup s: from building the model to the end of its
  first step (graph capture, and for a compiled backbone the compiling; torch's compile cache makes a second run's shorter).
Every figure is the median of several timed windows after warm-up; each window starts and ends with a device
synchronisation, so GPU work is counted in the window that queued it. img/s counts images (each gives its method's
views), over all processes. The images are synthetic uint8 noise at the store size (pixel values do not change
what any op costs), laid out as one epoch long enough that no window crosses an epoch boundary.
"""

from __future__ import annotations

import json
import math
import platform
import re
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from core.device import select_device
from core.errors import PipelineError
from train import augment, distributed, preprocess
from train.configs import BenchConfig, PretrainConfig
from train.data import store_size_for
from train.methods import METHODS
from train.runspec import resolve, validate
from train.training import augment_mode, build_training, default_workers, keep_on_device, train_step, view_batches


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


SETTLE_WINDOWS = 3  # on a GPU, at most this many extra untimed windows until two in a row agree within 5 %


def _windows(step, warmup: int, windows: int, steps: int, device: torch.device) -> list[tuple[float, float]]:
    """Run `step` (returns host seconds spent waiting for data) warmup times; on a GPU, then untimed windows until
    the rate settles (allocator pools, compile workers and clocks take a while after the first steps: a fixed
    warm-up left the first windows of a run slower); then `windows` timed windows of `steps`
    calls. Returns (seconds, waited seconds) per timed window."""
    def window() -> tuple[float, float]:
        _sync(device)
        t0, waited = time.perf_counter(), 0.0
        for _ in range(steps):
            waited += step()
        _sync(device)
        return time.perf_counter() - t0, waited

    for _ in range(warmup):
        step()
    if device.type != "cpu" and warmup:
        last = window()[0]
        for _ in range(SETTLE_WINDOWS):
            now = window()[0]
            if abs(now - last) <= 0.05 * last:
                break
            last = now
    return [window() for _ in range(windows)]


# Host calls that wait for the GPU: the time in them is time the host had nothing to do (a GPU-bound step).
WAIT_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")

# A GPU kernel's family, by the first pattern its name matches (case-insensitive), in this order: the names come
# from cuDNN, cuBLAS, ATen and Triton, and some would match a later family too (cuDNN's attention kernels say
# "cudnn", its convolutions "implicit_gemm", an ATen copy is an "elementwise_kernel" of a copy functor).
KERNEL_FAMILIES = (
    ("compiled (Triton)", r"^triton"),  # inductor's fused kernels, whatever ops they fused
    ("attention", r"sdpa|flash|fmha|attention"),
    ("convolution", r"fprop|dgrad|wgrad|implicit_gemm|conv|cudnn"),
    ("matrix product", r"nvjet|gemm|cutlass|cublas"),
    ("BatchNorm", r"batch_norm|batchnorm"),
    ("layer norm", r"layer_norm"),
    ("multi-tensor (optimizer, momentum update)", r"multi_tensor|foreach|fused_adam|fused_sgd"),
    ("copy", r"copy|memcpy|memset|cat_batched|catarray"),
    ("reduction, softmax", r"reduce|softmax|norm_kernel"),
    ("elementwise", r"elementwise|functor"),
)


def kernel_family(name: str, category: str = "kernel") -> str:
    """The family of a kernel named `name` (KERNEL_FAMILIES); a trace's memcpy and memset events are copies."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "copy"
    return next((fam for fam, pattern in KERNEL_FAMILIES if re.search(pattern, name, re.IGNORECASE)), "other")


def summarize_trace(events: list[dict], steps: int) -> dict:
    """Chrome-trace events of `steps` steps -> where the time went, per step: wall (first to last event), GPU busy
    (kernel and copy time on any stream, overlaps merged), kernel time per stream (the busiest is the main one),
    host time blocked in WAIT_CALLS, GPU time per kernel family (KERNEL_FAMILIES), and the five costliest kernels.
    GPU busy near 100 % means the GPU is the
    limit; well below, with little host waiting, means the host is."""
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    timed = [e for e in events if "ts" in e and "dur" in e and e.get("ph") == "X"]
    if not timed:
        return {}
    wall = max(e["ts"] + e["dur"] for e in timed) - min(e["ts"] for e in timed)
    busy, end = 0.0, -math.inf
    for s, d in sorted((e["ts"], e["dur"]) for e in gpu):  # union of the intervals
        if s + d > end:
            busy += s + d - max(s, end)
            end = s + d
    streams: dict = {}
    kernels: dict = {}
    families: dict = {}
    for e in gpu:
        sid = e.get("args", {}).get("stream", -1)
        streams[sid] = streams.get(sid, 0.0) + e["dur"]
        kernels[e["name"]] = kernels.get(e["name"], 0.0) + e["dur"]
        fam = kernel_family(e["name"], e["cat"])
        families[fam] = families.get(fam, 0.0) + e["dur"]
    waited = sum(e["dur"] for e in timed if e.get("name") in WAIT_CALLS)
    ms = lambda us: round(us / 1000 / steps, 3)  # noqa: E731  trace times are microseconds
    ranked = sorted(streams.items(), key=lambda kv: -kv[1])
    return {
        "wall_ms_per_step": ms(wall), "gpu_busy_pct": round(100 * busy / wall, 1) if wall else 0.0,
        "gpu_ms_per_step": ms(busy), "host_wait_ms_per_step": ms(waited),
        "stream_kernel_ms_per_step": {("main" if i == 0 else f"stream {sid}"): ms(t) for i, (sid, t) in enumerate(ranked)},
        "kernel_families_ms_per_step": {f: ms(t) for f, t in sorted(families.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms_per_step": {name[:80]: ms(t) for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:5]},
    }


def profile_phase(step, steps: int, device: torch.device, trace: Path) -> dict:
    """`steps` calls of `step` under torch.profiler (CPU and CUDA activity), the trace written to `trace` (open it
    in chrome://tracing or Perfetto), summarised by summarize_trace."""
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    trace.parent.mkdir(parents=True, exist_ok=True)
    tmp = trace.with_name(trace.name + ".tmp")
    prof.export_chrome_trace(str(tmp))
    tmp.replace(trace)
    events = json.loads(trace.read_text()).get("traceEvents", [])
    return {**summarize_trace(events, steps), "trace": str(trace)}


def _peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**30
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / (2**30 if sys.platform == "darwin" else 2**20)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


@dataclass
class Plan:
    """One benchmark's sizes: the options, or their defaults for this device."""

    batch: int
    warmup: int
    windows: int
    steps: int
    store: int


def plan(cfg: BenchConfig, device: torch.device, world: int) -> Plan:
    gpu = device.type != "cpu"
    # The stored side of the data the noise stands in for: CIFAR-like arrays up to 64 px, ImageNet-like folders
    # above (decoded at 8/7 of the crop); the rule every reader of a run's images uses (train/data.py).
    like = "cifar10:" if cfg.image_size <= 64 else "folder:"
    p = Plan(batch=cfg.batch_size if cfg.batch_size is not None else (512 if gpu else 8),
             warmup=cfg.warmup if cfg.warmup is not None else (10 if gpu else 1),
             windows=cfg.windows if cfg.windows is not None else (5 if gpu else 3),
             steps=cfg.window_steps if cfg.window_steps is not None else (20 if gpu else 1),
             store=store_size_for(like, cfg.image_size, cfg.store_size))
    if p.batch % world:
        raise PipelineError(f"batch size {p.batch} does not split over {world} processes: use a multiple of {world}")
    if cfg.profile and device.type != "cuda":
        raise PipelineError(f"--profile records CUDA kernels: it needs --device cuda (this is {device.type})")
    return p


def pretrain_config(cfg: BenchConfig, p: Plan) -> PretrainConfig:
    """The pretraining config of the step to time, resolved and checked as `pipeline pretrain` would."""
    pcfg = resolve(PretrainConfig(method=cfg.method, backbone=cfg.backbone, image_size=cfg.image_size,
                                  batch_size=p.batch, store_size=p.store, device=cfg.device, precision=cfg.precision,
                                  augment=cfg.augment, num_workers=cfg.num_workers, channels_last=cfg.channels_last,
                                  compile=cfg.compile, cuda_graphs=cfg.cuda_graphs, seed=cfg.seed, epochs=1,
                                  warmup_epochs=0.0))
    validate(pcfg)
    return pcfg


def run(cfg: BenchConfig, say=print) -> dict:
    """The step alone on ready views (ceiling), then fed by the real batch source (end to end)."""
    device = distributed.setup(select_device(cfg.device))
    finished = False
    try:
        result = measure(cfg, device)
        finished = True
    finally:
        distributed.cleanup(wait=finished)
    return result


def measure(cfg: BenchConfig, device: torch.device) -> dict:
    world, rank = distributed.world_size(), distributed.rank()
    p = plan(cfg, device, world)
    pcfg = pretrain_config(cfg, p)
    torch.manual_seed(cfg.seed)
    if cfg.preprocess:  # per-image preprocessing alone (train/preprocess.py), no training
        return time_per_image(cfg.preprocess, cfg.method, cfg.image_size, p.store, p.batch * p.steps, p.windows,
                              p.warmup, cfg.seed)
    mode = augment_mode(cfg.augment, device)
    settle = (SETTLE_WINDOWS + 1) * p.steps if device.type != "cpu" and p.warmup else 0
    # e2e warm-up, settling, windows, the profiled window, then the augment-only window
    batches = p.warmup + settle + (p.windows + 1 + bool(cfg.profile)) * p.steps
    # A pool of distinct noise images tiled to one long epoch: generating every image would take longer than the run.
    pool = torch.randint(0, 256, (min(p.batch, 1024), 3, p.store, p.store), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(cfg.seed))
    images = pool.repeat(-(-p.batch * batches // pool.shape[0]), 1, 1, 1)[: p.batch * batches]
    if mode == "device":
        images = keep_on_device(images, device)
    started = time.perf_counter()
    # the schedule spans both phases; the step timed is a long run's (compiled where that repays: use_compile)
    training, _ = build_training(pcfg, device, steps_per_epoch=2 * batches + 1, steady=True)
    training.model.train()
    state = {"step": 0, "last": None}

    def fed(views) -> None:
        loss = train_step(training, views, state["step"])
        if state["last"] is not None:
            float(state["last"])  # the loop reads each loss one step late; so does the benchmark
        state["step"] += 1
        state["last"] = loss

    # ceiling: the method's views ready on the device, the same step
    fmt = torch.channels_last if training.channels_last else torch.contiguous_format
    ready = [torch.randn(p.batch // world, 3, side, side, device=device).contiguous(memory_format=fmt)
             for side in augment.view_sizes(cfg.method, cfg.image_size)]

    def ceiling_step() -> float:
        fed(ready)
        return 0.0

    ceiling_step()  # the first step, untimed: what it costs on top of building is torch.compile's compiling
    _sync(device)
    setup_s = time.perf_counter() - started
    ceiling = phase(cfg, p, device, ceiling_step, "ceiling", rank, world)

    # end to end: the real batch source
    source = iter(view_batches(mode, images, augment.recipes_for(cfg.method, cfg.image_size), cfg.image_size, p.batch,
                               cfg.seed, 0, 0, device, default_workers(cfg.num_workers), (rank, world),
                               training.channels_last, graphs=training.cuda_graphs))

    def e2e_step() -> float:
        t0 = time.perf_counter()
        views = next(source)
        waited = time.perf_counter() - t0
        fed(views)
        return waited

    e2e = phase(cfg, p, device, e2e_step, "e2e", rank, world)

    def augment_only() -> float:
        next(source)
        return 0.0

    aug = _windows(augment_only, 0, 1, p.steps, device)
    source.close()  # stops DataLoader workers, if any
    return {**result_of(cfg, p, device, world, mode, training, ceiling, e2e, aug), "setup_s": round(setup_s, 2)}


def phase(cfg: BenchConfig, p: Plan, device: torch.device, step, name: str, rank: int, world: int) -> dict:
    """One phase's timed windows and peak memory (and its profile with --profile)."""
    _reset_peak(device)
    windows = _windows(step, p.warmup, p.windows, p.steps, device)
    out = {"windows": windows, "peak": _peak_memory_gib(device)}
    if cfg.profile:
        tag = f"rank{rank}" if world > 1 else "trace"
        out["profile"] = profile_phase(step, p.steps, device, Path(cfg.profile) / f"{name}-{tag}.json")
    return out


def result_of(cfg: BenchConfig, p: Plan, device: torch.device, world: int, mode: str, training, ceiling: dict,
              e2e: dict, aug: list) -> dict:
    def img_s(ws):
        return [p.batch * p.steps / t for t, _ in ws]

    e2e_rate, ceiling_rate = statistics.median(img_s(e2e["windows"])), statistics.median(img_s(ceiling["windows"]))
    result = {
        "method": cfg.method, "backbone": cfg.backbone, "image_size": cfg.image_size, "store_size": p.store,
        "batch_size": p.batch, "per_process_batch": p.batch // world, "processes": world, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "augment": mode, "num_workers": default_workers(cfg.num_workers) if mode == "cpu" else 0,
        "channels_last": training.channels_last, "compile": training.compiled, "cuda_graphs": training.cuda_graphs,
        "captured": training.captured,
        "precision": ("fp64" if training.precision.param_dtype == torch.float64 else "fp32") if training.precision.backbone_dtype is None else str(training.precision.backbone_dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "e2e_img_s": round(e2e_rate, 2), "ceiling_img_s": round(ceiling_rate, 2),
        "ratio": round(e2e_rate / ceiling_rate, 4),
        "data_wait_pct": round(100 * statistics.median(w / t for t, w in e2e["windows"]), 2),
        "augment_ms_per_step": round(1000 * aug[0][0] / p.steps, 3),
        "peak_mem_gib": round(e2e["peak"], 3), "ceiling_peak_mem_gib": round(ceiling["peak"], 3),
        "windows": {"e2e_img_s": [round(v, 2) for v in img_s(e2e["windows"])],
                    "ceiling_img_s": [round(v, 2) for v in img_s(ceiling["windows"])]},
        "warmup": p.warmup, "window_steps": p.steps,
    }
    profiled = {name: ph["profile"] for name, ph in (("ceiling", ceiling), ("e2e", e2e)) if "profile" in ph}
    if profiled:
        result["profile"] = profiled
    return result


def format_table(r: dict) -> str:
    if "ms_per_image" in r:  # a --preprocess timing
        return format_timing(r)
    head = (f"{r['method']}/{r['backbone']} {r['image_size']} px, batch {r['batch_size']} "
            f"({r['processes']} x {r['per_process_batch']}), {r['device_name']}, augment {r['augment']}, "
            f"channels_last {r['channels_last']}, CUDA graphs {r.get('captured') or r.get('cuda_graphs', False)}, "
            f"compiled {r.get('compile', False)}, {r['precision']}")
    rows = [("end-to-end", f"{r['e2e_img_s']:,.0f} img/s"), ("model-step ceiling", f"{r['ceiling_img_s']:,.0f} img/s"),
            ("ratio", f"{r['ratio']:.3f}"), ("data wait", f"{r['data_wait_pct']:.1f} %"),
            ("augment alone", f"{r['augment_ms_per_step']:.2f} ms/step"), ("peak memory", f"{r['peak_mem_gib']:.2f} GiB")]
    for phase, p in r.get("profile", {}).items():
        rows.append((f"profile {phase}", f"{p['wall_ms_per_step']:.2f} ms/step, GPU busy {p['gpu_busy_pct']:.0f} %, "
                                         f"host waiting {p['host_wait_ms_per_step']:.2f} ms/step ({p['trace']})"))
        if p.get("kernel_families_ms_per_step"):
            rows.append(("", "GPU ms/step: " + ", ".join(f"{f} {t:.2f}" for f, t in
                                                         p["kernel_families_ms_per_step"].items())))
    return "\n".join([head] + [f"  {k:<20s}{v}" for k, v in rows])


# ---------------------------------------------------------------- `pipeline bench --preprocess`: the per-image ops alone

def _median_ms(fn, items: list, windows: int, warmup: int) -> float:
    """Median over windows of the mean ms per call of fn(item) over all items; warm-up calls (a Core ML model's
    first prediction compiles and loads it) untimed."""
    for item in items[:warmup]:
        fn(item)
    per = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for item in items:
            fn(item)
        per.append(1000 * (time.perf_counter() - t0) / len(items))
    return statistics.median(per)


def time_per_image(choice: str, method: str, size: int, store_size: int, images: int, windows: int, warmup: int,
                   seed: int, cache_root=None) -> dict:
    """ms per image of each op of preprocessing backend `choice` (train/preprocess.py) on random images and
    parameters (SimCLR's widest jitter), and of the views a training item costs (ViewDataset with
    `method`'s recipes, crop and hue included)."""
    name, why = preprocess.resolve_backend(choice)
    backend = preprocess.make_backend(name, size, cache_root)
    g = torch.Generator().manual_seed(seed)
    views = torch.rand(images, 3, size, size, generator=g)
    if backend.pixels == "uint8":  # the ops of a uint8 backend take PIL images
        views = [Image.fromarray((v * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()) for v in views]
    pixels = torch.randint(0, 256, (images, 3, store_size, store_size), dtype=torch.uint8, generator=g)
    p = augment.sample_params(images, METHODS["simclr"].views[0], store_size, np.random.default_rng(seed))
    k = augment.blur_kernel_size(size)
    jitter = lambda i: backend.color_jitter(  # noqa: E731
        views[i], p["jitter_order"][i].tolist(), float(p["brightness"][i]), float(p["contrast"][i]),
        float(p["saturation"][i]), float(p["hue"][i]))
    dataset = augment.ViewDataset(pixels, augment.recipes_for(method, size), size, seed, 0, backend)
    ops = {
        "color_jitter": jitter,
        "grayscale": lambda i: backend.grayscale(views[i]),
        "gaussian_blur": lambda i: backend.gaussian_blur(views[i], k, float(p["sigma"][i])),
        "two_views": lambda i: dataset[i],
    }
    idx = list(range(images))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker (torch gives each one thread): what __getitem__ gets
    try:
        ms = {op: round(_median_ms(fn, idx, windows, max(1, warmup)), 4) for op, fn in ops.items()}
    finally:
        torch.set_num_threads(threads)
    return {"preprocess": name, "reason": why, "method": method, "image_size": size, "store_size": store_size,
            "blur_kernel": k, "images_per_window": images, "windows": windows, "ms_per_image": ms,
            "platform": f"{platform.system()} {platform.machine()}", "torch_threads": 1}


def format_timing(r: dict) -> str:
    head = (f"preprocess {r['preprocess']} ({r['reason']}), {r['image_size']} px views from {r['store_size']} px, "
            f"{r['platform']}, one torch thread (as a DataLoader worker), median of {r['windows']} windows x "
            f"{r['images_per_window']} images")
    rows = [f"  {op:<20s}{v:8.3f} ms/image" for op, v in r["ms_per_image"].items()]
    return "\n".join([head, *rows])
