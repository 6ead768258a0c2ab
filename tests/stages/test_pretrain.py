"""Pretraining: pinned losses of a seeded tiny run, exact resume, atomic checkpoints, NaN stop."""

import json
from pathlib import Path

import pytest
import torch

from core import rundir
from core.config import load_config
from core.errors import PipelineError
from train import training
from train.configs import PretrainConfig
from train.runspec import resolve
from tests.tiny_run import pretrain_tiny

# First three logged losses of the tiny seeded CPU run for each method (conftest.TINY, 3 steps), computed in
# float64 (PIN_RUN: `--precision fp64`). A change here is a behaviour change of the loss, the augmentation, the init
# or the data order: look before updating. (lightly's MoCo loss once sat at a constant for three releases; pins make
# that visible.)
PIN_RUN = {"max_steps": 3, "precision": "fp64"}
PINNED = {
    "simclr": [2.734227470999197, 2.6619056482792565, 2.605156184943651],
    "byol": [3.709973073515378, 3.538026841618085, 4.152321788586381],
    "mocov3": [8.411083649319032, 12.657913836065138, 12.818520838284531],  # rises as the queue fills with negatives
}
# The pins are of the papers' recipe (`--recipe paper`), whose values stay put; test_small_recipe_pins pins the
# small-data recipe that `auto` gives such a tiny run.
PIN_EXTRA = {"simclr": {"recipe": "paper"}, "byol": {"recipe": "paper"}, "mocov3": {"recipe": "paper", "queue_size": 16}}
# The same run differs between CPUs, and hardly because of threads: ATen builds its kernels once per instruction set
# (ATEN_CPU_CAPABILITY: default, avx2, avx512), and they sum in different orders, fuse u * (b - a) + a into one FMA
# or not, and draw normal_ in float32 with another algorithm on AVX2. In float32 three steps amplify that to a 3.3e-2
# spread between those paths (MoCo v3, small recipe; 3.4e-3 BYOL small, 2e-6 or less for the paper recipe's runs).
# In float64, with the weights drawn alike everywhere (train/training.float64_init), the largest divergence from
# these pins that `benchmarks/pin_divergence.py` measured (AMD EPYC, AVX-512: default, avx2, avx512 at 1 thread, and
# avx512 at 2 threads) is 2.0e-13 relative (MoCo v3, small recipe, under default; 2.1e-15 or less for the other
# five). The tolerance is 5000x that, and the smallest change that must fail, 0.1 % of the temperature or of the
# jitter brightness, moves the pins by 4.3e-5 or more (test_pins_catch_a_small_regression keeps that true).
PIN_RTOL = 1e-9


def pinned_losses(out: Path, method: str, recipe: str = "paper", **over) -> list[float]:
    """The pinned run of `method` (recipe paper: PINNED, small: PINNED_SMALL) into `out`, `over` on top; its losses."""
    extra = PIN_EXTRA[method] if recipe == "paper" else SMALL_EXTRA[method]
    pretrain_tiny(out, **{"method": method, **PIN_RUN, **extra, **over})
    return _losses(out)


def _run(tmp_path, overrides, resume=False, name="run"):
    out = tmp_path / name
    pretrain_tiny(out, resume, **overrides)
    return out


def _losses(out):
    return [json.loads(line)["loss"] for line in (out / rundir.METRICS).read_text().splitlines()]


@pytest.mark.parametrize("method", ["simclr", "byol", "mocov3"])
def test_pinned_losses(tmp_path, method):
    losses = pinned_losses(tmp_path / "run", method)
    assert len(losses) == 3
    assert losses == pytest.approx(PINNED[method], rel=PIN_RTOL), losses


# The same tiny run with no --recipe: `auto` gives it the small-data recipe (train/recipes.py).
PINNED_SMALL = {
    "simclr": [2.526788433441193, 3.0739153709937104, 2.7421867197050482],
    # BYOL: BN on the projector's output, predictor at 10x, EMA from 0.9, crops from 25 %
    "byol": [4.006822640430762, 3.988835307802824, 3.7049141014971783],
    "mocov3": [2.365567937885209, 2.7902831504194343, 3.2827575144241257],  # EMA from 0.9, crops from 25 %
}
SMALL_EXTRA = {"simclr": {}, "byol": {}, "mocov3": {"queue_size": 16}}
PINS = {"paper": PINNED, "small": PINNED_SMALL}  # every pinned run: (recipe, method)


