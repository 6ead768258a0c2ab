"""Preprocessing backends: which one --preprocess picks and why, one-line errors where Core ML cannot run,
the Core ML backend against the torch one through the whole view (Core ML stood in for by the reference evaluator
running the same packages), pretraining with --preprocess auto on Linux, and `pipeline bench --preprocess`."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from core import coreml_runtime
from export import mil_eval
from pipeline import cli
from core.errors import PipelineError
from train import augment, preprocess
from train.methods import METHODS
from stages import bench
from tests.stages.test_pretrain import PIN_RTOL, PIN_RUN, PINNED, _losses
from tests.tiny_run import pretrain_tiny

SIZE, STORE = 48, 55  # a view side with a 5-tap blur (reflect padding two deep); 8/7 of it, a folder store
# The Core ML backend's view against torch's, both before uint8: the color_jitter, grayscale and blur models'
# evaluator tolerances (tests/train/test_preprocess_models.py) added: 6.8e-3, under two uint8 levels.
VIEW_TOL = 2**-8 + 2**-10 + 2**-9


@pytest.fixture
def on_linux(monkeypatch):
    monkeypatch.setattr(coreml_runtime.platform, "system", lambda: "Linux")


@pytest.fixture
def cache_root(tmp_path_factory):
    """The run-wide folder tests/train/test_preprocess_models.py also builds into: each model is built once."""
    base = tmp_path_factory.getbasetemp()  # under pytest-xdist, one subfolder of the run's folder per worker
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "preprocess_cache"


@pytest.fixture
def coreml_by_evaluator(monkeypatch):
    """'macOS': Core ML can predict, and each load/prediction is the reference evaluator on the same package.
    Returns the calls: ("load", model, compute units) and ("predict", model, non-image inputs)."""
    calls = []

    def load(path, units):
        calls.append(("load", Path(path).name.split("-")[0], units))
        return mil_eval.load_mlpackage(path)

    def predict(model, feeds, output):
        calls.append(("predict", model.path.name.split("-")[0], {k: v.tolist() for k, v in feeds.items() if k != "image"}))
        return mil_eval.run_program(model, {k: torch.from_numpy(v) for k, v in feeds.items()})[output].numpy()

    monkeypatch.setattr(coreml_runtime, "coreml_can_predict", lambda: (True, ""))
    monkeypatch.setattr(coreml_runtime, "coreml_load", load)
    monkeypatch.setattr(coreml_runtime, "coreml_predict_arrays", predict)
    return calls


def test_resolve_backend_on_linux(on_linux):
    assert preprocess.resolve_backend("torch") == ("torch", "asked for")
    name, why = preprocess.resolve_backend("auto")
    assert name == "torch" and "Core ML runs only on macOS (this is Linux)" in why and "evaluator" not in why
    with pytest.raises(PipelineError, match=r"--preprocess coreml: Core ML cannot run here: Core ML runs only on macOS"):
        preprocess.resolve_backend("coreml")
    with pytest.raises(PipelineError, match="must be one of auto, torch, coreml"):
        preprocess.resolve_backend("gpu")


def test_resolve_backend_where_core_ml_runs(coreml_by_evaluator):
    assert preprocess.resolve_backend("auto") == ("coreml", "auto: Core ML can run here")
    assert preprocess.resolve_backend("coreml") == ("coreml", "asked for")
    assert preprocess.resolve_backend("torch") == ("torch", "asked for")


def test_for_training_serves_the_cpu_path_only(coreml_by_evaluator):
    backend, note = preprocess.for_training("auto", "device", SIZE)
    assert backend is preprocess.TORCH_PREPROCESS and note == "unused (--augment device)"
    with pytest.raises(PipelineError, match="add --augment cpu"):
        preprocess.for_training("coreml", "device", SIZE)


def test_coreml_views_match_torch_views(coreml_by_evaluator, cache_root):
    """Whole views (crop, flip, jitter in a random order with hue between Core ML calls, grayscale, blur) from the
    same parameters through both backends."""
    backend, note = preprocess.for_training("auto", "cpu", SIZE, cache_root)
    assert isinstance(backend, preprocess.CoreMLPreprocess) and note == "coreml (auto: Core ML can run here)"
    recipe = augment.ViewRecipe(**{**METHODS["simclr"].views[0].__dict__, "jitter_p": 1.0, "gray_p": 0.3, "blur_p": 1.0})
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (10, 3, STORE, STORE), dtype=torch.uint8, generator=g)
    p = augment.sample_params(len(images), recipe, STORE, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
    worst = 0.0
    for i, img in enumerate(images):
        ref = augment.apply_view(img, p, i, SIZE)
        out = augment.apply_view(img, p, i, SIZE, backend)
        worst = max(worst, (out - ref).abs().max().item())
    assert worst <= VIEW_TOL, worst
    predicted = [c for c in coreml_by_evaluator if c[0] == "predict"]
    jitter = [c[2] for c in predicted if c[1] == "color_jitter"]
    # one call per run of blends between hues: each view has 3 blends and 1 hue -> 1 call (hue first or last) or 2
    assert len(images) <= len(jitter) <= 2 * len(images)
    assert sum(sum(c < 3 for c in j["order"]) for j in jitter) == 3 * len(images)  # every blend, exactly once
    assert {c[1] for c in predicted} == {"color_jitter", "gaussian_blur", "grayscale"}
    assert len([c for c in predicted if c[1] == "gaussian_blur"]) == len(images)
    assert {c[2] for c in coreml_by_evaluator if c[0] == "load"} == {preprocess.COMPUTE_UNITS}


def test_coreml_backend_crosses_into_workers_without_loaded_models(coreml_by_evaluator, cache_root):
    """A DataLoader worker on macOS gets the Dataset pickled (spawn): the loaded models stay behind, and the worker
    loads its own on first use."""
    backend = preprocess.CoreMLPreprocess(SIZE, cache_root)
    x = torch.rand(3, SIZE, SIZE)
    before = backend.grayscale(x)
    assert backend._loaded
    clone = pickle.loads(pickle.dumps(augment.ViewDataset(torch.zeros(1, 3, SIZE, SIZE, dtype=torch.uint8),
                                                             augment.recipes_for("byol", SIZE), SIZE, 0, 0, backend)))
    assert clone.preprocess._loaded == {} and clone.preprocess.paths == backend.paths
    torch.testing.assert_close(clone.preprocess.grayscale(x), before, rtol=0, atol=0)


def test_coreml_backend_refuses_other_shapes(coreml_by_evaluator, cache_root):
    backend = preprocess.CoreMLPreprocess(SIZE, cache_root)
    with pytest.raises(PipelineError, match=f"takes 3 x {SIZE} x {SIZE} images"):
        backend.grayscale(torch.rand(3, SIZE + 1, SIZE + 1))
    with pytest.raises(PipelineError, match="uses a 5-px kernel"):
        backend.gaussian_blur(torch.rand(3, SIZE, SIZE), 7, 1.0)


def test_pretraining_with_preprocess_auto_on_linux(tmp_path, tiny_overrides, on_linux):
    """auto on Linux is the torch backend, which is the reference path: the pinned losses, and the log says why."""
    lines = []
    out = tmp_path / "run"
    pretrain_tiny(out, say=lines.append, **PIN_RUN, preprocess="auto", augment="cpu", recipe="paper")
    assert _losses(out) == pytest.approx(PINNED["simclr"], rel=PIN_RTOL)
    setup = [line for line in lines if line.startswith("pretraining ")]
    assert "preprocess torch (auto: Core ML cannot run here: Core ML runs only on macOS (this is Linux))" in setup[0]


def test_pretrain_coreml_where_it_cannot_run_is_one_line(tmp_path, on_linux):
    res = CliRunner().invoke(cli.main, ["pretrain", "--preprocess", "coreml", "--data", "synthetic:16", "--device",
                                        "cpu", "--image-size", "16", "--batch-size", "4", "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1
    assert "--preprocess coreml: Core ML cannot run here: Core ML runs only on macOS" in res.output


def test_bench_times_preprocessing_per_image(on_linux):
    tiny = ["--device", "cpu", "--image-size", "16", "--batch-size", "2", "--windows", "1", "--warmup", "0"]
    res = CliRunner().invoke(cli.main, ["bench", *tiny, "--preprocess", "torch", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output.strip().splitlines()[-1])
    assert (r["preprocess"], r["image_size"], r["images_per_window"]) == ("torch", 16, 2)
    assert set(r["ms_per_image"]) == {"color_jitter", "grayscale", "gaussian_blur", "two_views"}
    assert all(v > 0 for v in r["ms_per_image"].values())
    res = CliRunner().invoke(cli.main, ["bench", *tiny, "--preprocess", "torch"])
    assert res.exit_code == 0 and "preprocess torch (asked for)" in res.output and "ms/image" in res.output
    res = CliRunner().invoke(cli.main, ["bench", *tiny, "--preprocess", "coreml"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "only on macOS" in res.output


def test_bench_times_the_coreml_backend(coreml_by_evaluator, cache_root):
    r = bench.time_per_image("coreml", "byol", SIZE, STORE, images=2, windows=1, warmup=0, seed=0, cache_root=cache_root)
    assert r["preprocess"] == "coreml" and r["blur_kernel"] == 5 and all(v > 0 for v in r["ms_per_image"].values())
    assert {c[1] for c in coreml_by_evaluator if c[0] == "predict"} == {"color_jitter", "grayscale", "gaussian_blur"}


def test_coreml_load_and_predict_arrays_with_mlmodel_mocked(monkeypatch, on_linux):
    """The real-runtime calls the Core ML backend makes, with MLModel mocked: compute units passed through, the
    feeds handed over as they are, the output as float32; one-line errors off macOS and for a missing output."""
    import coremltools as ct

    with pytest.raises(PipelineError, match="only on macOS"):
        coreml_runtime.coreml_load("m.mlpackage", "ALL")
    seen = {}

    class FakeModel:
        def __init__(self, path, compute_units):
            seen.update(path=path, units=compute_units)

        def predict(self, feeds):
            seen["feeds"] = feeds
            return {"output": feeds["image"].astype(np.float16) * feeds["sigma"]}

    monkeypatch.setattr(coreml_runtime, "coreml_can_predict", lambda: (True, ""))
    monkeypatch.setattr(ct.models, "MLModel", FakeModel)
    model = coreml_runtime.coreml_load("m.mlpackage", "CPU_AND_NE")
    assert seen["path"] == "m.mlpackage" and seen["units"] == ct.ComputeUnit.CPU_AND_NE
    feeds = {"image": np.ones((1, 3, 2, 2), np.float32), "sigma": np.array([2.0], np.float32)}
    out = coreml_runtime.coreml_predict_arrays(model, feeds, "output")
    assert out.dtype == np.float32 and (out == 2).all() and seen["feeds"] is feeds
    with pytest.raises(PipelineError, match="no output 'embedding'"):
        coreml_runtime.coreml_predict_arrays(model, feeds, "embedding")
    with pytest.raises(PipelineError, match="compute units"):
        coreml_runtime.coreml_load("m.mlpackage", "GPU_ONLY")
