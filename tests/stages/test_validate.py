"""Validate stage on real artifacts: a tiny run goes pretrain -> strip -> trace -> export once (shared by all
workers); the untouched artifacts pass, and each tampered artifact (colour order, normalisation, one conv weight,
the last residual block; Core ML ML Program, NeuralNetwork and ONNX) fails, naming the artifact and the metric."""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from core import coreml_runtime
from core import rundir
from pipeline.cli import main
from core.config import load_config
from core.errors import PipelineError
from stages import validate
from core.rundir import PARITY
from export import parity
from stages.validate import ValidateConfig

TINY = dict(data="synthetic:96", batch_size=16, epochs=1, max_steps=2, val_fraction=0.34)  # 32 val images: enough for top-10
FILES = {"mlpackage": "encoder.mlpackage", "mlmodel": "encoder.mlmodel", "onnx": "encoder.onnx"}


def _quiet(*_):
    pass


def _build_exported_run(root: Path) -> Path:
    from stages import export as convert, strip, trace
    from tests.tiny_run import pretrain_tiny

    run = root / "run"
    pretrain_tiny(run, **TINY)
    strip.run(strip.StripConfig(), run, say=_quiet)
    trace.run(trace.TraceConfig(), run, say=_quiet)
    convert.run(load_config(convert.ExportConfig, None, {}), run, say=_quiet)  # all formats, default precisions
    return run


