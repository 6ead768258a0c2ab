"""The Core ML preprocessing models: every one is built, run through the reference evaluator and compared with its
torch implementation (train.preprocess.TorchPreprocess) on random images and random factors; on a Mac, also
through Core ML itself. Plus the cache: one build per key, atomic, and the keep-fp32 choices really in the file.

Tolerances (absolute; a view is then quantised to uint8, one level = 1/255 ~ 3.9e-3). fp16 steps are 2^-11 in
[0.5, 1) and 2^-10 in [1, 2); the evaluator rounds after every op as Core ML stores fp16, so each op adds up to
half a step:
- grayscale: the input's rounding and one rounded 1x1 conv: 2^-10 (two steps just below 1).
- gaussian_blur: input, fp16 kernel taps, two rounded convs: 2^-9, half a uint8 level.
- color_jitter: three chained blends of ~6 rounded ops each, and a factor up to 1.8 scales the earlier rounds'
  error: 2^-8, one uint8 level (largest seen over hundreds of SimCLR draws at 32-224 px: 3.1e-3).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from core import coreml_runtime
from export import mil_eval
from train import preprocess_models as models
from train.methods import METHODS
from core.errors import PipelineError
from train import augment
from train.preprocess import TORCH_PREPROCESS

pytest.importorskip("coremltools")

SIZE = 48  # a view side with a 5-tap blur
TOL = {"grayscale": 2**-10, "gaussian_blur": 2**-9, "color_jitter": 2**-8}
DIMS = {"gaussian_blur": {"size": SIZE}, "color_jitter": {"size": SIZE}, "grayscale": {"size": SIZE}}
DRAWS = 12  # random images and factor sets per model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every model, built once per test run: pytest-xdist workers share the run's folder, and build_cached's lock
    lets one build while the other waits (tests/train/test_preprocess.py uses the same folder)."""
    base = tmp_path_factory.getbasetemp()  # under pytest-xdist, one subfolder of the run's folder per worker
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "preprocess_cache"
    paths = {name: models.build_cached(name, root, **DIMS[name]) for name in models.MODELS}
    return root, paths


def _draw(name: str, g: torch.Generator) -> tuple[dict, torch.Tensor]:
    """One random case: (model feeds, the torch backend's output for the same image and factors)."""
    recipe = METHODS["simclr"].views[0]  # the widest jitter factors of any recipe
    x = torch.rand(3, SIZE, SIZE, generator=g)
    if name == "grayscale":
        return {"image": x[None]}, TORCH_PREPROCESS.grayscale(x)
    p = augment.sample_params(1, recipe, SIZE, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
    if name == "gaussian_blur":
        sigma = float(p["sigma"][0])
        return ({"image": x[None], "sigma": torch.tensor([sigma])},
                TORCH_PREPROCESS.gaussian_blur(x, augment.blur_kernel_size(SIZE), sigma))
    order = torch.randperm(3, generator=g)  # the three blends in a random order; hue has no model
    f = {k: float(p[k][0]) for k in models.BLEND_OPS}
    feeds = {"image": x[None], **{k: torch.tensor([v]) for k, v in f.items()}, "order": order.int()}
    return feeds, TORCH_PREPROCESS.color_jitter(x, order.tolist(), *f.values(), 0.0)


@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_matches_torch_through_the_evaluator(built, name):
    _, paths = built
    model = mil_eval.load_mlpackage(paths[name])
    assert model.precision == "fp16"  # the tolerance above is an fp16 one: the program must really be fp16
    assert [i.name for i in model.inputs] == [models.INPUT, *models.MODEL_INPUTS[name]]
    g = torch.Generator().manual_seed(list(models.MODELS).index(name))
    worst = 0.0
    for _ in range(DRAWS):
        feeds, ref = _draw(name, g)
        out = mil_eval.run_program(model, feeds)[models.OUTPUT][0]
        assert out.shape == ref.shape
        worst = max(worst, (out - ref).abs().max().item())
    assert worst <= TOL[name], f"{name}: max |model - torch| {worst:.2e} > {TOL[name]:.2e}"


def test_color_jitter_runs_any_order_and_skips_rounds(built):
    """Each of the 6 orders, and runs of 1 or 2 ops padded with the skip code, against torch op by op."""
    _, paths = built
    model = mil_eval.load_mlpackage(paths["color_jitter"])
    g = torch.Generator().manual_seed(5)
    x = torch.rand(3, SIZE, SIZE, generator=g)
    f = {"brightness": 1.6, "contrast": 0.3, "saturation": 1.7}
    skip = models.JITTER_SKIP
    orders = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0], [1, skip, skip], [2, 0, skip],
              [skip, skip, skip]]
    outs = []
    for order in orders:
        feeds = {"image": x[None], **{k: torch.tensor([v]) for k, v in f.items()}, "order": torch.tensor(order).int()}
        out = mil_eval.run_program(model, feeds)[models.OUTPUT][0]
        ref = TORCH_PREPROCESS.color_jitter(x, [o for o in order if o != skip], *f.values(), 0.0)
        torch.testing.assert_close(out, ref, rtol=0, atol=TOL["color_jitter"])
        outs.append(out)
    assert not torch.allclose(outs[0], outs[5], atol=0.05)  # the order matters at these factors, and is kept
    torch.testing.assert_close(outs[-1], x.half().float(), rtol=0, atol=0)  # all rounds skipped: x, fp16-rounded


