"""Core ML artifacts of a tiny ResNet-18 run, reloaded from disk (Linux cannot predict, so the spec is checked):
image input RGB S x S, output `embedding` float32 [1, D], the metadata, fp16 with the L2 tail in fp32, NeuralNetwork
weights in fp16, the deployment targets, and the sidecar's size/sha256 of each artifact."""

import json
import logging
from pathlib import Path

import pytest
import torch

from export.coreml import program_ops
from export.encoder import ENCODER_OPS
from export.metadata import as_strings
from core import __version__, rundir
from stages.export import ExportConfig, SIDECAR, artifact_digest
from stages.export import run as export
from stages.strip import StripConfig
from stages.strip import run as strip
from stages.trace import TraceConfig
from stages.trace import run as trace
from tests.tiny_run import pretrain_tiny
from train.backbones import BACKBONES

logging.getLogger("coremltools").setLevel(logging.ERROR)
ct = pytest.importorskip("coremltools")
from coremltools.proto import FeatureTypes_pb2  # noqa: E402

SPEC_VERSION = {"iOS13": 4, "iOS16": 7, "iOS17": 8}  # coremltools' _SPECIFICATION_VERSION_*
REQUIRED_METADATA = ("method", "backbone", "embedding_dim", "image_size", "mean", "std", "l2_normalized", "run_id",
                     "epochs", "pipeline_version", "linear_top1")


def _traced_run(tmp_path: Path, overrides: dict) -> Path:
    out = tmp_path / "run"
    pretrain_tiny(out, **{**overrides, "max_steps": 1})
    strip(StripConfig(), out, say=lambda *_: None)
    trace(TraceConfig(), out, say=lambda *_: None)
    return out


def check_coreml_io(spec, size: int, dim: int) -> None:
    """What Vision's VNCoreMLRequest needs: one RGB image input of the trained size, one float32 [1, D] output."""
    assert [i.name for i in spec.description.input] == ["image"]
    image = spec.description.input[0].type
    assert image.WhichOneof("Type") == "imageType"
    assert (image.imageType.width, image.imageType.height) == (size, size)
    assert image.imageType.colorSpace == FeatureTypes_pb2.ImageFeatureType.RGB
    assert [o.name for o in spec.description.output] == ["embedding"]
    out = spec.description.output[0].type.multiArrayType
    assert list(out.shape) == [1, dim]
    assert out.dataType == FeatureTypes_pb2.ArrayFeatureType.FLOAT32


def check_coreml_metadata(spec, sidecar: dict, fmt: str) -> None:
    md = spec.description.metadata
    assert md.author == sidecar["author"] and md.license == sidecar["license"]
    assert md.versionString == sidecar["version"] and md.shortDescription == sidecar["description"]
    assert "0..255" in spec.description.input[0].shortDescription
    assert "L2-normalised" in spec.description.output[0].shortDescription
    user = dict(md.userDefined)
    shared = {k: v for k, v in sidecar.items() if k not in ("artifacts", "sha256_of_directory")}
    for key, value in as_strings(shared).items():  # the one metadata dict, in every artifact
        assert user[key] == value, key
    assert user["format"] == fmt
    assert json.loads(user["mean"]) == sidecar["mean"]


def test_coreml_export_resnet18(tmp_path, tiny_overrides):
    out = _traced_run(tmp_path, tiny_overrides)
    measured = {"step": 1, "id": torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)["id"]}  # this checkpoint
    rundir.write_json_atomic(out / rundir.EVAL / "linear.json", {"top1": 0.625, "knn_top1": 0.5, "checkpoint": measured})
    sidecar = export(ExportConfig(to="coreml", deployment_target="iOS17"), out, say=lambda *_: None)
    assert json.loads((out / rundir.EXPORT / SIDECAR).read_text()) == sidecar
    assert all(k in sidecar for k in REQUIRED_METADATA)
    assert sidecar["linear_top1"] == 0.625 and sidecar["embedding_dim"] == 512 and sidecar["image_size"] == 16
    assert sidecar["pipeline_version"] == __version__ and sidecar["l2_normalized"] is True
    entries = {a["format"]: a for a in sidecar["artifacts"]}
    assert set(entries) == {"mlpackage", "mlmodel"}
    for entry in entries.values():
        assert (entry["size_bytes"], entry["sha256"]) == artifact_digest(out / rundir.EXPORT / entry["file"])

    # ML Program, fp16: convs in fp16, the global pool and L2 normalisation in fp32 in the saved program
    pkg = out / rundir.EXPORT / "encoder.mlpackage"
    assert pkg.is_dir() and entries["mlpackage"]["precision"] == "fp16"
    spec = ct.models.MLModel(str(pkg), skip_model_load=True).get_spec()
    assert spec.WhichOneof("Type") == "mlProgram" and spec.specificationVersion == SPEC_VERSION["iOS17"]
    check_coreml_io(spec, 16, 512)
    check_coreml_metadata(spec, sidecar, "mlpackage")
    ops = program_ops(spec)
    # the row says what export needs (a const is a value the evaluator reads, not an op it runs)
    assert {t for t, _, _ in ops} - {"const"} <= {*BACKBONES["resnet18"].export_ops, *ENCODER_OPS}
    dtypes = {(t, d) for t, _, d in ops}
    assert ("conv", "fp16") in dtypes and ("conv", "fp32") not in dtypes
    tail = [(t, d) for t, _, d in ops if t in ("reduce_mean", "reduce_sum", "rsqrt")]
    assert [t for t, _ in tail] == ["reduce_mean", "reduce_sum", "rsqrt"] and {d for _, d in tail} == {"fp32"}
    assert ops[-1][1] == "embedding" and ops[-1][2] == "fp32"

    # NeuralNetwork (.mlmodel): one file, fp16 weights, iOS13 spec
    nn_path = out / rundir.EXPORT / "encoder.mlmodel"
    assert nn_path.is_file()
    spec = ct.models.MLModel(str(nn_path), skip_model_load=True).get_spec()
    assert spec.WhichOneof("Type") == "neuralNetwork" and spec.specificationVersion == SPEC_VERSION["iOS13"]
    check_coreml_io(spec, 16, 512)
    check_coreml_metadata(spec, sidecar, "mlmodel")
    assert dict(spec.description.metadata.userDefined)["precision_detail"].startswith("fp16 weights")
    convs = [layer.convolution for layer in spec.neuralNetwork.layers if layer.WhichOneof("layer") == "convolution"]
    assert len(convs) == 20  # ResNet-18: stem + 16 block convs + 3 downsample convs; all with fp16 weights
    assert all(c.weights.float16Value and not c.weights.floatValue for c in convs)

    # fp32 ML Program on its own: replaces the package, keeps the .mlmodel (same encoder.pt) in the sidecar
    sidecar = export(ExportConfig(to="coreml", coreml_format="mlpackage", precision="fp32"), out, say=lambda *_: None)
    entries = {a["format"]: a for a in sidecar["artifacts"]}
    assert entries["mlpackage"]["precision"] == "fp32" and entries["mlmodel"]["precision"] == "fp16"
    spec = ct.models.MLModel(str(pkg), skip_model_load=True).get_spec()
    assert spec.specificationVersion == SPEC_VERSION["iOS16"]  # the default target
    dtypes = {d for t, _, d in program_ops(spec) if t != "const"}
    assert "fp16" not in dtypes and "fp32" in dtypes
    check_coreml_io(spec, 16, 512)
    assert not [p for p in (out / rundir.EXPORT).iterdir() if p.name.startswith(".")]  # no staging left behind


