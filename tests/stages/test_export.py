"""Export stage: the format table refuses impossible requests by name, an export is all-or-nothing (a failed
conversion leaves the previous artifacts and sidecar as they were, and no partial file), the sidecar vouches only
for artifacts of the current encoder.pt, and the whole chain strip -> trace -> export works for ResNet-50."""

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from export.formats import FORMATS, for_backbone, select_formats
from train.backbones import BACKBONES
from export.metadata import linear_eval_scores
from core import rundir
from core.errors import PipelineError
from stages import export as convert
from stages.export import SIDECAR, artifact_digest
from stages.strip import StripConfig, encoder_path
from stages.strip import run as strip
from stages.trace import file_sha256
from tests.cli_helpers import assert_one_line_error as _one_line_error
from tests.cli_helpers import cli as _cli
from tests.tiny_run import pretrain_tiny

NO_OPTIONS = {"deployment_target": None, "opset": None, "compress": None}


def test_format_table_defaults_and_impossible_combinations():
    plan = select_formats("all", None, None, NO_OPTIONS)
    assert [(f.file, p, o) for f, p, o in plan] == [
        ("encoder.mlpackage", "fp16", {"deployment_target": "iOS16", "compress": "fp16"}),
        ("encoder.mlmodel", "fp16", {"compress": "fp16"}),
        ("encoder.onnx", "fp32", {"opset": 18})]
    plan = select_formats("coreml", "mlpackage", "fp32", {**NO_OPTIONS, "deployment_target": "iOS17"})
    assert [(f.key, p, o) for f, p, o in plan] == [("mlpackage", "fp32", {"deployment_target": "iOS17", "compress": "fp16"})]
    assert [f.key for f, _, _ in select_formats("coreml", None, None, NO_OPTIONS)] == ["mlpackage", "mlmodel"]

    refused = [
        (("onnx", None, "fp16", NO_OPTIONS), "--precision fp16: onnx is written in fp32 only"),
        (("all", None, "fp16", NO_OPTIONS), "onnx is written in fp32 only"),
        (("onnx", "mlpackage", None, NO_OPTIONS), "--coreml-format mlpackage needs --to coreml or --to all"),
        (("onnx", None, None, {**NO_OPTIONS, "deployment_target": "iOS17"}), "--deployment-target applies to mlpackage"),
        (("coreml", "mlmodel", None, {**NO_OPTIONS, "deployment_target": "iOS17"}), "--deployment-target applies to mlpackage"),
        (("coreml", None, None, {**NO_OPTIONS, "opset": 18}), "--opset applies to onnx"),
        (("onnx", None, None, {**NO_OPTIONS, "opset": 17}), "--opset 17: use one of 18, 19, 20, 21"),
        (("tflite", None, None, NO_OPTIONS), "--to 'tflite': unknown format"),
        (("all", None, None, {**NO_OPTIONS, "quantize": 8}), "unknown export option --quantize"),
    ]
    for args, message in refused:
        with pytest.raises(PipelineError, match=message.replace("(", r"\(")):
            select_formats(*args)


def test_a_format_with_one_precision_for_every_op_cannot_hold_a_backbone_whose_stem_stays_fp32():
    """EfficientNet-B0's stem stays fp32 in fp16 Core ML (its registry row): an .mlmodel cannot do that, so the
    default export leaves it out with a note and a request naming it is refused in one line."""
    notes: list[str] = []
    plan, left_out = for_backbone(select_formats("all", None, None, NO_OPTIONS), "efficientnet_b0", None, notes.append)
    assert [f.key for f, _, _ in plan] == ["mlpackage", "onnx"] and left_out == {"mlmodel"}
    assert notes == [notes[0]] and "encoder.mlmodel cannot hold efficientnet_b0" in notes[0]
    with pytest.raises(PipelineError, match="use --coreml-format mlpackage"):
        for_backbone(select_formats("coreml", "mlmodel", None, NO_OPTIONS), "efficientnet_b0", "mlmodel", notes.append)
    whole = select_formats("all", None, None, NO_OPTIONS)
    assert for_backbone(whole, "mobilenet_v3_small", None, notes.append) == (whole, set()) and len(notes) == 1
    assert [name for name, b in BACKBONES.items() if b.fp32_stem] == ["efficientnet_b0"]
    assert not FORMATS["mlmodel"].per_op_precision and FORMATS["mlpackage"].per_op_precision


