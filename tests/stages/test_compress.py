"""`pipeline export --compress` and what validate makes of it: refusals up front, compressed files beside the
uncompressed ones with their configuration recorded, gates on use, and a tampered compressed model failing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from core import rundir
from core.config import load_config
from core.errors import PipelineError
from export import compression
from export.configs import ExportConfig, ValidateConfig
from export.formats import artifact_file, select_formats

pytest.importorskip("coremltools")


def _quiet(*_):
    pass


@pytest.mark.parametrize("request_, needle", [
    (dict(to="coreml", compress="prune-50"), "--compress prune-50: the NeuralNetwork format stores no sparse weights; "
                                             "add --coreml-format mlpackage"),
    (dict(to="coreml", coreml_format="mlpackage", compress="int8", deployment_target="iOS15"),
     "--deployment-target iOS15 has none: use iOS16 or later"),
    (dict(to="coreml", compress="int8", precision="fp32"), "decompresses to fp16 (fp16 activations): leave --precision out"),
    (dict(to="onnx", compress="int8"), "--compress applies to mlpackage, mlmodel"),
    (dict(to="coreml", compress="int3"), "--compress 'int3': use one of"),
])
def test_impossible_compressions_are_refused_before_any_work(request_, needle):
    options = {"deployment_target": request_.get("deployment_target"), "compress": request_.get("compress"),
               "opset": None}
    with pytest.raises(PipelineError, match=None) as e:
        select_formats(request_["to"], request_.get("coreml_format"), request_.get("precision"), options)
    assert needle in str(e.value)


def test_compressed_files_are_named_for_their_compression():
    plan = select_formats("all", None, None, {"compress": "palettize-4", "deployment_target": None, "opset": None})
    assert [artifact_file(f, own) for f, _, own in plan] == ["encoder.palettize-4.mlpackage",
                                                            "encoder.palettize-4.mlmodel", "encoder.onnx"]
    plan = select_formats("coreml", None, None, {"compress": None, "deployment_target": None, "opset": None})
    assert [artifact_file(f, own) for f, _, own in plan] == ["encoder.mlpackage", "encoder.mlmodel"]


def test_grouped_palettization_only_where_the_op_set_has_it():
    assert compression.ml_program_config("palettize-4", "iOS17")["granularity"] == "per_tensor"
    assert compression.ml_program_config("palettize-4", "iOS18") == {
        "mode": "kmeans", "nbits": 4, "granularity": "per_grouped_channel", "group_size": 16, "channel_axis": 0,
        "weight_threshold": compression.WEIGHT_THRESHOLD}


@pytest.fixture(scope="module")
def compressed_run(tmp_path_factory) -> Path:
    from stages import export, strip, trace
    from tests.tiny_run import pretrain_tiny

    run = tmp_path_factory.mktemp("compress") / "run"
    pretrain_tiny(run, epochs=1, data="synthetic:64")
    strip.run(strip.StripConfig(), run, say=_quiet)
    trace.run(trace.TraceConfig(), run, say=_quiet)
    export.run(load_config(ExportConfig, None, {"to": "coreml", "coreml_format": "mlpackage"}), run, say=_quiet)
    export.run(load_config(ExportConfig, None, {"to": "coreml", "compress": "palettize-4"}), run, say=_quiet)
    export.run(load_config(ExportConfig, None, {"to": "coreml", "coreml_format": "mlpackage", "compress": "int8",
                                                "deployment_target": "iOS18"}), run, say=_quiet)
    return run


def test_compressions_sit_side_by_side_with_their_configuration(compressed_run):
    export_dir = compressed_run / rundir.EXPORT
    sidecar = json.loads((export_dir / rundir.SIDECAR).read_text())
    by_file = {a["file"]: a for a in sidecar["artifacts"]}
    assert list(by_file) == ["encoder.mlpackage", "encoder.int8.mlpackage", "encoder.palettize-4.mlpackage",
                             "encoder.palettize-4.mlmodel"]
    assert all((export_dir / f).exists() for f in by_file)
    full, int8, pal = by_file["encoder.mlpackage"], by_file["encoder.int8.mlpackage"], by_file["encoder.palettize-4.mlpackage"]
    assert full["compression"] == "fp16" and int8["compression"] == "int8"
    assert int8["compression_config"] == {"call": "coremltools.optimize.coreml.linear_quantize_weights",
                                          "mode": "linear_symmetric", "dtype": "int8", "granularity": "per_channel",
                                          "weight_threshold": 2048}
    assert int8["deployment_target"] == "iOS18"
    # ResNet-18's weights are ~all above the threshold: 8 bits about half of fp16, 4 bits about a quarter
    assert 0.45 < int8["weights_bytes"] / full["weights_bytes"] < 0.55
    assert 0.2 < pal["weights_bytes"] / full["weights_bytes"] < 0.3
    import coremltools as ct

    meta = ct.utils.load_spec(str(export_dir / "encoder.palettize-4.mlpackage")).description.metadata.userDefined
    assert meta["compression"] == "palettize-4"
    assert json.loads(meta["compression_config"])["nbits"] == 4
    assert int(meta["weights_bytes"]) == pal["weights_bytes"]
    nn_meta = ct.utils.load_spec(str(export_dir / "encoder.palettize-4.mlmodel")).description.metadata.userDefined
    assert json.loads(nn_meta["compression_config"])["quantization_mode"] == "kmeans_lut"


def _view(run: Path, dst: Path, keep: list[str], replace: dict[str, Path] | None = None) -> Path:
    (dst / rundir.EXPORT).mkdir(parents=True)
    for name in (rundir.CONFIG, rundir.SPLIT):
        (dst / name).symlink_to(run / name)
    (dst / rundir.EXPORT / "encoder.pt").symlink_to(run / rundir.EXPORT / "encoder.pt")
    sidecar = rundir.load_json(run / rundir.EXPORT / rundir.SIDECAR, "sidecar")
    sidecar["artifacts"] = [a for a in sidecar["artifacts"] if a["file"] in keep]
    for a in sidecar["artifacts"]:
        (dst / rundir.EXPORT / a["file"]).symlink_to(((replace or {}).get(a["file"]) or run / rundir.EXPORT / a["file"]).resolve())
    rundir.write_json_atomic(dst / rundir.EXPORT / rundir.SIDECAR, sidecar)
    return dst


def test_compressed_artifacts_are_gated_on_use(compressed_run, tmp_path, monkeypatch):
    """Each compressed artifact gets the gates on use, and its own probe: every probe fit (C's selection, the fp32
    encoder's probe, each artifact's) holds the train rows of one model and no val row of any, each row checked
    against every model's val features. (Whether a drop fails its gate is tests/export/test_parity.py's and
    test_shipped_gates.py's: here both drops are let through.)"""
    import torch

    from export.encoder import load_encoder
    from export.formats import FORMATS
    from stages import validate
    from tests.heldout_spies import positions, spy
    from train.probe import C_GRID

    files = ["encoder.int8.mlpackage", "encoder.palettize-4.mlpackage", "encoder.palettize-4.mlmodel"]
    view = _view(compressed_run, tmp_path / "run", files)
    # The kNN and probe drops of this one-epoch run are read on 8 val images, so one image that changes its label
    # is 0.125, past the shipped 0.03; which one does follows the CPU's kernels (ATEN_CPU_CAPABILITY=default
    # flips one under palettize-4, avx2 and avx512 none). Let through, so the run completes on every CPU.
    cfg = load_config(ValidateConfig, None, {"coreml_runtime": "off", "compressed_max_knn_drop": 1.0,
                                             "compressed_max_probe_drop": 1.0})
    encoder, state = load_encoder(view / rundir.EXPORT / "encoder.pt")
    val, _, _ = validate.labelled_val_images(view, int(state["image_size"]), cfg.max_images)
    train, _, _ = validate.train_images(view, int(state["image_size"]), cfg.max_train_images)
    both = torch.cat([val, train])
    feats = {"fp32": validate.encode(encoder, both)}
    for a in rundir.load_json(view / rundir.EXPORT / rundir.SIDECAR, "sidecar")["artifacts"]:
        feats[a["file"]] = np.asarray(FORMATS[a["format"]].checker(view / rundir.EXPORT / a["file"], both)[1])
    seen = spy(monkeypatch)
    result = validate.run(cfg, view, say=_quiet)
    rows = {r["artifact"]: r for r in result["rows"]}
    assert set(rows) == set(files) and result["passed"]
    for r in rows.values():
        assert r["precision"] == "compressed"
        assert {"knn_top1_ref", "knn_top1", "knn_drop", "probe_top1_ref", "probe_top1", "probe_drop"} <= set(r)
    assert rows["encoder.int8.mlpackage"]["worst_cosine"] > rows["encoder.palettize-4.mlpackage"]["worst_cosine"]
    assert rows["encoder.palettize-4.mlmodel"]["runtime"].startswith("nn-eval")

    probe, split = result["probe"], rundir.load_json(compressed_run / rundir.SPLIT, "split")
    assert probe["measured"] and probe["train_sources"] == split["train_sources"]  # 48 train images: all, no val image
    for r in rows.values():  # one fp32 probe and one C, each artifact's own probe against it
        assert r["probe_top1_ref"] == probe["top1"] and r["probe_c"] == probe["c"]
    assert len(seen.fits) == len(C_GRID) + 1 + len(files)
    for x, _ in seen.fits:
        assert all((positions(x, f[: len(val)]) < 0).all() for f in feats.values())
        assert any((positions(x, f[len(val):]) >= 0).all() for f in feats.values())
    own = seen.fits[-len(files):]  # in the sidecar's order, each on all of its own train rows
    assert all(np.array_equal(x, feats[f][len(val):]) for (x, _), f in zip(own, [f for f in feats if f != "fp32"]))

    from stages import report

    html = report.compression_picture(result)
    assert "<img" in html and all(f in html for f in files)
    assert "on the 8 labelled val images" in html and "each model's own linear probe" in html
    assert "tell one image from a loss" not in html  # this run's drop bounds (1.0) resolve one image in 8
    shipped = {**result, "config": {**result["config"], "compressed_max_knn_drop": 0.03,
                                    "compressed_max_probe_drop": 0.03}}
    assert "one image that changes its answer moves a drop by 0.125, past the bounds, which need 34 images or more" \
        in report.compression_picture(shipped)
    fp16_only = {**result, "rows": [{**r, "precision": "fp16"} for r in result["rows"]]}
    assert report.compression_picture(fp16_only) == ""  # no compressed artifact, no picture


