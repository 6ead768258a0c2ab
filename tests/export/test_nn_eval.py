"""The NeuralNetwork evaluator against torch: the MIL op cases converted to NN layers, preprocessing, fp16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from export import nn_eval
from core.errors import PipelineError
from tests.export.test_mil_eval import CASES, _image_program, case_inputs, convert, reference

ct = pytest.importorskip("coremltools")
from coremltools.converters.mil import Builder as mb  # noqa: E402

# MIL ops the NeuralNetwork backend has no layer for, and NN round, whose tie rule the spec leaves open.
NOT_IN_NN = {"floor_div", "logical_xor", "leaky_relu", "reduce_min", "reduce_sum_square", "slice_by_size",
             "conv_valid_even_same_lower", "conv_same_lower_dilated", "round_ties_to_even", "equal", "not_equal", "greater_equal",
             "less_equal", "identity", "resize_bilinear_unalign_down"}
NN_CASES = {k: v for k, v in CASES.items() if k not in NOT_IN_NN}


@pytest.fixture(scope="module")
def nn_program(tmp_path_factory):
    from tests.export.test_mil_eval import build_program

    path = tmp_path_factory.mktemp("nn_ops") / "ops.mlmodel"
    convert(build_program(NN_CASES, ct.target.iOS15), path, "neuralnetwork")
    model = nn_eval.load_mlmodel(path)
    inputs = case_inputs()
    return model, inputs, nn_eval.run_network(model, inputs, compute="fp32")


def _kinds(model) -> set[str]:
    return {layer.WhichOneof("layer") for layer in model.spec.neuralNetwork.layers}


def test_every_registered_layer_is_exercised(nn_program):
    model, _, _ = nn_program
    missing = set(nn_eval.NN_LAYERS) - _kinds(model)
    assert not missing, f"registered layers without a case: {sorted(missing)}"
    activations = {layer.activation.WhichOneof("NonlinearityType") for layer in model.spec.neuralNetwork.layers
                   if layer.WhichOneof("layer") == "activation"}
    assert {"ReLU", "linear", "sigmoid", "tanh"} <= activations
    unary = {layer.unary.type for layer in model.spec.neuralNetwork.layers if layer.WhichOneof("layer") == "unary"}
    assert {0, 1, 4, 5, 6} <= unary  # SQRT, RSQRT, EXP, LOG, ABS


@pytest.mark.parametrize("name", list(NN_CASES))
def test_layer_matches_torch(nn_program, name):
    model, inputs, outputs = nn_program
    ref = reference(NN_CASES, name, inputs)
    out = outputs[name]
    assert tuple(out.shape) == tuple(ref.shape)
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", ["RGB", "BGR"])
def test_preprocessing_scaler_follows_color_space(tmp_path, layout):
    """The image scaler's biases are per colour (red/green/blue), placed by the color space: a BGR model gets
    blueBias on its first channel."""
    bias = [-1.0, -2.0, -3.0]  # coremltools: in the model's channel order
    prog, inputs = _image_program(getattr(ct.colorlayout, layout), 1 / 255, bias)
    # NN needs an iOS15 program; rebuild the same graph at that opset
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 3, 4, 5))], opset_version=ct.target.iOS15)
    def prog15(x):
        return mb.mul(x=x, y=1.0, name="out")

    path = convert(prog15, tmp_path / "img.mlmodel", "neuralnetwork", inputs=inputs)
    model = nn_eval.load_mlmodel(path)
    scaler = model.scalers["x"]
    first = scaler.redBias if layout == "RGB" else scaler.blueBias
    assert first == -1.0
    rgb = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    out = torch.from_numpy(nn_eval.predict_images(model, rgb, compute="fp32")).reshape(2, 3, 4, 5)
    planes = rgb.float() if layout == "RGB" else rgb.float().flip(1)
    torch.testing.assert_close(out, planes / 255 + torch.tensor(bias).view(1, 3, 1, 1), rtol=1e-6, atol=1e-6)


def test_fp16_weights_used_as_stored_and_activations_rounded(tmp_path):
    from coremltools.models.neural_network import quantization_utils

    w = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 8))], opset_version=ct.target.iOS15)
    def prog(x):
        return mb.add(x=mb.linear(x=x, weight=w), y=1000.0, name="out")

    path = convert(prog, tmp_path / "fp32.mlmodel", "neuralnetwork")
    half = quantization_utils.quantize_weights(ct.models.MLModel(str(path)), nbits=16)
    half.save(str(tmp_path / "fp16.mlmodel"))
    model = nn_eval.load_mlmodel(tmp_path / "fp16.mlmodel")
    assert model.precision == "fp16" and model.default_compute == "fp16"
    x = torch.randn(2, 8)
    w16 = torch.from_numpy(w).half().float()
    out32 = nn_eval.run_network(model, {"x": x}, compute="fp32")["out"]
    torch.testing.assert_close(out32, x @ w16.T + 1000, rtol=1e-6, atol=1e-4)
    out16 = nn_eval.run_network(model, {"x": x})["out"]
    torch.testing.assert_close(out16, ((x.half().float() @ w16.T).half().float() + 1000).half().float(), rtol=0, atol=0)


def test_unknown_layer_fails_naming_it(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 4))], opset_version=ct.target.iOS15)
    def prog(x):
        return mb.erf(x=x, name="out")

    model = nn_eval.load_mlmodel(convert(prog, tmp_path / "erf.mlmodel", "neuralnetwork"))
    with pytest.raises(PipelineError, match="layer `erf.*not supported"):
        nn_eval.run_network(model, {"x": torch.zeros(2, 4)})


def test_ml_program_is_refused_by_the_nn_loader(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(2,))], opset_version=ct.target.iOS15)
    def prog(x):
        return mb.relu(x=x, name="out")

    path = convert(prog, tmp_path / "p.mlpackage", "mlprogram", compute_precision=ct.precision.FLOAT32)
    with pytest.raises(PipelineError, match="not supported|holds a mlProgram"):
        nn_eval.load_mlmodel(path / "Data" / "com.apple.CoreML" / "model.mlmodel")