def test_cli_refuses_bad_requests_before_any_work(tmp_path):
    empty = tmp_path / "run"
    empty.mkdir()
    _one_line_error(_cli("export", "--run", empty, "--to", "onnx", "--precision", "fp16"), "fp32 only")
    _one_line_error(_cli("export", "--run", empty, "--to", "onnx", "--deployment-target", "iOS17"), "applies to mlpackage")
    _one_line_error(_cli("export", "--run", empty), "no checkpoint", "pipeline pretrain")  # strip runs first
    _one_line_error(_cli("export", "--run", tmp_path / "missing"), "does not exist")
    (tmp_path / "bad.yaml").write_text("to: onnx\nfrobnicate: 1\n")
    _one_line_error(_cli("export", "--run", empty, "--config", tmp_path / "bad.yaml"), "unknown key `frobnicate`")
    for args in (["--to", "tflite"], ["--coreml-format", "mlmodelc"], ["--frobnicate"]):  # click's own usage errors
        _one_line_error(_cli("export", "--run", empty, *args), "See `pipeline export --help`")
    assert list(empty.iterdir()) == []


def test_linear_eval_top1_only_when_it_measured_this_checkpoint(tmp_path):
    assert linear_eval_scores(tmp_path, 5, say=lambda *_: None) == {}
    rundir.write_json_atomic(tmp_path / rundir.EVAL / "linear.json", {"top1": 0.75, "knn_top1": 0.5, "top5": None,
                                                                       "checkpoint": {"step": 5}})
    assert linear_eval_scores(tmp_path, 5, say=lambda *_: None) == {"top1": 0.75, "knn_top1": 0.5}
    said = []
    assert linear_eval_scores(tmp_path, 6, say=said.append) == {}
    assert "measured step 5" in said[0]
    assert linear_eval_scores(tmp_path, 5, say=said.append, checkpoint_id="0123abcd") == {}  # a retrained step 5
    assert "measured another checkpoint of step 5" in said[1]
    (tmp_path / rundir.EVAL / "linear.json").write_text("{trunc")
    with pytest.raises(PipelineError, match="not valid JSON"):
        linear_eval_scores(tmp_path, 5)


def _fake_writer(kind: str, fail: bool = False):
    """Writes a stand-in artifact (a directory for .mlpackage); `fail` writes half of it, then fails."""

    def write(program, path: Path, meta, precision, options):
        if kind == "dir":
            path.mkdir()
            (path / "Manifest.json").write_text(json.dumps({"encoder": meta["encoder_sha256"]}))
        else:
            path.write_text(f"{meta['encoder_sha256']} {precision}")
        if fail:
            raise PipelineError("Core ML conversion failed (simulated); nothing was written")
        return {"precision": precision}

    return write


def _use_fakes(monkeypatch, fail: str | None = None):
    for key, kind in (("mlpackage", "dir"), ("mlmodel", "file"), ("onnx", "file")):
        monkeypatch.setitem(FORMATS, key, dataclasses.replace(FORMATS[key], writer=_fake_writer(kind, fail == key)))
    # no real trace needed: the stage only hands the program to the writers
    monkeypatch.setattr(convert, "load_traced", lambda run_dir: (None, {
        "method": "torch.export", "example_batch": 2, "encoder_sha256": file_sha256(encoder_path(run_dir))}))


def _snapshot(export_dir: Path) -> dict:
    return {p.relative_to(export_dir).as_posix(): p.read_bytes() for p in sorted(export_dir.rglob("*")) if p.is_file()}


