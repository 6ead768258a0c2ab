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


def test_the_graph_captures_every_view_at_the_runs_size_as_one_batch(tiny_overrides, monkeypatch):
    """Three views at the run's size and two local ones: the capture is of the three global views of the per-process
    batch, concatenated, at the run's size, as the two-view methods' is of both their views."""
    captured = []
    monkeypatch.setattr(training, "use_cuda_graphs", lambda *a, **k: True)
    monkeypatch.setattr(training, "graph_backbone", lambda backbone, batch, size, *a: captured.append((batch, size)))
    local = augment.ViewRecipe(crop_scale=(0.05, 0.4), size=0.5)
    for views in (byol.SPEC.views, (*byol.SPEC.views, byol.SPEC.views[0], local, local)):
        monkeypatch.setattr(byol, "SPEC", dataclasses.replace(byol.SPEC, views=views))
        training.build_training(resolve(PretrainConfig(**{**tiny_overrides, "method": "byol"})), torch.device("cpu"), 4)
    assert captured == [(2 * 8, 16), (3 * 8, 16)]