@pytest.mark.parametrize("method", ["simclr", "byol", "mocov3"])
def test_small_recipe_pins(tmp_path, method):
    losses = pinned_losses(tmp_path / "run", method, "small")
    assert load_config(PretrainConfig, tmp_path / "run" / rundir.CONFIG).recipe == "small"
    assert losses == pytest.approx(PINNED_SMALL[method], rel=PIN_RTOL), losses


@pytest.mark.parametrize("method,change", [("simclr", "temperature"), ("mocov3", "temperature"),
                                           ("byol", "brightness"), ("mocov3", "brightness")])
def test_pins_catch_a_small_regression(tmp_path, monkeypatch, method, change):
    """The tolerance leaves room for kernel paths, not for behaviour: 0.1 % on the loss's temperature or on one
    augmentation parameter must fail the pin (1 % moves them ten times as far: benchmarks/pin_divergence.py). The
    first step's loss alone fails it (by 4.3e-5 relative or more), so one step is run, not three."""
    import dataclasses
    import importlib

    from train import recipes

    over = {}
    if change == "temperature":
        over["temperature"] = recipes.values("paper", method)["temperature"] * 1.001
    else:  # the method's file with another SPEC, as an edit of it would leave it
        module = importlib.import_module(f"train.methods.{method}")
        views = tuple(dataclasses.replace(v, brightness=v.brightness * 1.001) for v in module.SPEC.views)
        monkeypatch.setattr(module, "SPEC", dataclasses.replace(module.SPEC, views=views))
    losses = pinned_losses(tmp_path / "run", method, max_steps=1, **over)
    assert len(losses) == 1 and losses[0] != pytest.approx(PINNED[method][0], rel=PIN_RTOL), losses


def test_an_fp64_run_resumes_to_its_pins(tmp_path):
    """Stopped after 2 steps and resumed, the fp64 run ends on the pins: its checkpoint holds float64 weights, the
    momentum network's and MoCo's queue among them."""
    out = tmp_path / "run"
    pinned_losses(out, "mocov3", max_steps=2)
    _run(tmp_path, {"max_steps": 3}, resume=True)
    assert _losses(out) == pytest.approx(PINNED["mocov3"], rel=PIN_RTOL)
    state = torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)["model"]
    assert {v.dtype for v in state.values() if v.is_floating_point()} == {torch.float64}
    assert state["queue.buffer"].dtype == torch.float64 and state["momentum_backbone.conv1.weight"].dtype == torch.float64


def test_the_knn_monitor_of_an_fp64_run_reads_a_float32_copy(tmp_path):
    """Evaluation is fp32 only (train/features.py refuses other weights): the monitor gets a float32 copy, and the
    weights that train stay float64."""
    monitored = tmp_path / "monitored"
    pretrain_tiny(monitored, method="simclr", precision="fp64", epochs=1, knn_every=1, data="synthetic:24")  # 2 steps
    knn = [json.loads(line) for line in (monitored / rundir.METRICS).read_text().splitlines() if "knn_top1" in line]
    assert len(knn) == 1 and 0 <= knn[0]["knn_top1"] <= 1
    ckpt = torch.load(monitored / rundir.LAST_CHECKPOINT, weights_only=False)["model"]
    assert ckpt["backbone.conv1.weight"].dtype == torch.float64


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_fp64_off_the_cpu_is_one_line_before_the_data_is_read(tmp_path, monkeypatch, kind):
    """MPS has no float64 and a GPU's sums differ from the CPU's anyway: `--precision fp64` is the CPU's alone.
    (The device is faked: select_device returns it as it would on a machine that has one.)"""
    from stages import pretrain
    from tests.cli_helpers import assert_one_line_error, cli

    monkeypatch.setattr(pretrain, "select_device", lambda name: torch.device(kind))
    monkeypatch.setattr(pretrain, "load_data", lambda *a, **k: pytest.fail("the data was read"))
    res = cli("pretrain", "--precision", "fp64", "--data", "synthetic:16", "--out", tmp_path / "r")
    assert_one_line_error(res, f"--precision fp64 runs on the CPU only (this run's device is {kind})", "--device cpu")
    assert not (tmp_path / "r" / rundir.CONFIG).exists()