def test_export_is_all_or_nothing_and_the_sidecar_matches_export_dir(tmp_path, tiny_overrides, monkeypatch):
    out = tmp_path / "run"
    pretrain_tiny(out, max_steps=1)
    strip(StripConfig(), out, say=lambda *_: None)
    export_dir = out / rundir.EXPORT
    _use_fakes(monkeypatch)
    res = _cli("export", "--run", out)
    assert res.exit_code == 0, res.output
    sidecar = json.loads((export_dir / SIDECAR).read_text())
    assert [a["file"] for a in sidecar["artifacts"]] == ["encoder.mlpackage", "encoder.mlmodel", "encoder.onnx"]
    for entry in sidecar["artifacts"]:
        assert (entry["size_bytes"], entry["sha256"]) == artifact_digest(export_dir / entry["file"])
    before = _snapshot(export_dir)

    # the second of three conversions fails: nothing changes, nothing half-written remains
    _use_fakes(monkeypatch, fail="mlmodel")
    res = _cli("export", "--run", out, "--precision", "fp32", "--to", "coreml")
    assert res.exit_code == 2 and res.output.splitlines()[-1] == "error: Core ML conversion failed (simulated); nothing was written"
    assert "Traceback" not in res.output
    assert _snapshot(export_dir) == before
    assert not [p for p in export_dir.iterdir() if p.name.startswith(".")]

    # a format not re-exported stays listed while it was made from the same encoder.pt ...
    _use_fakes(monkeypatch)
    assert _cli("export", "--run", out, "--to", "onnx").exit_code == 0
    assert [a["format"] for a in json.loads((export_dir / SIDECAR).read_text())["artifacts"]] == ["mlpackage", "mlmodel", "onnx"]
    assert (export_dir / "encoder.mlpackage" / "Manifest.json").read_bytes() == before["encoder.mlpackage/Manifest.json"]
    # ... and is removed once encoder.pt changed, so export/ never holds an artifact of other weights
    strip(StripConfig(l2_normalize=False), out, say=lambda *_: None)
    res = _cli("export", "--run", out, "--to", "onnx")
    assert res.exit_code == 0 and "removed" in res.output
    assert [a["format"] for a in json.loads((export_dir / SIDECAR).read_text())["artifacts"]] == ["onnx"]
    assert not (export_dir / "encoder.mlpackage").exists() and not (export_dir / "encoder.mlmodel").exists()


def test_export_removes_staging_left_by_a_killed_export_only(tmp_path, tiny_overrides, monkeypatch):
    out = tmp_path / "run"
    pretrain_tiny(out, max_steps=1)
    strip(StripConfig(), out, say=lambda *_: None)
    export_dir = out / rundir.EXPORT
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a process that has exited: its pid names no live export
    stale, live = export_dir / f".staging-{gone.pid}-abc", export_dir / f".staging-{os.getpid()}-xyz"
    for d in (stale, live):
        d.mkdir(parents=True)
        (d / "encoder.onnx").write_text("half")
    _use_fakes(monkeypatch)
    res = _cli("export", "--run", out, "--to", "onnx")
    assert res.exit_code == 0, res.output
    assert not stale.exists() and f"removed {stale}" in res.output
    assert live.is_dir()  # another export still running (here: this process) keeps its folder


def test_resnet50_strip_trace_export_coreml(tmp_path, tiny_overrides, monkeypatch):
    """The product path with the shipping defaults (fp16 ML Program, iOS16), on ResNet-50 at 32 px (small stem)."""
    logging.getLogger("coremltools").setLevel(logging.ERROR)
    import coremltools as ct

    from export.coreml import program_ops

    out = tmp_path / "runs" / "default"
    overrides = {**tiny_overrides, "method": "simclr", "backbone": "resnet50", "image_size": 32, "batch_size": 2, "max_steps": 1}
    pretrain_tiny(out, **overrides)
    monkeypatch.chdir(tmp_path)  # no --run: the commands work on runs/default and say so
    for args in (["strip"], ["trace"], ["export", "--to", "coreml", "--coreml-format", "mlpackage"]):
        res = _cli(*args)
        assert res.exit_code == 0, res.output
        assert res.output.startswith("using run runs/default")

    state = torch.load(encoder_path(out), weights_only=False)
    assert state["feat_dim"] == 2048 and state["backbone"] == "resnet50"
    assert not [k for k in state["state_dict"] if k.startswith("projector")]
    assert state["metadata"]["dropped_modules"] == ["projector"]
    sidecar = json.loads((out / rundir.EXPORT / SIDECAR).read_text())
    assert [a["file"] for a in sidecar["artifacts"]] == ["encoder.mlpackage"] and sidecar["trace"] == "torch.export"
    assert (sidecar["method"], sidecar["backbone"], sidecar["embedding_dim"], sidecar["image_size"]) == ("simclr", "resnet50", 2048, 32)
    spec = ct.models.MLModel(str(out / rundir.EXPORT / "encoder.mlpackage"), skip_model_load=True).get_spec()
    assert spec.specificationVersion == 7  # iOS16, the default target
    image = spec.description.input[0]
    assert (image.name, image.type.imageType.width, image.type.imageType.height) == ("image", 32, 32)
    assert spec.description.output[0].name == "embedding"
    assert list(spec.description.output[0].type.multiArrayType.shape) == [1, 2048]
    user = dict(spec.description.metadata.userDefined)
    assert (user["backbone"], user["embedding_dim"], user["precision"]) == ("resnet50", "2048", "fp16")
    tail = {d for t, _, d in program_ops(spec) if t in ("reduce_sum", "rsqrt")}
    assert tail == {"fp32"}  # sum of 2048 squares: fp32, whatever fp16 does to the convs