def test_blur_kernel_and_contrast_mean_stay_fp32_in_the_file(built):
    _, paths = built
    for name in ("gaussian_blur", "color_jitter"):
        model = mil_eval.load_mlpackage(paths[name])
        kept = [(op.op_type, mil_eval._dtype(v)) for op in model.function.operations
                if op.name.startswith(models.FP32_PREFIX) and op.op_type != "const" for v in op.outputs]
        assert kept and all(dt == "fp32" for _, dt in kept), (name, kept)
    kinds = {op.op_type for op in mil_eval.load_mlpackage(paths["gaussian_blur"]).function.operations
             if op.name.startswith(models.FP32_PREFIX)}
    assert {"exp", "reduce_sum"} <= kinds


def test_reflect_index_is_torch_reflect_padding():
    row = torch.arange(7.0)[None, None]
    padded = F.pad(row, (3, 3), mode="reflect")[0, 0]
    np.testing.assert_array_equal(row[0, 0].numpy()[models.reflect_index(7, 3)], padded.numpy())


def test_cache_builds_once_per_key(built, monkeypatch):
    root, paths = built
    assert set(paths) == set(models.MODELS) and len(set(paths.values())) == len(models.MODELS)
    assert all(p.parent == root and p.name.startswith(f"{n}-size{SIZE}-") for n, p in paths.items())
    monkeypatch.setattr(models, "build", lambda *a, **k: pytest.fail("a cached model was rebuilt"))
    assert models.build_cached("grayscale", root, size=SIZE) == paths["grayscale"]
    assert models.model_key("grayscale", size=SIZE) != models.model_key("grayscale", size=SIZE + 1)
    assert not [p for p in root.iterdir() if p.is_dir() and p.name.startswith(".")]  # no temporary folder left


def _fake_build(calls: list, wait: float = 0.0, fail: bool = False):
    """A stand-in for the converter: writes a package-shaped folder (the cache only looks for Manifest.json)."""
    def build(name, path, **dims):
        calls.append(name)
        path.mkdir()
        time.sleep(wait)
        (path / "Manifest.json").write_text("{}")
        if fail:
            raise OSError("disk full")  # after writing, before the rename
        return path

    return build


def test_cache_is_atomic(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(models, "build", _fake_build(calls, fail=True))
    with pytest.raises(OSError):
        models.build_cached("grayscale", tmp_path, size=8)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []  # no half package, no temp
    monkeypatch.setattr(models, "build", _fake_build(calls))
    path = models.build_cached("grayscale", tmp_path, size=8)
    assert (path / "Manifest.json").is_file() and calls == ["grayscale", "grayscale"]


def test_concurrent_builders_build_once(tmp_path, monkeypatch):
    """Four at once (DataLoader workers, DDP ranks): one builds, the others wait for it and get the same path."""
    calls = []
    monkeypatch.setattr(models, "build", _fake_build(calls, wait=0.2))
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: models.build_cached("grayscale", tmp_path, size=8), range(4)))
    assert calls == ["grayscale"] and len(set(paths)) == 1


def test_unknown_model_and_cache_root(tmp_path, monkeypatch):
    with pytest.raises(PipelineError, match="unknown preprocessing model 'sharpen'"):
        models.build("sharpen", tmp_path / "x.mlpackage", size=8)
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path / "preprocess"
    monkeypatch.delenv(models.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.cache_dir() == tmp_path / "xdg" / "ssl-edge-pipeline" / "preprocess"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert models.cache_dir() == Path.home() / ".cache" / "ssl-edge-pipeline" / "preprocess"


@pytest.mark.skipif(not coreml_runtime.coreml_can_predict()[0], reason="Core ML predicts on macOS only")
@pytest.mark.parametrize("units", ["CPU_ONLY", "ALL"])
@pytest.mark.parametrize("name", list(models.MODELS))
def test_model_matches_torch_through_core_ml(built, name, units):
    """The real runtime. On the GPU / Neural Engine convs and matmuls also accumulate in fp16, which the evaluator
    does not model: twice the evaluator's tolerance."""
    _, paths = built
    model = coreml_runtime.coreml_load(paths[name], units)
    g = torch.Generator().manual_seed(list(models.MODELS).index(name))
    for _ in range(DRAWS):
        feeds, ref = _draw(name, g)
        arrays = {k: np.ascontiguousarray(v.numpy().astype(np.int32 if k == "order" else np.float32))
                  for k, v in feeds.items()}
        out = torch.from_numpy(coreml_runtime.coreml_predict_arrays(model, arrays, models.OUTPUT))[0]
        torch.testing.assert_close(out, ref, rtol=0, atol=2 * TOL[name])