class _StemNet(torch.nn.Module):
    """An input normalisation, two convs, a global pool and the L2 tail: the shape of every encoder's program."""

    def __init__(self):
        super().__init__()
        self.stem, self.body = torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 3)

    def forward(self, x):
        x = self.body(torch.relu(self.stem((x / 255 - 0.5) / 0.25)))
        x = x.mean((2, 3))
        return x * torch.rsqrt((x * x).sum(1, keepdim=True).clamp_min(1e-12))


@pytest.mark.parametrize("fp32_stem", [False, True])
def test_the_fp16_selector_keeps_the_stem_in_fp32_only_when_the_backbone_asks(fp32_stem):
    """With fp32_stem, every op through the first conv is fp32 in the saved program and the rest of the body fp16;
    without it only the tail is fp32. check_fp32_ops refuses a program whose stem came out fp16."""
    from core.errors import PipelineError
    from export.coreml import _convert, _fp32_selector, check_fp32_ops

    program = torch.jit.trace(_StemNet().eval(), torch.rand(1, 3, 16, 16) * 255)
    model = _convert(ct, program, 16, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                     compute_precision=ct.transform.FP16ComputePrecision(op_selector=_fp32_selector(fp32_stem)))
    ops = [(t, d) for t, _, d in program_ops(model.get_spec()) if t != "const"]
    convs = [d for t, d in ops if t == "conv"]
    assert convs == (["fp32", "fp16"] if fp32_stem else ["fp16", "fp16"])
    first_conv = next(i for i, (t, _) in enumerate(ops) if t == "conv")
    assert all(d == "fp32" for _, d in ops[:first_conv]) or not fp32_stem
    assert [d for t, d in ops if t in ("reduce_mean", "reduce_sum", "rsqrt")] == ["fp32"] * 3
    check_fp32_ops(model.get_spec(), fp32_stem)
    if not fp32_stem:
        with pytest.raises(PipelineError, match="first conv in fp16"):
            check_fp32_ops(model.get_spec(), True)


@pytest.mark.parametrize("nbits", range(1, 8))
def test_the_numpy_bit_packer_writes_coremltools_bytes(nbits):
    """export.coreml.pack_bits stands in for coremltools' per-bit Python packer while a NeuralNetwork is palettized:
    its bytes must be theirs for every width and for lengths that end mid-byte, and out-of-range bits are dropped."""
    import numpy as np
    from coremltools.models.neural_network import quantization_utils as qu

    from export.coreml import _numpy_bit_packer, pack_bits

    theirs = qu._convert_array_to_nbit_quantized_bytes
    rng = np.random.default_rng(nbits)
    for n in (0, 1, 3, 7, 8, 9, 15, 17, 1000):
        values = rng.integers(0, 2 ** nbits, n, dtype=np.uint8)
        assert pack_bits(values, nbits).tobytes() == theirs(values, nbits).tobytes(), (nbits, n)
    wide = rng.integers(0, 256, 33, dtype=np.uint8)  # bits above nbits are not the packer's to keep
    assert pack_bits(wide, nbits).tobytes() == theirs(wide, nbits).tobytes()
    with _numpy_bit_packer(qu):
        assert qu._convert_array_to_nbit_quantized_bytes is pack_bits
    assert qu._convert_array_to_nbit_quantized_bytes is theirs