@pytest.mark.parametrize("method,backbone", [("simclr", "resnet18"), ("byol", "resnet18"), ("mocov3", "resnet18"),
                                             ("simclr", "efficientnet_b0")])
def test_resume_is_exact(tmp_path, tiny_overrides, method, backbone):
    """Stopped after 3 steps (mid-epoch) and resumed == uninterrupted, weight for weight. A ResNet's forward draws
    nothing; EfficientNet-B0 keeps torchvision's stochastic depth, whose masks come from torch's global generator,
    so the resumed run must also draw the masks the uninterrupted one drew (the checkpoint's RNG state, and a batch
    source that draws nothing from that generator when it restarts mid-epoch)."""
    if backbone == "efficientnet_b0":
        from torchvision.ops import StochasticDepth

        from train.backbones import build_backbone

        net = build_backbone(backbone, small_stem=True, image_size=16)[0]
        assert max(m.p for m in net.modules() if isinstance(m, StochasticDepth)) > 0.15  # masks drawn every step
    extra = {"queue_size": 8} if method == "mocov3" else {}
    base = {**tiny_overrides, "method": method, "backbone": backbone, "epochs": 2, **extra}
    full = _run(tmp_path, base, name="full")
    part = _run(tmp_path, {**base, "max_steps": 3}, name="part")
    _run(tmp_path, {"max_steps": 0}, resume=True, name="part")
    a = torch.load(full / rundir.LAST_CHECKPOINT, weights_only=False)
    b = torch.load(part / rundir.LAST_CHECKPOINT, weights_only=False)
    assert a["step"] == b["step"] == 10
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert _losses(full) == _losses(part)


def test_run_directory_layout(tmp_path, tiny_overrides):
    out = _run(tmp_path, {**tiny_overrides, "max_steps": 2, "save_every": 1, "epochs": 1, "recipe": "paper"})
    assert (out / rundir.CONFIG).is_file() and (out / rundir.SPLIT).is_file() and (out / rundir.METRICS).is_file()
    cfg = load_config(PretrainConfig, out / rundir.CONFIG)
    assert cfg.temperature == 0.5 and cfg.optimizer == "lars"  # None defaults resolved and recorded
    split = json.loads((out / rundir.SPLIT).read_text())
    assert not set(split["train"]) & set(split["val"])
    ck = torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)
    assert {"model", "optimizer", "scheduler", "scaler", "step", "rng", "config", "meta"} <= set(ck)
    assert not list(out.rglob("*.tmp"))


@pytest.mark.parametrize("every_s,writes", [(0, 3), (1e7, 1)])  # 1e7 s: the longest interval allowed, never within a run
def test_last_checkpoint_written_by_time_and_at_the_end(tmp_path, tiny_overrides, monkeypatch, every_s, writes):
    """On small data one checkpoint write cost more than an epoch: last.pt is written once checkpoint_every_s has
    passed (0 = every epoch) and always at the end."""
    written = []
    real = rundir.torch_save_atomic
    monkeypatch.setattr(rundir, "torch_save_atomic", lambda path, obj: (written.append(obj["step"]), real(path, obj)))
    _run(tmp_path, {**tiny_overrides, "epochs": 3, "checkpoint_every_s": every_s})
    spe = torch.load(tmp_path / "run" / rundir.LAST_CHECKPOINT, weights_only=False)["meta"]["steps_per_epoch"]
    assert written == [spe * (i + 1) for i in range(3)][-writes:]


def test_lars_eta_reaches_the_optimizer(tmp_path, tiny_overrides):
    out = _run(tmp_path, {**tiny_overrides, "max_steps": 1, "lars_eta": 0.02, "optimizer": "lars"})
    assert torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)["optimizer"]["param_groups"][0]["eta"] == 0.02
    assert load_config(PretrainConfig, out / rundir.CONFIG).lars_eta == 0.02


