"""The training step and what it stands on, shared by `pipeline pretrain` and `pipeline bench` (so the benchmark
times the very step training runs): the model on its device (memory format, SyncBN, compile, CUDA graphs, gradient
averaging over processes), optimizer, schedule and scaler; one optimisation step; where each step's batches come
from; the RNG state a checkpoint keeps."""

from __future__ import annotations

import contextlib
import copy
import os
import random
import signal
import threading
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from core.device import precision_for
from core.errors import PipelineError
from train import augment, distributed
from train.backbones import BACKBONES
from train.configs import PretrainConfig
from train.device_augment import device_view_batches
from train.methods import METHODS
from train.optim import build_optimizer, fused_for, param_groups, warmup_cosine
from train.preprocess import PIL_PREPROCESS
from train.runspec import build_model, peak_lr


def default_workers(requested: int) -> int:
    if requested >= 0:
        return requested
    return max(0, min(8, (os.cpu_count() or 1) - 1))


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def use_cuda_graphs(choice: str, device: torch.device, world: int, sync_bn: bool = False) -> bool:
    """CUDA graphs need CUDA; SyncBatchNorm's collectives (it runs under DDP) would sit inside the captured forward
    and backward, so that case stays eager. Several processes otherwise graph the backbone (one process captures
    the whole loss where it can: LossGraph) and average gradients after it (distributed.flat_gradients). A
    compiled backbone is graphed too: its compiled kernels are captured (ResNet-18 at 32 px: 38,210 img/s end to
    end compiled in the graphs, 27,086 compiled alone, docs/benchmarks.md)."""
    possible = device.type == "cuda" and not (world > 1 and sync_bn)
    if choice == "on" and not possible:
        raise PipelineError("--cuda-graphs on needs CUDA without --sync-bn on several processes (this run: device "
                            f"{device.type}, {world} process(es), sync_bn {sync_bn}); use auto or off")
    return possible and choice in ("on", "auto")


def use_compile(choice: bool | None, backbone: str, method: str, graphs: bool, world: int = 1,
                steps: int | None = None) -> bool:
    """--compile / --no-compile as typed; unset, the default (compile_default)."""
    return choice if choice is not None else compile_default(backbone, method, graphs, world, steps)[0]


def compile_default(backbone: str, method: str, graphs: bool, world: int = 1,
                    steps: int | None = None) -> tuple[bool, str]:
    """With --compile unset: (compiled, why not), on where it was measured faster: one process, inside the CUDA
    graphs (compiled alone ran slower than eager in the graphs, 27,086 against 31,680 img/s), on a backbone whose
    row says from how many steps it repays its compiling (train/backbones.Backbone.compile_repays), for a method
    whose compiled runs on it reached eager's kNN (its compile_methods), in a run of at least that many `steps`
    (None: a run long enough, as `pipeline bench` times). Elsewhere not measured: eager. `why not` names what kept
    a backbone that compiles faster here eager (the method, or the run's length), for the start line; else ""."""
    row = BACKBONES[backbone]
    if not (graphs and world == 1 and row.compile_repays is not None):
        return False, ""
    if method not in row.compile_methods:
        return False, f"{METHODS[method].title} compiled on {row.title} has not been shown to reach eager's kNN"
    if steps is not None and steps < row.compile_repays:
        return False, f"it repays from {row.compile_repays:,} steps, this run has {steps:,}"
    return True, ""


def graph_backbone(backbone: torch.nn.Module, batch: int, image_size: int, channels_last: bool, precision) -> None:
    """Capture the backbone's training forward and backward for `batch` images (torch.cuda.make_graphed_callables,
    in place: the module keeps its parameters and state_dict, eval mode still runs the plain forward). Every
    step then costs two graph launches instead of the layer-by-layer launches from Python. The capture's warm-up
    passes move the BatchNorm statistics; they are put back, so training starts exactly where it would have.

    `batch` is every view at the run's size, concatenated: the one backbone call of a two-view method, and the
    global views' call of a multi-crop one. A call of any other shape (a multi-crop method's smaller local views)
    runs the plain forward, eagerly (by_shape), rather than in a graph of its own: make_graphed_callables graphs a
    module once, in place, so a graph per size would take a copy of the backbone per size sharing its parameters
    and a capture (with its own static activations) per size, for views that cost a fraction of the global ones.
    The graphed call may run once per step: a second replay overwrites the first's outputs before its backward."""
    amp = (torch.autocast("cuda", dtype=precision.backbone_dtype, cache_enabled=False)  # capture needs no cache
           if precision.backbone_dtype is not None else contextlib.nullcontext())
    eager = backbone.forward  # the plain forward, before the capture replaces it
    (sample,) = capture(backbone, 1, batch, image_size, channels_last, amp)
    backbone.forward = by_shape(backbone.forward, eager, sample.shape)


