"""The training step's views and CUDA graphs: what is captured, and what a call of another shape runs. Capturing
needs CUDA (benchmarks/cuda_graph_check.py runs it there); the choices around it are checked here on the CPU."""

import contextlib
import dataclasses

import torch

from core.device import Precision
from train import augment, training
from train.configs import PretrainConfig
from train.methods import byol
from train.runspec import resolve, seed_everything


def test_a_graphed_backbone_replays_its_captured_shape_and_runs_any_other_eagerly():
    """A graph copies its input into a buffer of one shape: the captured batch replays it, a multi-crop method's
    local views (another side) and any other batch take the plain forward."""
    calls = []
    forward = training.by_shape(lambda x: calls.append("graph") or x, lambda x: calls.append("eager") or x,
                                torch.Size((16, 3, 8, 8)))
    for shape in ((16, 3, 8, 8), (16, 3, 4, 4), (8, 3, 8, 8), (16, 3, 8, 8)):
        assert forward(torch.zeros(shape)).shape == shape
    assert calls == ["graph", "eager", "eager", "graph"]


def test_the_graph_captures_the_whole_loss_or_every_view_at_the_runs_size_as_one_batch(tiny_overrides, monkeypatch):
    """Two views at the run's size: the whole loss is captured, for two batches of the run's size. Three views at
    the run's size and two local ones: the backbone alone, for the three global views of the per-process batch,
    concatenated, at the run's size. MoCo v3 with a key queue, or a scaled (fp16) loss: the backbone alone, for both
    views."""
    captured = []
    monkeypatch.setattr(training, "use_cuda_graphs", lambda *a, **k: True)
    monkeypatch.setattr(training, "graph_backbone", lambda backbone, batch, size, *a: captured.append(("backbone", batch, size)))
    monkeypatch.setattr(training, "LossGraph", lambda model, views, batch, size, *a: captured.append(("loss", views, batch, size)))
    local = augment.ViewRecipe(crop_scale=(0.05, 0.4), size=0.5)
    said = []  # what the run says it captured (pretrain's log line, bench's JSON)
    for views in (byol.SPEC.views, (*byol.SPEC.views, byol.SPEC.views[0], local, local)):
        monkeypatch.setattr(byol, "SPEC", dataclasses.replace(byol.SPEC, views=views))
        t, _ = training.build_training(resolve(PretrainConfig(**{**tiny_overrides, "method": "byol"})),
                                       torch.device("cpu"), 4)
        said.append(t.captured)
    for method, extra in (("simclr", {}), ("mocov3", {}), ("mocov3", {"queue_size": 64})):
        t, _ = training.build_training(resolve(PretrainConfig(**{**tiny_overrides, "method": method, **extra})),
                                       torch.device("cpu"), 4)
        said.append(t.captured)
    # A scaled loss (fp16 autocast, as on MPS): the scale must reach the backward through autograd, which the
    # loss's graph leaves out, so the backbone alone is captured.
    monkeypatch.setattr(training, "precision_for", lambda device, mode: Precision("cpu", torch.float16, None))
    t, _ = training.build_training(resolve(PretrainConfig(**{**tiny_overrides, "method": "simclr"})),
                                   torch.device("cpu"), 4)
    said.append(t.captured)
    assert captured == [("loss", 2, 8, 16), ("backbone", 3 * 8, 16), ("loss", 2, 8, 16), ("loss", 2, 8, 16),
                        ("backbone", 2 * 8, 16), ("backbone", 2 * 8, 16)]
    assert said == ["whole loss", "backbone", "whole loss", "whole loss", "backbone", "backbone"]


