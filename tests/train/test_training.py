"""The training step's views and CUDA graphs: what is captured, and what a call of another shape runs. Capturing
needs CUDA (benchmarks/cuda_graph_check.py runs it there); the choices around it are checked here on the CPU."""

import dataclasses

import torch

from train import augment, training
from train.configs import PretrainConfig
from train.methods import byol
from train.runspec import resolve


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
    concatenated, at the run's size. MoCo v3 with a key queue: the backbone alone, for both views."""
    captured = []
    monkeypatch.setattr(training, "use_cuda_graphs", lambda *a, **k: True)
    monkeypatch.setattr(training, "graph_backbone", lambda backbone, batch, size, *a: captured.append(("backbone", batch, size)))
    monkeypatch.setattr(training, "graph_loss", lambda model, views, batch, size, *a: captured.append(("loss", views, batch, size)))
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
    assert captured == [("loss", 2, 8, 16), ("backbone", 3 * 8, 16), ("loss", 2, 8, 16), ("loss", 2, 8, 16),
                        ("backbone", 2 * 8, 16)]
    assert said == ["whole loss", "backbone", "whole loss", "whole loss", "backbone"]


def test_the_whole_loss_is_captured_for_one_process_views_of_one_size_and_a_method_that_allows_it():
    class Method(torch.nn.Module):
        loss_capturable = True

    assert training.loss_graphable(Method(), (32, 32), 1)
    assert not training.loss_graphable(Method(), (32, 32), 2)  # the loss gathers every rank's embeddings
    assert not training.loss_graphable(Method(), (32, 32, 16), 1)  # local views: another shape
    assert not training.loss_graphable(torch.nn.Module(), (32, 32), 1)  # a method that does not say
    Method.loss_capturable = False
    assert not training.loss_graphable(Method(), (32, 32), 1)


def test_a_graphed_loss_replays_its_captured_shapes_in_training_and_hands_out_a_copy():
    """The graph's loss buffer is rewritten at the next replay, which the loop runs before it reads a step's loss: a
    copy goes out. Another shape, eval mode or no gradients take the plain forward."""
    buffer, calls = torch.zeros(()), []
    model = torch.nn.Linear(1, 1)

    def graphed(*views):
        calls.append("graph")
        return buffer

    forward = training.by_views(graphed, lambda views, precision: calls.append("eager") or torch.ones(()), model,
                                [torch.Size((4, 3, 8, 8))] * 2)
    same, other = [torch.zeros(4, 3, 8, 8)] * 2, [torch.zeros(4, 3, 8, 8), torch.zeros(4, 3, 4, 4)]
    out = forward(same, None)
    buffer.fill_(7.0)  # the next replay
    assert out.item() == 0.0
    forward(other, None)
    with torch.no_grad():
        forward(same, None)
    model.eval()
    forward(same, None)
    model.train()
    forward(same, None)
    assert calls == ["graph", "eager", "eager", "eager", "graph"]


def test_a_capture_puts_back_the_batchnorm_statistics_its_warm_up_moved(monkeypatch):
    """make_graphed_callables (CUDA only) runs warm-up passes in training mode before it captures; a stand-in here
    does just that, so what `capture` does around it runs on the CPU: its samples (one per input, the run's shape
    and memory format, from its own generator, not the run's) and the BatchNorm statistics put back in place."""
    def warm_up(module, samples):
        for _ in range(3):
            module(*samples).sum().backward()

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", warm_up)
    class TwoViews(torch.nn.Module):  # a loss of two inputs, as graph_loss's _Loss
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