@contextlib.contextmanager
def capturing(module: torch.nn.Module, inputs: int, batch: int, image_size: int, channels_last: bool):
    """What every capture here does around its warm-up passes and the capture itself: `inputs` sample batches of
    `batch` images in the run's memory format (yielded), from a generator of their own (the global CUDA generator's
    state is the run's); the warm-up's BatchNorm statistics (every buffer) put back afterwards, in place (the graphs
    hold these addresses), so training starts exactly where it would have.

    A capture's warm-up runs on a side stream, and autograd remembers that stream for each parameter's gradient
    accumulator: a later backward on another stream adds a GPU-side event wait per parameter (no host wait) and
    torch warns once, already during the capture. Expected, so not shown: the switch torch offers where it has one,
    and a filter for exactly that message (its first sentence), both set before the capture."""
    device = next(module.parameters()).device
    saved = [b.detach().clone() for b in module.buffers()]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    own = torch.Generator(device).manual_seed(0)
    if hasattr(torch.autograd.graph, "set_warn_on_accumulate_grad_stream_mismatch"):
        torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)
    warnings.filterwarnings("ignore", message=r"The AccumulateGrad node's stream does not match the stream of the "
                                              r"node that produced the incoming gradient", category=UserWarning)
    yield tuple(torch.randn(batch, 3, image_size, image_size, device=device, generator=own)
                .contiguous(memory_format=fmt) for _ in range(inputs))
    with torch.no_grad():
        for b, s in zip(module.buffers(), saved):
            b.copy_(s)


def capture(module: torch.nn.Module, inputs: int, batch: int, image_size: int, channels_last: bool,
            amp=contextlib.nullcontext()) -> tuple[torch.Tensor, ...]:
    """make_graphed_callables(module, samples), in place, for `inputs` sample batches of `batch` images (returned):
    what graph_backbone does, inside `capturing` (the samples, the statistics put back)."""
    with capturing(module, inputs, batch, image_size, channels_last) as samples, amp:
        torch.cuda.make_graphed_callables(module, samples)
    return samples


def loss_graphable(model: torch.nn.Module, sizes: tuple[int, ...], world: int, scaled: bool = False) -> bool:
    """Whether LossGraph can capture the method's whole loss rather than graph_backbone its backbone alone: one
    process (with several, the loss gathers every rank's embeddings: a collective inside the capture), every view at
    one size (a multi-crop method's local views would need a capture of their own), a loss that is not scaled (an
    fp16 run's: its scale must reach autograd's backward, which the captured backward leaves out) and a method whose
    forward never reads a device value on the host (its `loss_capturable`; MoCo v3's key queue counts its keys that
    way while it fills). A method that does not say is not captured whole."""
    return world == 1 and len(set(sizes)) == 1 and not scaled and getattr(model, "loss_capturable", False)