def test_the_whole_loss_is_captured_for_one_process_views_of_one_size_and_a_method_that_allows_it():
    class Method(torch.nn.Module):
        loss_capturable = True

    assert training.loss_graphable(Method(), (32, 32), 1)
    assert not training.loss_graphable(Method(), (32, 32), 2)  # the loss gathers every rank's embeddings
    assert not training.loss_graphable(Method(), (32, 32, 16), 1)  # local views: another shape
    assert not training.loss_graphable(torch.nn.Module(), (32, 32), 1)  # a method that does not say
    assert not training.loss_graphable(Method(), (32, 32), 1, scaled=True)  # fp16: autograd's backward applies the scale
    Method.loss_capturable = False
    assert not training.loss_graphable(Method(), (32, 32), 1)


class _Stream:  # torch.cuda's streams, on the CPU: LossGraph's stream choreography, as no-ops
    def wait_stream(self, other):
        pass


def _cuda_on_the_cpu(monkeypatch, model) -> list:
    """torch.cuda's streams and graph as CPU stand-ins under which LossGraph's capture runs its passes eagerly (the
    real capture needs CUDA: benchmarks/cuda_graph_check.py runs it there). Returns the list the stand-in graph
    notes each capture in, with whether every gradient of `model` was None as it began (else the captured backward
    would add to the warm-up's gradients at every replay)."""
    notes = []
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: "graph")

    @contextlib.contextmanager
    def graph(g):
        notes.append(("capture", g, all(p.grad is None for p in model.parameters())))
        yield

    monkeypatch.setattr(torch.cuda, "graph", graph)
    return notes


class _Method(torch.nn.Module):
    """A method's shape: forward(views, precision) -> loss; a BatchNorm (statistics a warm-up moves) and a parameter
    the loss never reads (it gets no gradient, as in an eager step)."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
        self.unused = torch.nn.Linear(2, 2)
        self.passes = 0

    def forward(self, views, precision):
        self.passes += 1
        return sum((self.net(v) ** 2).mean() for v in views)


def test_the_loss_graph_captures_forward_and_backward_and_puts_back_what_its_warm_up_moved(monkeypatch):
    """The capture (a stand-in here that runs its pass eagerly) follows the warm-up passes with the gradients set to
    None, so its backward allocates every .grad the replays then rewrite; a parameter the loss never reads keeps
    None (and every .grad is None as the capture begins). The warm-up's BatchNorm statistics are put back in place,
    the inputs come from the graph's own generator (the run's is untouched) in the run's shape and memory format,
    and the loss it holds needs no gradient."""
    torch.manual_seed(0)
    model = _Method()
    notes = _cuda_on_the_cpu(monkeypatch, model)
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    addresses = [b.data_ptr() for b in model.buffers()]
    state = torch.get_rng_state()
    g = training.LossGraph(model, 2, 5, 8, channels_last=True, precision=None)
    assert notes == [("capture", "graph", True)] and model.passes == training.LossGraph.WARMUP + 1
    assert torch.equal(torch.get_rng_state(), state)
    assert [x.shape for x in g.inputs] == [torch.Size((5, 3, 8, 8))] * 2
    assert all(x.is_contiguous(memory_format=torch.channels_last) for x in g.inputs)
    assert not torch.equal(g.inputs[0], g.inputs[1])
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    assert [b.data_ptr() for b in model.buffers()] == addresses
    assert all(p.grad is not None for p in model.net.parameters())
    assert all(p.grad is None for p in model.unused.parameters())
    assert not g.loss.requires_grad
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: self)  # the warm-up did move them: no put-back,
    training.LossGraph(model, 2, 5, 8, channels_last=False, precision=None)  # and they differ
    assert not torch.equal(before["1.running_mean"], model.net.state_dict()["1.running_mean"])


class _Replay:
    """A stand-in for a captured loss graph's replay on the CPU: what the captured kernels do, eagerly. The
    forward and backward of the graph's inputs, each gradient written into the .grad the capture allocated, the
    loss into its buffer."""

    def __init__(self, model, precision, g):
        self.model, self.precision, self.g = model, precision, g

    def replay(self):
        trained = [p for p in self.model.parameters() if p.grad is not None]
        loss = self.model(self.g.inputs, self.precision)
        for p, grad in zip(trained, torch.autograd.grad(loss, trained)):
            p.grad.copy_(grad)
        self.g.loss.copy_(loss.detach())


def test_a_step_through_the_loss_graph_trains_as_the_eager_step(tiny_overrides):
    """train_step with a captured loss (its replay a stand-in that runs the captured work eagerly) against the eager
    step, from one init on the same views: the same losses and weights, bit for bit, for a method with a momentum
    branch (BYOL). It copies the views into the graph's inputs, never drops a .grad the graph writes (the optimizer
    reads them there), and hands out each step's loss as a copy (the next replay rewrites the buffer)."""
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "method": "byol"}))
    runs = []
    for graphed in (False, True):
        seed_everything(0)
        t, _ = training.build_training(cfg, torch.device("cpu"), 4)
        t.model.train()
        start = [p.detach().clone() for p in t.model.parameters()]
        if graphed:
            g = object.__new__(training.LossGraph)
            g.inputs = [torch.zeros(8, 3, 16, 16) for _ in range(2)]
            g.loss, g.graph = torch.zeros(()), _Replay(t.model, t.precision, g)
            for p in t.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)  # what the capture's backward allocates
            t.loss_graph, grads = g, [p.grad for p in t.model.parameters()]
        views = torch.Generator().manual_seed(1)
        batches = [[torch.randn(8, 3, 16, 16, generator=views) for _ in range(2)] for _ in range(3)]
        losses = [training.train_step(t, batch, i) for i, batch in enumerate(batches)]
        runs.append((losses, [p.detach().clone() for p in t.model.parameters()]))
    (eager_losses, eager_weights), (graph_losses, graph_weights) = runs
    assert [float(x) for x in graph_losses] == [float(x) for x in eager_losses]
    assert len({float(x) for x in graph_losses}) == 3  # each step's own loss, not the buffer's last
    assert not all(torch.equal(a, b) for a, b in zip(start, graph_weights))  # it trained
    assert all(torch.equal(a, b) for a, b in zip(eager_weights, graph_weights))
    assert all(p.grad is grad for p, grad in zip(t.model.parameters(), grads))  # none dropped, none replaced
    assert all(torch.equal(x, v) for x, v in zip(g.inputs, batches[-1]))