def test_checkpoint_write_is_atomic(tmp_path, tiny_overrides, monkeypatch):
    out = _run(tmp_path, {**tiny_overrides, "max_steps": 2})
    before = (out / rundir.LAST_CHECKPOINT).read_bytes()
    real_save = torch.save

    def dying_save(obj, f, *a, **k):
        real_save(obj, f, *a, **k)
        f.truncate(100)  # a crash mid-write (torch.save is given the open temp file) ...
        raise OSError("disk full")  # ... then the error

    monkeypatch.setattr(torch, "save", dying_save)
    with pytest.raises(OSError):
        _run(tmp_path, {"max_steps": 4}, resume=True)
    assert (out / rundir.LAST_CHECKPOINT).read_bytes() == before
    assert not list(out.rglob("*.tmp"))


def test_nan_loss_stops_and_keeps_checkpoint(tmp_path, tiny_overrides, monkeypatch):
    out = _run(tmp_path, {**tiny_overrides, "max_steps": 2})
    before = (out / rundir.LAST_CHECKPOINT).read_bytes()
    from train.methods.simclr import SimCLR

    monkeypatch.setattr(SimCLR, "forward", lambda self, views, p: (self.backbone(views[0]).sum() * float("nan")))
    with pytest.raises(PipelineError, match="loss became nan at step 2"):
        _run(tmp_path, {"max_steps": 4}, resume=True)
    assert (out / rundir.LAST_CHECKPOINT).read_bytes() == before


def test_resume_refuses_changed_method(tmp_path, tiny_overrides):
    _run(tmp_path, {**tiny_overrides, "max_steps": 1})
    with pytest.raises(PipelineError, match="`method` is 'simclr'"):
        _run(tmp_path, {"method": "byol"}, resume=True)


@pytest.mark.parametrize("over,msg", [
    ({"batch_size": 1000}, "larger than the"),
    ({"image_size": 4}, "image size 4 is impossible for resnet18 with the small stem: use 8..1024"),
    ({"image_size": 16, "small_stem": "off"}, "image size 16 is impossible"),
    ({"batch_size": 1}, "`batch_size` must be >= 2"),
    ({"queue_size": 4}, "MoCo v3 option"),
    ({"lars_eta": 0}, "`lars_eta` must be > 0"),
    ({"checkpoint_every_s": -1}, "`checkpoint_every_s` must be >= 0"),
])
def test_bad_options(tmp_path, tiny_overrides, over, msg):
    with pytest.raises(PipelineError, match=msg):
        _run(tmp_path, {**tiny_overrides, **over})


def test_resolve_fills_method_defaults():
    cfg = resolve(PretrainConfig(method="byol", recipe="paper"))
    assert (cfg.proj_dim, cfg.momentum_base, cfg.lr) == (256, 0.99, 0.2)
    cfg = resolve(PretrainConfig(method="mocov3", recipe="paper", temperature=0.2))
    assert cfg.temperature == 0.2 and cfg.queue_size == 0


def test_cuda_graphs_policy():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert training.use_cuda_graphs("auto", cuda, 1)  # compiled or not: a compiled backbone's kernels are captured
    assert training.use_cuda_graphs("auto", cuda, 2)  # several processes: flat-buffer all-reduce
    assert not training.use_cuda_graphs("off", cuda, 1)
    assert training.use_cuda_graphs("on", cuda, 1)
    for device, world, sync_bn in [(cpu, 1, False), (cuda, 2, True)]:
        assert not training.use_cuda_graphs("auto", device, world, sync_bn)
        with pytest.raises(PipelineError, match="--cuda-graphs on needs CUDA without --sync-bn"):
            training.use_cuda_graphs("on", device, world, sync_bn)