class LossGraph:
    """The method's whole loss, forward and backward, captured as one CUDA graph for `views` batches of `batch`
    images each: every view through the backbone, the heads, a momentum branch and the loss, and the backward
    writing each parameter's gradient. With the backbone alone in a graph, a small-image step of a mobile net is
    bound by the host's launches outside it: the heads, the loss, their backward and a momentum branch run layer by
    layer from Python (MobileNetV3-Small at 32 px: 14.7 ms of host time a step for 6.1 ms of GPU work,
    docs/benchmarks.md). Called, it copies the views into the graph's inputs and replays it: afterwards every
    trained parameter's .grad holds this step's gradient (the tensors the capture allocated, rewritten by each
    replay: nothing may set them to None), and the optimizer's update and the momentum update follow outside, since
    the learning rate and the momentum change every step as Python numbers, which a graph would hold fixed.

    Captured by hand rather than through torch.cuda.make_graphed_callables: that one hands the backward's
    gradients to autograd, which then accumulates each parameter's into its .grad outside the graph, a copy and a
    stream wait per parameter launched from Python every step: the costliest part of a MobileNetV3-Small step's
    host time at 32 px, and about 5 % of its speed (docs/benchmarks.md, "The whole loss captured by hand"). The model
    itself is not changed: its forward stays the plain one (evaluation, a batch of another shape). The BatchNorm
    statistics and the momentum branch the warm-up passes move are put back, so training starts exactly where it
    would have."""

    WARMUP = 3  # eager passes on a side stream before the capture (cuDNN's autotuning, lazy state), as torch's docs do

    def __init__(self, model: torch.nn.Module, views: int, batch: int, image_size: int, channels_last: bool,
                 precision):
        device = next(model.parameters()).device
        with capturing(model, views, batch, image_size, channels_last) as samples:
            self.inputs = list(samples)
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(self.WARMUP):
                    model.zero_grad(set_to_none=True)
                    model(self.inputs, precision).backward()
            torch.cuda.current_stream(device).wait_stream(side)
            model.zero_grad(set_to_none=True)  # the capture's backward allocates each .grad in the graph's memory
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                loss = model(self.inputs, precision)
                loss.backward()
        self.loss = loss.detach()

    def __call__(self, views: list[torch.Tensor]) -> torch.Tensor:
        """Forward and backward of these views (the captured shapes); the loss as a tensor of its own (the graph
        rewrites its buffer at every replay, and the training loop reads a step's loss after the next has run)."""
        for static, v in zip(self.inputs, views):
            static.copy_(v)
        self.graph.replay()
        return self.loss.clone()


def by_shape(graphed, eager, shape: torch.Size):
    """A forward that replays the graph for inputs of the captured shape and runs `eager` for any other (a graph
    copies its input into a buffer of that one shape). Read on the host: no wait for the GPU."""

    def forward(x: torch.Tensor, *args, **kwargs):
        return (graphed if x.shape == shape else eager)(x, *args, **kwargs)

    return forward


@contextlib.contextmanager
def float64_init():
    """Modules built inside start from float64 weights that come out the same under every CPU kernel path.
    normal_ in float64 already does (in float32 the AVX2 build draws with another algorithm). uniform_(a, b)
    computes u * (b - a) + a in one kernel, which the AVX2 and AVX-512 builds fuse into an FMA and the plain build
    rounds twice (1 ulp apart for every other weight, and a few steps amplify it): here u is drawn on [0, 1), exact
    either way, and scaled by two separately rounded ops, each the same everywhere."""
    native, default, own = torch.Tensor.uniform_, torch.get_default_dtype(), vars(torch.Tensor).get("uniform_")

    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        return native(self, 0.0, 1.0, generator=generator).mul_(b - a).add_(a)

    torch.Tensor.uniform_ = uniform_
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(default)
        if own is None:
            del torch.Tensor.uniform_  # the C method shows through again
        else:
            torch.Tensor.uniform_ = own


@dataclass
class Training:
    """What one optimisation step needs. `run` and stages/bench.py both use it, so the benchmark times the very
    step that training runs."""

    model: torch.nn.Module  # the method module: state_dict, after_step
    forward: torch.nn.Module  # the model, or its DistributedDataParallel wrapper (several processes with SyncBN)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    scaler: torch.amp.GradScaler
    precision: object
    total_steps: int
    channels_last: bool
    captured: str = ""  # what the CUDA graphs hold: "whole loss" (LossGraph), "backbone" (graph_backbone) or none
    compiled: bool = False  # the backbone's forward through torch.compile (use_compile)
    grads: torch.Tensor | None = None  # several processes without SyncBN: the flat gradient buffer averaged each step
    loss_graph: LossGraph | None = None  # the whole loss captured: forward and backward in one replay

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.captured)