def _reverse_first_lut_mlpackage(src: Path, dst: Path) -> Path:
    """The first palettized weight reads its LUT backwards: every index now picks another centroid."""
    import coremltools as ct
    from coremltools import proto

    shutil.copytree(src, dst)
    spec = ct.utils.load_spec(str(src))
    func = spec.mlProgram.functions["main"]
    ops = func.block_specializations[func.opset].operations
    from export import mil_eval

    model = mil_eval.load_mlpackage(src)
    lut_op = next(o for o in ops if o.type == "constexpr_lut_to_dense")  # a constexpr op's inputs are attributes
    lut = next(op.inputs["lut"] for op in model.function.operations if op.op_type == "constexpr_lut_to_dense")
    old = lut_op.attributes["lut"]
    new = proto.MIL_pb2.Value()
    new.type.CopyFrom(old.type)
    new.immediateValue.tensor.bytes.values = np.asarray(lut.val, np.float16).ravel()[::-1].tobytes()
    lut_op.attributes["lut"].CopyFrom(new)
    (dst / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(spec.SerializeToString())
    return dst


def _reverse_first_lut_mlmodel(src: Path, dst: Path) -> Path:
    import coremltools as ct

    spec = ct.utils.load_spec(str(src))
    layer = next(l for l in spec.neuralNetwork.layers
                 if l.WhichOneof("layer") == "convolution" and len(l.convolution.weights.rawValue))
    lut = layer.convolution.weights.quantization.lookupTableQuantization.floatValue
    values = list(lut)[::-1]
    del lut[:]
    lut.extend(values)
    ct.utils.save_spec(spec, str(dst))
    return dst


@pytest.mark.parametrize("file", ["encoder.palettize-4.mlpackage", "encoder.palettize-4.mlmodel"])
def test_a_tampered_compressed_model_fails(compressed_run, tmp_path, file):
    from stages import validate

    src = compressed_run / rundir.EXPORT / file
    bad = (_reverse_first_lut_mlpackage if file.endswith("mlpackage") else _reverse_first_lut_mlmodel)(src, tmp_path / file)
    view = _view(compressed_run, tmp_path / "run", [file], {file: bad})
    with pytest.raises(PipelineError, match=f"parity gate failed: {file}") as e:
        validate.run(load_config(ValidateConfig, None, {"coreml_runtime": "off"}), view, say=_quiet)
    assert "worst_cosine" in str(e.value) or "agreement" in str(e.value)
    assert str(e.value).endswith(validate.COMPRESSED_WHY)  # what to do about it, once