def test_a_capture_puts_back_the_batchnorm_statistics_its_warm_up_moved(monkeypatch):
    """make_graphed_callables (CUDA only) runs warm-up passes in training mode before it captures; a stand-in here
    does just that, so what `capture` does around it runs on the CPU: its samples (one per input, the run's shape
    and memory format, from its own generator, not the run's) and the BatchNorm statistics put back in place."""
    def warm_up(module, samples):
        for _ in range(3):
            module(*samples).sum().backward()

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", warm_up)
    class TwoViews(torch.nn.Module):  # a module of two inputs: capture takes any number
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))

        def forward(self, a, b):
            return self.net(a) + self.net(b)

    torch.manual_seed(0)
    loss = TwoViews()
    net = loss.net
    before = {k: v.clone() for k, v in net.state_dict().items()}
    addresses = [b.data_ptr() for b in net.buffers()]
    state = torch.get_rng_state()
    samples = training.capture(loss, 2, 5, 8, channels_last=True)
    assert torch.equal(torch.get_rng_state(), state)
    assert [s.shape for s in samples] == [torch.Size((5, 3, 8, 8))] * 2
    assert all(s.is_contiguous(memory_format=torch.channels_last) for s in samples)
    assert not torch.equal(samples[0], samples[1])
    after = net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert [b.data_ptr() for b in net.buffers()] == addresses
    monkeypatch.setattr(torch.Tensor, "copy_", lambda self, src: self)  # the warm-up did move them: no put-back,
    training.capture(loss, 2, 5, 8, channels_last=False)                # and they differ
    assert not torch.equal(before["1.running_mean"], net.state_dict()["1.running_mean"])
