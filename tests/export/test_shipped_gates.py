"""validate's gates as shipped (`ValidateConfig`'s defaults, what `pipeline validate` runs with): a tamper just
beyond each gate fails on exactly that metric and the same tamper just within passes.

test_parity.py checks the gate logic with its own copy of the thresholds and the stage tests use gross tampers
(rel-L2 0.35-0.83), so a gate loosened 10-100x passed them all. Here every tamper sits within a factor 1.5-3 of its
bound, and each case first checks that the metric really landed where it was aimed.
"""

import numpy as np
import pytest

from export import parity
from core.config import load_config
from stages import validate


def shipped_gates() -> dict[str, float]:
    return load_config(validate.ValidateConfig).gates()


def _failures(ref, out, precision):
    metrics = parity.compare(ref, out, load_config(validate.ValidateConfig).top_k)
    return metrics, parity.gate_failures(metrics, precision, **shipped_gates())


def _unit_rows(rng, n, d):
    x = rng.standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)  # the encoder's features are L2-normalised


def test_the_shipped_gates_are_the_documented_ones():
    assert shipped_gates() == {"fp32_max_abs": 1e-4, "fp32_min_cosine": 0.99999, "fp16_max_rel_l2": 1e-2,
                               "fp16_min_topk": 0.95, "compressed_min_topk": 0.8, "compressed_max_knn_drop": 0.03,
                               "compressed_max_probe_drop": 0.03, "compressed_min_cosine": 0.9}
    assert load_config(validate.ValidateConfig).top_k == 10


@pytest.mark.parametrize("error,passes", [(1.5e-4, False), (0.6e-4, True)])
def test_fp32_max_abs_gate(error, passes):
    ref = _unit_rows(np.random.default_rng(0), 16, 512)
    out = ref.copy()
    out[3, 7] += error  # one value off: cosine stays ~1 - 1e-8, only max abs can see it
    metrics, fails = _failures(ref, out, "fp32")
    assert metrics["max_abs"] == pytest.approx(error, rel=1e-6)
    assert metrics["worst_cosine"] > 1 - 1e-7
    assert fails == ([] if passes else [fails[0]]) and all(f.startswith("max_abs") for f in fails)


@pytest.mark.parametrize("step,passes", [(9e-5, False), (3e-5, True)])
def test_fp32_cosine_gate(step, passes):
    """Every value of one image moved by +-step (within max abs 1e-4): over 8192 values the direction drifts by
    1 - cos ~ 8192 step^2 / 2, i.e. 3.3e-5 (beyond 1e-5) or 3.7e-6 (within)."""
    rng = np.random.default_rng(1)
    ref = _unit_rows(rng, 8, 8192)
    out = ref.copy()
    out[5] += step * rng.choice([-1.0, 1.0], size=8192)
    metrics, fails = _failures(ref, out, "fp32")
    assert metrics["max_abs"] <= 1e-4 + 1e-12
    if passes:
        assert 0.99999 < metrics["worst_cosine"] < 0.999999 and fails == []
    else:
        assert 0.99995 < metrics["worst_cosine"] < 0.99999
        assert len(fails) == 1 and fails[0].startswith("worst_cosine")


@pytest.mark.parametrize("scale,passes", [(1.015, False), (1.006, True)])
def test_fp16_rel_l2_gate(scale, passes):
    """One image's features scaled: relative L2 = scale - 1, directions (and so every neighbour) unchanged."""
    ref = _unit_rows(np.random.default_rng(2), 40, 64)
    out = ref.copy()
    out[11] *= scale
    metrics, fails = _failures(ref, out, "fp16")
    assert metrics["worst_rel_l2"] == pytest.approx(scale - 1, rel=1e-6)
    assert metrics["topk_agreement"] == 1.0
    assert fails == ([] if passes else [fails[0]]) and all(f.startswith("worst_rel_l2") for f in fails)