def test_compile_policy_is_on_only_in_the_graphs_for_a_backbone_measured_faster_in_a_run_that_repays_it():
    """Unset: compiled where measured faster (one process, the CUDA graphs on, a row with compile_repays: ResNet-18
    and -50, MobileNetV3-Small and -Large, EfficientNet-B0), for a method whose compiled runs reached eager's kNN on
    that backbone (its compile_methods), in a run of at least the row's steps (or a long run, as bench times), never
    outside the graphs (compiled alone ran slower than eager in the graphs); typed, as typed."""
    from train.backbones import BACKBONES
    from train.methods import METHODS

    def on(backbone, method="simclr", **kw):
        return training.use_compile(None, backbone, method, **{"graphs": True, **kw})

    compiled = ["resnet18", "resnet50", "mobilenet_v3_small", "mobilenet_v3_large", "efficientnet_b0"]
    assert [b for b in BACKBONES if on(b)] == compiled
    for name in compiled:
        repays = BACKBONES[name].compile_repays
        assert on(name, steps=repays)
        assert not on(name, steps=repays - 1)  # its compiling would not be repaid
        assert set(BACKBONES[name].compile_methods) <= set(METHODS)  # a method the registry knows
    assert not any(b.compile_methods for b in BACKBONES.values() if b.compile_repays is None)  # faster first
    for method in METHODS:  # ResNet-18's compiled grid matched eager's kNN for every method
        assert on("resnet18", method) and on("resnet50", method)
    # on the mobile nets SimCLR matched eager's kNN and MoCo v3 did not; BYOL matched on the MobileNets only
    for mobile in ("mobilenet_v3_small", "mobilenet_v3_large"):
        assert {m for m in METHODS if on(mobile, m)} == {"simclr", "byol"}
    assert [m for m in METHODS if on("efficientnet_b0", m)] == ["simclr"]
    assert not on("mobilenet_v3_small", steps=216)  # configs/default.yaml's run
    assert not on("resnet34", steps=10**9)  # not measured faster
    assert not any(on(b, graphs=False) for b in BACKBONES)  # the CPU, MPS, --sync-bn runs
    assert not on("resnet18", world=2)  # several GPUs: not measured compiled
    assert training.use_compile(True, "vit_t_16", "byol", graphs=False)
    assert not training.use_compile(False, "resnet18", "simclr", True)
    assert training.use_compile(True, "efficientnet_b0", "mocov3", True, steps=1)  # typed: even where not the default


def test_the_run_asks_to_compile_with_its_scheduled_length_and_bench_as_a_long_run(tiny_overrides, monkeypatch):
    """build_training gives use_compile the run's steps by its schedule (epochs x steps an epoch, not --max-steps:
    a run cut short and resumed compiles as it did), bench none (the step of a run long enough); and the start line
    says when only the run's length kept it eager, with the steps that would repay compiling, or only the method."""
    import dataclasses

    from train.backbones import BACKBONES

    asked = []
    real = training.use_compile
    monkeypatch.setattr(training, "use_compile", lambda *a: asked.append(a[5]) or real(*a))
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "backbone": "mobilenet_v3_small", "max_steps": 3}))
    t, _ = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=4)
    training.build_training(cfg, torch.device("cpu"), steps_per_epoch=4, steady=True)
    assert asked == [4 * cfg.epochs, None]
    monkeypatch.undo()

    graphed = dataclasses.replace(t, captured="whole loss")  # as on CUDA; the CPU never captures
    repays = BACKBONES["mobilenet_v3_small"].compile_repays
    assert training.compile_note(graphed, cfg, 1) == (f"False (it repays from {repays:,} steps, this run has "
                                                      f"{t.total_steps:,}: --compile to compile anyway)")
    assert training.compile_note(t, cfg, 1) == "False"  # no graphs: not a question of length
    assert training.compile_note(graphed, dataclasses.replace(cfg, compile=False), 1) == "False"  # as typed
    assert training.compile_note(graphed, cfg, 2) == "False"  # several processes: never compiled unset
    assert training.compile_note(dataclasses.replace(graphed, compiled=True), cfg, 1) == "True"
    resnet34 = dataclasses.replace(cfg, backbone="resnet34")
    assert training.compile_note(graphed, resnet34, 1) == "False"  # not measured faster
    mocov3 = dataclasses.replace(cfg, method="mocov3")  # faster on this backbone, not shown to train as well
    assert training.compile_note(graphed, mocov3, 1) == ("False (MoCo v3 compiled on MobileNetV3-Small has not been "
                                                         "shown to reach eager's kNN: --compile to compile anyway)")