@pytest.fixture(scope="session")
def exported_run(request, tmp_path_factory) -> Path:
    """Built once per test session, whatever the number of xdist workers: the first takes a file lock and builds,
    the others wait and reuse it. Read-only for tests: each one validates a `_view` of it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if hasattr(request.config, "workerinput") else base
    root = shared / "validate_exported_run"
    with open(shared / "validate_exported_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            _build_exported_run(root)
            (root / "done").touch()
    return root / "run"


def _view(run: Path, dst: Path, formats=("mlpackage", "mlmodel", "onnx"), replace: dict[str, Path] | None = None) -> Path:
    """A run directory of links into `run` listing only `formats`, with `replace[format]` in place of an artifact:
    validate reads and writes here, never in the shared run."""
    (dst / rundir.EXPORT).mkdir(parents=True)
    for name in (rundir.CONFIG, rundir.SPLIT):
        (dst / name).symlink_to(run / name)
    (dst / rundir.EXPORT / "encoder.pt").symlink_to(run / rundir.EXPORT / "encoder.pt")
    sidecar = rundir.load_json(run / rundir.EXPORT / "encoder.json", "sidecar")
    sidecar["artifacts"] = [a for a in sidecar["artifacts"] if a["format"] in formats]
    for a in sidecar["artifacts"]:
        src = (replace or {}).get(a["format"], run / rundir.EXPORT / a["file"])
        (dst / rundir.EXPORT / a["file"]).symlink_to(src.resolve())
    rundir.write_json_atomic(dst / rundir.EXPORT / "encoder.json", sidecar)
    return dst


def _validate(run_dir: Path, **overrides) -> dict:
    return validate.run(load_config(ValidateConfig, None, overrides), run_dir, say=_quiet)


def _parity(run_dir: Path) -> dict:
    return json.loads((run_dir / rundir.VALIDATE / PARITY).read_text())


# ---------------------------------------------------------------- the untouched artifacts pass

def test_exported_artifacts_pass_with_each_runtime_named(exported_run, tmp_path):
    view = _view(exported_run, tmp_path / "run")
    result = _validate(view)
    assert result["passed"] and _parity(view)["passed"]
    rows = {r["artifact"]: r for r in result["rows"]}
    assert rows["encoder.mlpackage"]["runtime"] == "mil-eval" and rows["encoder.mlpackage"]["precision"] == "fp16"
    assert rows["encoder.mlmodel"]["runtime"] == "nn-eval (fp16 activations)"
    assert rows["encoder.onnx"]["runtime"] == "onnxruntime (CPU)" and rows["encoder.onnx"]["precision"] == "fp32"
    assert rows["encoder.onnx"]["max_abs"] < 1e-4
    for r in rows.values():
        assert r["images"] == 32 and r["top_k"] == 10 and r["topk_agreement"] >= 0.95
        assert r["worst_rel_l2"] < 1e-2
    assert result["images"]["val"] == 32 and "macOS" in result["coreml_runtime"]


def test_cli_prints_the_table_and_passes(exported_run, tmp_path):
    view = _view(exported_run, tmp_path / "run", formats=("onnx",))
    res = CliRunner().invoke(main, ["validate", "--run", str(view), "--max-images", "12"])
    assert res.exit_code == 0, res.output
    assert "worst cos" in res.output and "top-10 agree" in res.output and "PASS" in res.output
    assert _parity(view)["images"]["count"] == 12


def test_the_table_keeps_its_columns_for_the_longest_file_name():
    row = dict(runtime="mil-eval", precision="comp", worst_cosine=0.99, mean_cosine=0.999, worst_rel_l2=0.05,
               max_abs=0.01, topk_agreement=0.97, top_k=10, knn_drop=0.0, probe_drop=0.0, passed=True, failures=[])
    result = dict(rows=[{**row, "artifact": "encoder.mlpackage"}, {**row, "artifact": "encoder.palettize-6.mlpackage"}],
                  images=dict(count=24), image_size=32, reference="PyTorch fp32", coreml_runtime="not used")
    head, *rows, _ = validate.format_table(result).splitlines()
    assert head.index("runtime") == rows[0].index("mil-eval") == rows[1].index("mil-eval")
    assert head.index("result") == rows[0].index("PASS") == rows[1].index("PASS")


def test_fp32_core_ml_passes_the_strict_gates(exported_run, tmp_path):
    """An fp32 ML Program is held to max abs 1e-4 and cosine 0.99999: the evaluator must be that exact."""
    from stages import export as convert

    view = tmp_path / "run"
    (view / rundir.EXPORT).mkdir(parents=True)
    for name in (rundir.CONFIG, rundir.SPLIT):
        (view / name).symlink_to(exported_run / name)
    for name in ("encoder.pt", "encoder.pt2", "trace.json"):
        (view / rundir.EXPORT / name).symlink_to(exported_run / rundir.EXPORT / name)
    convert.run(load_config(convert.ExportConfig, None, {"to": "coreml", "coreml_format": "mlpackage",
                                                          "precision": "fp32"}), view, say=_quiet)
    row = _validate(view, max_images=16)["rows"][0]
    assert row["precision"] == "fp32" and row["passed"], row
    assert row["max_abs"] < 1e-5 and row["worst_cosine"] > 0.999999


# ---------------------------------------------------------------- tampering: every change must fail

def _tamper_mlpackage(src: Path, dst: Path, how: str) -> Path:
    """Edit the program at the spec level; the weights blob is shared (changed weights become immediate values)."""
    import coremltools as ct
    from coremltools import proto

    from export import mil_eval

    (dst / "Data" / "com.apple.CoreML").mkdir(parents=True)
    shutil.copy(src / "Manifest.json", dst / "Manifest.json")
    (dst / "Data" / "com.apple.CoreML" / "weights").symlink_to((src / "Data" / "com.apple.CoreML" / "weights").resolve())
    spec = ct.utils.load_spec(str(src))
    func = spec.mlProgram.functions["main"]
    ops = func.block_specializations[func.opset].operations
    producer = {o.outputs[0].name: o for o in ops}

    def arg(op, name):
        return op.inputs[name].arguments[0].name

    def set_const(name, value):
        op = producer[name]
        old = op.attributes["val"]
        new = proto.MIL_pb2.Value()
        new.type.CopyFrom(old.type)
        if old.type.tensorType.dataType == proto.MIL_pb2.DataType.Value("FLOAT16"):
            new.immediateValue.tensor.bytes.values = np.asarray(value, np.float16).tobytes()
        else:
            new.immediateValue.tensor.floats.values.extend(np.asarray(value, np.float32).ravel().tolist())
        op.attributes["val"].CopyFrom(new)

    if how == "rgb_bgr":
        spec.description.input[0].type.imageType.colorSpace = 30  # BGR
    elif how == "no_normalisation":
        first = next(o for o in ops if o.type not in ("const", "cast"))  # x * scale + shift, folded or not
        if first.type == "batch_norm":
            set_const(arg(first, "gamma"), np.ones(3))
            set_const(arg(first, "beta"), np.zeros(3))
        else:
            assert first.type == "mul", first.type
            add = next(o for o in ops if o.type == "add" and first.outputs[0].name in (arg(o, "x"), arg(o, "y")))
            for op, value in ((first, 1.0), (add, 0.0)):
                const = next(arg(op, k) for k in ("x", "y") if producer.get(arg(op, k)) is not None
                             and producer[arg(op, k)].type == "const")
                set_const(const, np.full(3, value))
    elif how == "conv_weight_x1.5":
        conv = next(o for o in ops if o.type == "conv")
        consts = mil_eval.load_mlpackage(src).consts
        set_const(arg(conv, "weight"), consts[arg(conv, "weight")].numpy() * 1.5)
    elif how == "cut_last_block":
        # block outputs: the relu after each residual add; the pool's input is rewired past the last block
        outs = [o.outputs[0].name for o in ops if o.type == "relu" and producer[arg(o, "x")].type == "add"]
        last, previous = outs[-1], outs[-2]
        for o in ops:
            for binding in o.inputs.values():
                for a in binding.arguments:
                    if a.name == last:
                        a.name = previous
    elif how == "unsupported_op":
        next(o for o in ops if o.type == "relu").type = "softplus"  # a valid MIL op the evaluator does not have
    else:
        raise ValueError(how)
    (dst / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(spec.SerializeToString())
    return dst


def _tamper_mlmodel(src: Path, dst: Path, how: str) -> Path:
    import coremltools as ct

    spec = ct.utils.load_spec(str(src))
    if how == "rgb_bgr":
        spec.description.input[0].type.imageType.colorSpace = 30  # BGR
    elif how == "conv_weight_x1.5":
        conv = next(layer for layer in spec.neuralNetwork.layers if layer.WhichOneof("layer") == "convolution")
        w = conv.convolution.weights
        w.float16Value = (np.frombuffer(w.float16Value, np.float16).astype(np.float32) * 1.5).astype(np.float16).tobytes()
    else:
        raise ValueError(how)
    dst.write_bytes(spec.SerializeToString())
    return dst


def _tamper_onnx(src: Path, dst: Path, how: str) -> Path:
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    if how == "rgb_bgr":
        name = graph.input[0].name
        for node in graph.node:
            for i, x in enumerate(node.input):
                if x == name:
                    node.input[i] = "image_bgr"
        graph.initializer.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), "bgr_order"))
        graph.node.insert(0, helper.make_node("Gather", [name, "bgr_order"], ["image_bgr"], axis=1))
    elif how == "conv_weight_x1.5":
        conv = next(n for n in graph.node if n.op_type == "Conv")
        init = next(i for i in graph.initializer if i.name == conv.input[1])
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(1.5), init.name))
    else:
        raise ValueError(how)
    onnx.save_model(model, str(dst))
    return dst


TAMPERS = [("mlpackage", "rgb_bgr"), ("mlpackage", "no_normalisation"), ("mlpackage", "conv_weight_x1.5"),
           ("mlpackage", "cut_last_block"), ("mlmodel", "rgb_bgr"), ("mlmodel", "conv_weight_x1.5"),
           ("onnx", "rgb_bgr"), ("onnx", "conv_weight_x1.5")]
TAMPER = {"mlpackage": _tamper_mlpackage, "mlmodel": _tamper_mlmodel, "onnx": _tamper_onnx}


@pytest.mark.parametrize("fmt,how", TAMPERS)
def test_tampered_artifact_fails_naming_artifact_and_metric(exported_run, tmp_path, fmt, how):
    src = exported_run / rundir.EXPORT / FILES[fmt]
    bad = TAMPER[fmt](src, tmp_path / f"tampered-{FILES[fmt]}", how)
    view = _view(exported_run, tmp_path / "run", formats=(fmt,), replace={fmt: bad})
    with pytest.raises(PipelineError) as err:
        _validate(view, max_images=24)
    msg = str(err.value)
    metric = ("worst_rel_l2", "top") if fmt != "onnx" else ("max_abs", "worst_cosine")
    assert msg.startswith("parity gate failed: ") and FILES[fmt] in msg and any(m in msg for m in metric), msg
    assert parity.UNRESOLVED not in msg  # the reference's order survives fp16: the artifact is to blame
    assert validate.COMPRESSED_WHY not in msg  # no compressed file failed
    report = _parity(view)
    assert not report["passed"] and not report["rows"][0]["passed"] and report["rows"][0]["failures"]


def _compressed_row(artifact: str, metrics: dict, cfg: ValidateConfig) -> dict:
    """A failed compressed row as validate makes it: the gates' own phrases for these metrics (others passing)."""
    full = {"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, **metrics}
    return {"artifact": artifact, "runtime": "reference", "precision": "compressed",
            "failures": parity.gate_failures(full, "compressed", **cfg.gates())}


def test_a_drop_failed_on_too_few_labelled_images_says_so_once_with_both_ways_out():
    """Two compressed files fail a drop on 8 labelled val images: the message names both, then says once that
    one image exceeds the bounds at this n, how many resolve them, and what to do, and does not call the
    compression too strong, which one image does not show; a file that fails another gate as well gets that advice
    too; a drop failed on enough images gets only the compression advice."""
    cfg = load_config(ValidateConfig, None, {})
    few = [_compressed_row(f"encoder.{c}.mlpackage", {"labelled_images": 8, "knn_drop": 0.125}, cfg)
           for c in ("palettize-4", "prune-50")]
    msg = validate.failure_message(few, cfg, 8)
    assert msg.count("knn_drop 0.125 > 0.03") == 2 and msg.count(validate.few_labelled_why(cfg, 8)) == 1
    assert "need 34 or more" in msg and "--val-fraction" in msg and "--compressed-max-knn-drop 1" in msg
    assert msg.endswith(validate.few_labelled_why(cfg, 8)) and validate.COMPRESSED_WHY not in msg
    far = _compressed_row("encoder.prune-50.mlpackage", {"labelled_images": 8, "knn_drop": 0.125,
                                                         "worst_cosine": 0.5}, cfg)
    msg = validate.failure_message([few[0], far], cfg, 8)
    assert msg.count(validate.few_labelled_why(cfg, 8)) == 1 and msg.endswith(validate.COMPRESSED_WHY)
    looser = load_config(ValidateConfig, None, {"compressed_max_knn_drop": 0.2, "compressed_max_probe_drop": 0.1})
    assert "need 10 or more" in validate.few_labelled_why(looser, 8)  # the stricter of the two bounds sets n
    enough = [_compressed_row("encoder.palettize-4.mlpackage", {"labelled_images": 200, "knn_drop": 0.1}, cfg)]
    msg = validate.failure_message(enough, cfg, 200)
    assert "labelled val images" not in msg and msg.endswith(validate.COMPRESSED_WHY)


def test_an_op_the_evaluator_lacks_fails_that_artifact_by_name_and_the_rest_is_still_measured(exported_run, tmp_path):
    src = exported_run / rundir.EXPORT / "encoder.mlpackage"
    bad = _tamper_mlpackage(src, tmp_path / "bad.mlpackage", "unsupported_op")
    view = _view(exported_run, tmp_path / "run", formats=("mlpackage", "onnx"), replace={"mlpackage": bad})
    with pytest.raises(PipelineError, match=r"encoder.mlpackage .*op `softplus`.*not supported"):
        _validate(view, max_images=8)
    rows = _parity(view)["rows"]
    assert [(r["artifact"], r["passed"]) for r in rows] == [("encoder.mlpackage", False), ("encoder.onnx", True)]


def test_cli_exits_2_with_one_line_naming_the_failure(exported_run, tmp_path):
    bad = _tamper_onnx(exported_run / rundir.EXPORT / "encoder.onnx", tmp_path / "bad.onnx", "rgb_bgr")
    view = _view(exported_run, tmp_path / "run", formats=("onnx",), replace={"onnx": bad})
    res = CliRunner().invoke(main, ["validate", "--run", str(view), "--max-images", "12"])
    assert res.exit_code == 2
    errors = [line for line in res.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "encoder.onnx (onnxruntime (CPU)): max_abs" in errors[0], res.output
    assert "FAIL" in res.output  # the table is still printed


def test_artifact_from_another_encoder_fails(exported_run, tmp_path):
    view = _view(exported_run, tmp_path / "run", formats=("onnx",))
    path = view / rundir.EXPORT / "encoder.json"
    sidecar = json.loads(path.read_text())
    sidecar["artifacts"][0]["encoder_sha256"] = "0" * 64
    path.write_text(json.dumps(sidecar))
    with pytest.raises(PipelineError, match="encoder.onnx .*made from another encoder.pt"):
        _validate(view, max_images=8)


# ---------------------------------------------------------------- images, inputs, errors

def test_extra_image_folder_is_added_and_unreadable_files_skipped(exported_run, tmp_path):
    folder = tmp_path / "photos"
    (folder / "sub").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i, size in enumerate([(40, 30), (16, 16), (20, 50)]):
        Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(folder / ("sub" if i else "") / f"{i}.png")
    (folder / "notes.txt").write_text("not an image")
    view = _view(exported_run, tmp_path / "run", formats=("onnx",))
    said = []
    result = validate.run(load_config(ValidateConfig, None, {"images": str(folder), "max_images": 5}), view, say=said.append)
    assert result["images"] == {**result["images"], "count": 8, "val": 5, "extra_folder": str(folder)}
    assert sum(s.endswith(".png") for s in result["images"]["sources"]) == 3
    assert any("skipped 1 unreadable" in s for s in said)


@pytest.mark.parametrize("overrides,needle", [
    ({"max_images": 0}, "--max-images must be >= 1"),
    ({"max_images": 1}, "only 1 image(s)"),
    ({"images": "/no/such/folder"}, "not a directory"),
])
def test_bad_input_is_a_one_line_error(exported_run, tmp_path, overrides, needle):
    view = _view(exported_run, tmp_path / "run", formats=("onnx",))
    with pytest.raises(PipelineError) as err:
        _validate(view, **overrides)
    assert needle in str(err.value)


def test_missing_export_and_default_run(tmp_path, monkeypatch):
    (tmp_path / "run" / rundir.EXPORT).mkdir(parents=True)
    res = CliRunner().invoke(main, ["validate", "--run", str(tmp_path / "run")])
    assert res.exit_code == 2 and "no checkpoint" in res.output and "`pipeline pretrain --out" in res.output
    (tmp_path / "run" / rundir.CHECKPOINTS).mkdir()
    (tmp_path / "run" / rundir.LAST_CHECKPOINT).write_bytes(b"")
    res = CliRunner().invoke(main, ["validate", "--run", str(tmp_path / "run")])
    assert res.exit_code == 2 and "nothing exported yet" in res.output and "`pipeline export --run" in res.output
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["validate"])
    assert res.exit_code == 2 and "runs/default does not exist" in res.output


# ---------------------------------------------------------------- the real Core ML runtime (macOS), mocked here

def test_real_runtime_rows_on_macos(exported_run, tmp_path, monkeypatch):
    """Where Core ML can predict, each Core ML artifact also gets CPU_ONLY and ALL rows; a NeuralNetwork on ALL is
    gated as fp16 (the GPU/Neural Engine compute it in fp16 whatever its weights)."""
    from export import mil_eval, nn_eval

    calls = []

    def fake_predict(path, images, units, output):
        calls.append((Path(path).name, units))
        if str(path).endswith(".mlpackage"):
            return mil_eval.predict_images(mil_eval.load_mlpackage(path), images, output)
        return nn_eval.predict_images(nn_eval.load_mlmodel(path), images, output, "fp16")

    monkeypatch.setattr(coreml_runtime, "coreml_can_predict", lambda: (True, ""))
    monkeypatch.setattr(coreml_runtime, "coreml_predict", fake_predict)
    view = _view(exported_run, tmp_path / "run", formats=("mlpackage", "mlmodel"))
    result = _validate(view, max_images=12)
    got = [(r["artifact"], r["runtime"], r["precision"]) for r in result["rows"]]
    assert got == [("encoder.mlpackage", "mil-eval", "fp16"), ("encoder.mlpackage", "coreml CPU_ONLY", "fp16"),
                   ("encoder.mlpackage", "coreml ALL", "fp16"), ("encoder.mlmodel", "nn-eval (fp16 activations)", "fp16"),
                   ("encoder.mlmodel", "coreml CPU_ONLY", "fp16"), ("encoder.mlmodel", "coreml ALL", "fp16")]
    assert sorted(calls) == sorted([(f, u) for f in ("encoder.mlpackage", "encoder.mlmodel") for u in ("CPU_ONLY", "ALL")])
    assert result["passed"] and result["coreml_runtime"] == "used"
    assert validate.gate_precision("mlmodel", "fp32", "fp32", "coreml ALL") == "fp16"
    assert validate.gate_precision("mlpackage", "fp16", "fp32", "mil-eval") == "fp32"  # the file computes in fp32
    assert validate.gate_precision("mlpackage", "fp32", "fp16", "mil-eval") == "fp32"  # the sidecar promised fp32


def test_coreml_predict_hands_core_ml_rgb_pictures(monkeypatch):
    """The macOS path, with MLModel mocked: compute units passed through, one RGB PIL image per prediction."""
    import coremltools as ct

    seen = {}

    class FakeModel:
        def __init__(self, path, compute_units):
            seen["units"] = compute_units
            seen["images"] = []

        def get_spec(self):
            spec = ct.proto.Model_pb2.Model()
            inp = spec.description.input.add()
            inp.name = "image"
            inp.type.imageType.width = inp.type.imageType.height = 4
            return spec

        def predict(self, feeds):
            img = feeds["image"]
            seen["images"].append(img)
            return {"embedding": np.asarray(img, np.float32).mean(axis=(0, 1))[None]}

    monkeypatch.setattr(coreml_runtime, "coreml_can_predict", lambda: (True, ""))
    monkeypatch.setattr(ct.models, "MLModel", FakeModel)
    images = torch.randint(0, 256, (3, 3, 4, 4), dtype=torch.uint8)
    out = coreml_runtime.coreml_predict("m.mlpackage", images, "CPU_ONLY", "embedding")
    assert seen["units"] == ct.ComputeUnit.CPU_ONLY and len(seen["images"]) == 3
    assert all(im.mode == "RGB" and im.size == (4, 4) for im in seen["images"])
    np.testing.assert_array_equal(np.asarray(seen["images"][1]).transpose(2, 0, 1), images[1].numpy())
    np.testing.assert_allclose(out, images.float().mean(dim=(2, 3)).numpy(), rtol=1e-6)
    with pytest.raises(PipelineError, match="compute units"):
        coreml_runtime.coreml_predict("m.mlpackage", images, "GPU_ONLY", "embedding")


def test_coreml_predict_off_macos_says_why(monkeypatch):
    monkeypatch.setattr(coreml_runtime.platform, "system", lambda: "Linux")
    ok, why = coreml_runtime.coreml_can_predict()
    assert not ok and "only on macOS" in why
    with pytest.raises(PipelineError, match="only on macOS"):
        coreml_runtime.coreml_predict("m.mlpackage", np.zeros((1, 3, 4, 4)), "ALL", "embedding")
