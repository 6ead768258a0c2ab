"""The torch.export trace and the ONNX artifact of a tiny ResNet-18 run: one file, opset >= 17, input `image` float32 [batch, 3, S, S] with a free
batch, output `embedding` [batch, D], the run's metadata in metadata_props, onnx.checker (full), and onnxruntime
equal to the PyTorch Encoder; both from torch.export (dynamo exporter) and from the jit.trace fallback."""

import json
import operator
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from export.encoder import load_encoder
from export.metadata import as_strings
from core import rundir
from stages.export import ExportConfig
from stages.export import run as export
from stages.strip import StripConfig, encoder_path
from stages.strip import run as strip
from export.traced import load_traced
from stages.trace import TraceConfig
from stages.trace import run as trace
from tests.tiny_run import pretrain_tiny

FLOAT = onnx.TensorProto.FLOAT


def _stripped_run(tmp_path: Path, overrides: dict) -> Path:
    out = tmp_path / "run"
    pretrain_tiny(out, **{**overrides, "max_steps": 1})
    strip(StripConfig(), out, say=lambda *_: None)
    return out


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def check_onnx(run_dir: Path, opset: int, exporter: str) -> None:
    export_dir = run_dir / rundir.EXPORT
    path = export_dir / "encoder.onnx"
    sidecar = json.loads((export_dir / "encoder.json").read_text())
    entry = next(a for a in sidecar["artifacts"] if a["format"] == "onnx")
    assert entry["precision"] == "fp32" and entry["opset"] == opset and entry["exporter"].startswith(exporter)

    model = onnx.load(str(path))
    onnx.checker.check_model(str(path), full_check=True)
    assert not [t.name for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]  # one file
    assert [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] == [opset]
    assert [i.name for i in model.graph.input] == ["image"] and [o.name for o in model.graph.output] == ["embedding"]
    assert model.graph.input[0].type.tensor_type.elem_type == FLOAT
    assert model.graph.output[0].type.tensor_type.elem_type == FLOAT
    assert _dims(model.graph.input[0]) == ["batch", 3, 16, 16]
    assert _dims(model.graph.output[0]) == ["batch", 512]
    props = {p.key: p.value for p in model.metadata_props}
    shared = {k: v for k, v in sidecar.items() if k not in ("artifacts", "sha256_of_directory")}
    for key, value in as_strings(shared).items():  # the same metadata as the Core ML artifacts and the sidecar
        assert props[key] == value, key
    assert props["format"] == "onnx" and props["l2_normalized"] == "true" and props["embedding_dim"] == "512"

    encoder, _ = load_encoder(encoder_path(run_dir))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = torch.rand(batch, 3, 16, 16) * 255
        got = session.run(["embedding"], {"image": x.numpy()})[0]
        with torch.no_grad():
            ref = encoder(x).numpy()
        assert got.shape == (batch, 512) and got.dtype == np.float32
        assert np.abs(got - ref).max() < 1e-4


def test_onnx_export_resnet18_from_torch_export_and_jit_fallback(tmp_path, tiny_overrides):
    out = _stripped_run(tmp_path, tiny_overrides)
    fallback = tmp_path / "fallback"
    shutil.copytree(out, fallback)

    info = trace(TraceConfig(), out, say=lambda *_: None)
    assert info["method"] == "torch.export" and info["reason"] is None and info["file"] == "encoder.pt2"
    assert info["input_shape"] == ["batch", 3, 16, 16] and info["max_abs_diff"] <= 1e-5
    program, _ = load_traced(out)
    assert isinstance(program, torch.export.ExportedProgram)
    # torch.export.load's dead getitem outputs, which coremltools 9.0 cannot bind, are gone after load_traced
    assert not [n for n in program.graph.nodes if n.op == "call_function" and n.target is operator.getitem and not n.users]
    encoder, _ = load_encoder(encoder_path(out))
    x = torch.rand(5, 3, 16, 16) * 255  # the batch stays free in the traced graph
    with torch.no_grad():
        assert torch.allclose(program.module()(x), encoder(x), atol=1e-5)

    sidecar = export(ExportConfig(to="onnx"), out, say=lambda *_: None)
    assert [a["file"] for a in sidecar["artifacts"]] == ["encoder.onnx"]
    assert sidecar["trace"] == "torch.export" and "linear_top1" not in sidecar  # no eval/linear.json in this run
    check_onnx(out, 18, "torch.onnx.export(dynamo=True)")

    trace(TraceConfig(method="jit"), fallback, say=lambda *_: None)
    sidecar = export(ExportConfig(to="onnx", opset=20), fallback, say=lambda *_: None)
    assert sidecar["trace"] == "jit.trace"
    check_onnx(fallback, 20, "torch.onnx.export(dynamo=False)")