@pytest.mark.parametrize("eps,passes", [(5e-3, False), (4e-3, True)])
def test_fp16_topk_gate(eps, passes):
    """Near-tied neighbours (40 features around one direction) with noise of relative size eps (within the
    rel-L2 gate): a few neighbour lists change, and top-10 agreement lands just below or just above 0.95."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal(64)
    ref = base + 0.05 * rng.standard_normal((40, 64))
    ref /= np.linalg.norm(ref, axis=1, keepdims=True)
    noise = rng.standard_normal((40, 64))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    metrics, fails = _failures(ref, ref + eps * noise, "fp16")
    assert metrics["worst_rel_l2"] == pytest.approx(eps, rel=1e-6)
    if passes:
        assert 0.95 <= metrics["topk_agreement"] < 0.97 and fails == []
    else:
        assert 0.93 < metrics["topk_agreement"] < 0.95
        assert len(fails) == 1 and fails[0].startswith("top10_agreement")


def test_the_cli_runs_with_the_shipped_gates(tmp_path, monkeypatch):
    """`pipeline validate` without gate flags hands the stage exactly these gates."""
    from tests.cli_helpers import cli

    from pipeline import cli as cli_module

    seen = {}
    monkeypatch.setattr(cli_module, "missing_input", lambda name, run_dir: None)  # an empty run: only the gates matter
    monkeypatch.setattr(validate, "run", lambda cfg, run_dir, say: seen.update(cfg.gates()))
    res = cli("validate", "--run", tmp_path)
    assert res.exit_code == 0, res.output
    assert seen == shipped_gates()


@pytest.mark.parametrize("fmt,declared,actual,runtime,expected", [
    ("mlmodel", "fp32", "fp32", "coreml ALL", "fp16"),  # the GPU/Neural Engine computes NeuralNetworks in fp16
    ("mlmodel", "fp32", "fp32", "coreml CPU_ONLY", "fp32"),
    ("mlmodel", "fp16", None, "nn-eval (fp16 activations)", "fp16"),
    ("mlpackage", "fp16", "fp32", "mil-eval", "fp32"),  # the file computes in fp32: no fp16 slack
    ("mlpackage", "fp32", "fp16", "mil-eval", "fp32"),  # the sidecar promised fp32
    ("mlpackage", "fp16", "fp16", "mil-eval", "fp16"),
    ("onnx", "fp32", None, "onnxruntime (CPU)", "fp32"),
    ("onnx", "fp16", None, "onnxruntime (CPU)", "fp16"),
])
def test_which_gates_an_artifact_gets(fmt, declared, actual, runtime, expected):
    assert validate.gate_precision(fmt, declared, actual, runtime) == expected


@pytest.mark.parametrize("entry,actual,runtime,expected", [
    ({"format": "mlpackage", "precision": "fp16", "compression": "int8"}, "fp32", "mil-eval", "compressed"),
    ({"format": "mlmodel", "precision": "fp16", "compression": "palettize-4"}, None, "coreml CPU_ONLY", "compressed"),
    ({"format": "mlpackage", "precision": "fp16", "compression": "fp16"}, "fp32", "mil-eval", "fp32"),  # uncompressed
    ({"format": "mlpackage", "precision": "fp16"}, "fp16", "mil-eval", "fp16"),  # a sidecar from before compression
    ({"format": "onnx"}, None, "onnxruntime (CPU)", "fp32"),  # no precision said: fp32's
    ({"format": "mlmodel", "precision": "fp32", "compression": "fp16"}, "fp32", "coreml ALL", "fp16"),  # GPU / ANE
])
def test_compressed_weights_are_gated_on_use_whatever_their_precision(entry, actual, runtime, expected):
    assert validate.gate_kind(entry, actual, runtime) == expected


COMPRESSED_BOUNDS = ("compressed_min_topk", "compressed_max_knn_drop", "compressed_max_probe_drop", "compressed_min_cosine")


@pytest.mark.parametrize("over,needle", [
    ({"max_images": 0}, "--max-images must be >= 1"),
    ({"max_train_images": 0}, "--max-train-images must be >= 1, got 0"),
    ({"top_k": 0}, "--top-k must be >= 1"),
    ({"fp32_max_abs": -1e-9}, "--fp32-max-abs and --fp16-max-rel-l2 must be >= 0"),
    ({"fp16_max_rel_l2": -1e-9}, "--fp32-max-abs and --fp16-max-rel-l2 must be >= 0"),
    ({"fp32_min_cosine": 1.0001}, "--fp32-min-cosine and --fp16-min-topk must be in [0, 1]"),
    ({"fp32_min_cosine": -0.1}, "--fp32-min-cosine and --fp16-min-topk must be in [0, 1]"),
    ({"fp16_min_topk": 1.5}, "--fp32-min-cosine and --fp16-min-topk must be in [0, 1]"),
    ({"fp16_min_topk": -0.5}, "--fp32-min-cosine and --fp16-min-topk must be in [0, 1]"),
    *[({name: bad}, f"--{name.replace('_', '-')} must be in [0, 1], got {bad}") for bad in (-0.01, 1.01)
      for name in COMPRESSED_BOUNDS],
])
def test_impossible_gates_are_refused(over, needle):
    from core.errors import PipelineError

    with pytest.raises(PipelineError) as err:
        validate.check(load_config(validate.ValidateConfig, None, over))
    assert str(err.value).startswith(needle)


@pytest.mark.parametrize("over", [{}, {"max_images": 1, "max_train_images": 1, "top_k": 1},
                                  {"fp32_max_abs": 0.0, "fp16_max_rel_l2": 0.0},
                                  {"fp32_min_cosine": 0.0, "fp16_min_topk": 0.0},
                                  {"fp32_min_cosine": 1.0, "fp16_min_topk": 1.0},
                                  dict.fromkeys(COMPRESSED_BOUNDS, 0.0), dict.fromkeys(COMPRESSED_BOUNDS, 1.0)])
def test_gates_on_their_bounds_are_accepted(over):
    validate.check(load_config(validate.ValidateConfig, None, over))


def test_an_unknown_precision_is_a_programming_error_naming_it():
    with pytest.raises(ValueError, match=r"precision must be one of \('fp32', 'fp16', 'compressed'\), got 'int8'"):
        parity.gate_failures({"max_abs": 0.0}, "int8", **shipped_gates())


def test_a_metric_exactly_on_its_gate_passes():
    on = {"max_abs": 1e-4, "worst_cosine": 0.99999, "worst_rel_l2": 1e-2, "topk_agreement": 0.95, "top_k": 10}
    assert parity.gate_failures(on, "fp32", **shipped_gates()) == []
    assert parity.gate_failures(on, "fp16", **shipped_gates()) == []


def test_fp16_needs_two_images_to_rank():
    one = parity.compare(np.ones((1, 4)), np.ones((1, 4)))
    assert parity.gate_failures(one, "fp16", **shipped_gates()) == ["top-k agreement needs at least 2 images"]



@pytest.mark.parametrize("beyond", [False, True])
def test_compressed_probe_drop_gate(beyond):
    """Of 120 val images the artifact gives the last images (as many as the shipped bound allows, or one more) the
    features of the next image, of another class; its train features are intact. Its own probe misses exactly those:
    a drop of n / 120, just within or just beyond the bound, and only the probe gate is fed a moved value."""
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((4, 16)) * 4
    ty, vy = np.arange(240) % 4, np.arange(120) % 4
    train, val = (_unit(centres[y] + 0.3 * rng.standard_normal((len(y), 16))) for y in (ty, vy))
    bound = shipped_gates()["compressed_max_probe_drop"]
    n = int(bound * 120 + 1e-9) + beyond
    out_val = val.copy()
    out_val[120 - n:] = val[[(i + 1) % 120 for i in range(120 - n, 120)]]
    reference = parity.reference_probe(train, ty, val, vy, 0.2, seed=0)
    m = parity.probe_metrics(reference, train, ty, out_val, vy)
    assert reference["top1"] == 1.0 and m["probe_drop"] == pytest.approx(n / 120)
    fails = parity.gate_failures({"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, "knn_drop": 0.0, **m},
                                 "compressed", **shipped_gates())
    assert fails == ([f"probe_drop {m['probe_drop']:.3f} > {bound:g}"] if beyond else [])


def _unit(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)