def build_training(cfg: PretrainConfig, device: torch.device, steps_per_epoch: int,
                   steady: bool = False) -> tuple[Training, int]:
    """Model (memory format, SyncBN, compile, CUDA graphs, gradient averaging), optimizer, schedule, scaler for this
    process; (training, feat_dim). steady: the step of a run long enough to repay compiling (`pipeline bench`)."""
    precision = precision_for(device, cfg.precision)  # first: fp64 off the CPU is refused before any work
    with float64_init() if precision.param_dtype == torch.float64 else contextlib.nullcontext():
        model, feat_dim = build_model(cfg)
    model.to(device, precision.param_dtype)  # floating tensors only: BN's step counts and MoCo's ring stay integers
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
    graphs = use_cuda_graphs(cfg.cuda_graphs, device, world, cfg.sync_bn)
    total_steps = steps_per_epoch * cfg.epochs
    # the run's length by its schedule, not by --max-steps: a run cut short and resumed must compile alike
    compiled = use_compile(cfg.compile, cfg.backbone, cfg.method, graphs, world, None if steady else total_steps)
    if compiled:  # the forward alone, so the graphs below capture the compiled kernels; state_dict keys stay
        model.backbone.forward = torch.compile(model.backbone.forward)
    captured, loss_graph = "", None
    if graphs:
        sizes = augment.view_sizes(cfg.method, cfg.image_size)
        if loss_graphable(model, sizes, world, precision.needs_grad_scaler):  # the whole loss, one launch a step
            loss_graph = LossGraph(model, len(sizes), cfg.batch_size, cfg.image_size, channels_last, precision)
            captured = "whole loss"
        else:  # the views at the run's size of this process's images go through the backbone as one batch
            full = sizes.count(cfg.image_size)
            graph_backbone(model.backbone, full * (cfg.batch_size // world), cfg.image_size, channels_last, precision)
            captured = "backbone"
    optimizer = build_optimizer(cfg.optimizer, param_groups(model, cfg.pred_lr), peak_lr(cfg), cfg.weight_decay,
                                cfg.lars_eta, fused_for(device))
    scheduler = warmup_cosine(optimizer, round(cfg.warmup_epochs * steps_per_epoch), total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    forward, grads = model, None
    if world > 1:
        distributed.broadcast_from_main(model)
        if cfg.sync_bn:  # SyncBatchNorm is supported under DDP only (torch's documentation)
            forward = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
        else:  # one all-reduce of one flat buffer after the (graphed) backward: see distributed.flat_gradients
            grads = distributed.flat_gradients(model.parameters())
    return Training(model, forward, optimizer, scheduler, scaler, precision, total_steps, channels_last, captured,
                    compiled, grads, loss_graph), feat_dim


def compile_note(t: Training, cfg: PretrainConfig, world: int) -> str:
    """The start line's word on compiling: True or False, and where --compile was unset and the method or the run's
    length kept the step eager on a backbone that compiles faster, why, so that the user knows to ask."""
    if t.compiled or cfg.compile is not None:
        return str(t.compiled)
    why = compile_default(cfg.backbone, cfg.method, t.cuda_graphs, world, t.total_steps)[1]
    return f"False ({why}: --compile to compile anyway)" if why else "False"


def fp32_backbone(t: Training) -> torch.nn.Module:
    """The backbone as evaluation takes it (train/features.py computes in fp32 only): itself, or a float32 copy of
    an fp64 run's, so the kNN monitor neither refuses an fp64 run nor changes the weights it trains."""
    backbone = t.model.backbone
    return backbone if t.precision.param_dtype == torch.float32 else copy.deepcopy(backbone).float()


def train_step(t: Training, views: list[torch.Tensor], step: int) -> torch.Tensor:
    """One optimisation step on one batch per view, as view_batches yields them (step = steps done before it).
    Returns the loss averaged over processes, detached and still on the device: reading it waits for the GPU, so
    the caller chooses when (the loop reads it a step late)."""
    dtype = t.precision.param_dtype  # the views come normalised in float32; an fp64 run takes them in float64
    views = [v.to(dtype) for v in views]
    if t.loss_graph is not None:  # forward and backward in one replay, which rewrites every .grad (kept, never None)
        loss = t.loss_graph(views)
    else:
        loss = t.forward(views, t.precision)
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


class StopRequest:
    """SIGINT (Ctrl-C) and SIGTERM while training steps run: noted, never raised, so the step under way finishes
    and the loop stops between two steps, where a checkpoint is whole. Signals after the first are ignored until
    the block ends: a second Ctrl-C cannot cut the checkpoint write short (torchrun also passes each signal on to
    its workers, a second one). DataLoader workers are forked inside the block and inherit this handler, so a
    Ctrl-C that reaches the whole process group does not kill them under the batch being loaded."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    # Set by a face whose process exits once training returns (`pipeline pretrain` from the command line, each
    # torchrun worker included): a stopped run then keeps ignoring signals until the process has exited, since one
    # more Ctrl-C after the checkpoint (an impatient user's; torchrun's agent passes each signal on to its workers,
    # late on a loaded machine) would raise KeyboardInterrupt into the exit: a traceback in place of the one line.
    # Elsewhere (a library call, click's CliRunner, a test) the caller's handlers come back.
    process_exits_after = False

    def __init__(self):
        self.received = 0  # the first signal's number
        self._previous: dict = {}

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():  # Python sets handlers from the main thread only
            self._previous = {s: signal.signal(s, self._note) for s in self.SIGNALS}
        return self

    def _note(self, signum, frame) -> None:
        self.received = self.received or signum

    def __exit__(self, *exc) -> None:
        keep_ignoring = self.received and self.process_exits_after
        for s, handler in self._previous.items():
            signal.signal(s, signal.SIG_IGN if keep_ignoring else handler)

    def agreed(self) -> int:
        """The signal that stops training now, or 0: the same answer on every rank (one tiny all-reduce per step),
        so all stop after the same step and none is left waiting in a collective."""
        return distributed.any_rank(self.received)


def augment_mode(requested: str, device: torch.device) -> str:
    """auto: on the training device when it is an accelerator (CPU workers cannot keep a GPU fed:
    docs/benchmarks.md), in CPU workers otherwise (the reference path, and on a CPU it is the same silicon anyway)."""
    if requested == "auto":
        return "device" if device.type in ("cuda", "mps") else "cpu"
    return requested


def view_batches(mode: str, images: torch.Tensor, recipes, out_size: int, batch_size: int, seed: int, epoch: int,
                 start_batch: int, device: torch.device, num_workers: int, shard: tuple[int, int] = (0, 1),
                 channels_last: bool = False, preprocess=PIL_PREPROCESS, graphs: bool = False):
    """The one place training batches come from: per step a list of batches, one per view recipe at its side, by
    the CPU path or the device path (train/device_augment.py); mode is `augment_mode`'s answer. `preprocess`
    (train/preprocess.py) serves the CPU path only; `graphs` (the run's CUDA-graph choice) the device path on CUDA."""
    if mode == "device":
        return device_view_batches(images, recipes, out_size, batch_size, seed, epoch, start_batch, device,
                                   shard, channels_last, graphs)
    batches = augment.cpu_view_batches(images, recipes, out_size, batch_size, seed, epoch, start_batch, device,
                                       num_workers, shard, channels_last, preprocess)
    return _workers_deaf_to_stops(batches) if num_workers > 0 else batches


def _workers_deaf_to_stops(batches):
    """The DataLoader's workers are forked at an epoch's first batch; forked while SIGINT and SIGTERM are blocked,
    they keep the block, so a signal sent to the whole process group (Ctrl-C in a terminal, the job service's
    SIGTERM) stops the training process alone (StopRequest) and the workers serve it until it has stopped. A
    worker killed under a batch would make torch raise inside the training process, anywhere in a step. The
    training process receives what was held back as soon as the first batch is there."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no signal masks
        yield from batches
        return
    held = signal.pthread_sigmask(signal.SIG_BLOCK, StopRequest.SIGNALS)
    try:
        first = next(batches, None)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    if first is not None:
        yield first
        yield from batches