def test_compile_compiles_the_backbones_forward_so_graphs_can_capture_it(tiny_overrides, monkeypatch):
    """--compile swaps the backbone's forward for the compiled one (what make_graphed_callables then captures in
    its graphs; nn.Module.compile would wrap the module's call around it instead, and the graphs would replay from
    inside the compiled code): the state_dict keys stay the plain module's, and a step through it trains."""
    compiled = []

    def fake_compile(fn, **kw):  # torch.compile's contract: a callable that computes what fn does
        compiled.append(fn)
        return lambda *a, **k: fn(*a, **k)

    monkeypatch.setattr(torch, "compile", fake_compile)
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "compile": True}))
    t, _ = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=4)
    backbone = t.model.backbone
    assert len(compiled) == 1 and compiled[0] == type(backbone).forward.__get__(backbone)
    assert backbone.forward is not compiled[0] and "forward" in vars(backbone)
    plain = resolve(PretrainConfig(**tiny_overrides))
    assert list(backbone.state_dict()) == list(training.build_training(plain, torch.device("cpu"), 4)[0].model.backbone.state_dict())
    before = [p.detach().clone() for p in backbone.parameters()]
    x = [torch.rand(cfg.batch_size, 3, 16, 16) for _ in range(2)]
    assert torch.isfinite(training.train_step(t, x, 0))
    assert any(not torch.equal(a, p) for a, p in zip(before, backbone.parameters()))


def test_cuda_graphs_on_without_cuda_is_a_clean_error(tmp_path, tiny_overrides):
    with pytest.raises(PipelineError, match="--cuda-graphs on needs CUDA"):
        _run(tmp_path, {**tiny_overrides, "cuda_graphs": "on", "max_steps": 1})
    assert not (tmp_path / "run" / rundir.LAST_CHECKPOINT).exists()


# Ops that make the host wait for a GPU: reading a value (item / _local_scalar_dense), data-dependent shapes
# (nonzero, masked_select, boolean indexing), and indexed writes, whose value a Python scalar becomes through a
# host-to-device copy. One such op in a step leaves the GPU idle while the host catches up.
SYNCING_OPS = ("aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.index_put",
               "aten.index_put_", "aten.unique", "aten._unique2")


@pytest.mark.parametrize("method", ["simclr", "byol", "mocov3"])
def test_training_step_never_waits_for_the_device(tiny_overrides, method):
    """Recorded on the CPU with a dispatch mode, which sees every op the step runs, backward and LARS included.
    (MoCo's queue reads its fill count until the ring is full: steps 1-2 fill it, step 3 is recorded.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    extra = {"queue_size": 16} if method == "mocov3" else {}
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "method": method, **extra}))
    t, _ = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=4)
    x = [torch.rand(cfg.batch_size, 3, 16, 16) for _ in range(2)]
    for step in range(2):
        training.train_step(t, x, step)
    with Ops() as ops:
        training.train_step(t, x, 2)
    assert "aten.convolution" in ops.seen or "aten.convolution_backward" in ops.seen  # the mode saw the step
    assert not sorted(ops.seen & set(SYNCING_OPS)), f"{method}: {sorted(ops.seen & set(SYNCING_OPS))}"


def test_checkpoint_records_the_device_and_wall_time_summed_over_resumes(tmp_path, tiny_overrides):
    """The report's run card reads both from the checkpoint: config.yaml only holds the device asked for."""
    import time

    part = _run(tmp_path, {**tiny_overrides, "max_steps": 2}, name="part")
    path = part / rundir.LAST_CHECKPOINT
    first = torch.load(path, weights_only=False)
    assert first["meta"]["device"] == "cpu" and first["meta"]["wall_s"] > 0
    first["meta"]["wall_s"] = 1000.0  # as if the first part had trained for 1000 s
    torch.save(first, path)
    t0 = time.perf_counter()
    _run(tmp_path, {"max_steps": 4}, resume=True, name="part")
    resumed = torch.load(path, weights_only=False)
    assert resumed["step"] == 4 and resumed["meta"]["device"] == "cpu"
    assert 1000.0 < resumed["meta"]["wall_s"] < 1000.0 + time.perf_counter() - t0
