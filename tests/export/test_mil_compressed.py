"""Compressed weights in both reference evaluators, held to coremltools' own decompression of the same weights.

Each ML Program case is one convolution whose weight coremltools.optimize.coreml compresses, at each op set the
--compress choices write (iOS16/17: affine_dequantize, lut_to_dense, sparse_to_dense with packed bits; iOS18:
blockwise_shift_scale and the unpacked-index LUT and uint1 mask). The evaluator's decompression
(export/mil_eval.CONSTEXPR_OPS) must equal the op's `materialized_val_inference` bit for bit, and the compressed
program must compute what the same program with coremltools' decompressed weights computes. NeuralNetwork cases
hold export/nn_eval's dequantisation to quantization_utils' `_dequantize_wp`, for a convolution (the convnets) and
an inner product on tokens (a ViT), and the quantized inner product to F.linear on those weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import PipelineError
from export import compression, mil_eval, nn_eval

ct = pytest.importorskip("coremltools")
import coremltools.optimize.coreml as cto  # noqa: E402
from coremltools.converters.mil import Builder as mb  # noqa: E402

_rng = np.random.default_rng(0)
W = _rng.standard_normal((32, 16, 3, 3)).astype(np.float32)  # 4608 weights: above the 2048 threshold
SHAPE = (1, 16, 6, 6)
TARGETS = ("iOS16", "iOS17", "iOS18")


def _program(target: str, path):
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)], opset_version=getattr(ct.target, target))
    def prog(x):
        return mb.relu(x=mb.conv(x=x, weight=W, pad_type="same"))

    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=getattr(ct.target, target),
                       compute_precision=ct.precision.FLOAT16, skip_model_load=True)
    return model


def _compress(model, name: str, target: str):
    kind = compression.COMPRESSIONS[name].kind
    config = compression.ml_program_config(name, target)
    op_config, apply = {"linear": (cto.OpLinearQuantizerConfig, cto.linear_quantize_weights),
                        "palettize": (cto.OpPalettizerConfig, cto.palettize_weights),
                        "prune": (cto.OpMagnitudePrunerConfig, cto.prune_weights)}[kind]
    return apply(model, cto.OptimizationConfig(global_config=op_config(**config)))


COMPRESSED = [n for n, c in compression.COMPRESSIONS.items() if c.kind]
# the op set's extras the choices do not write by default: asymmetric 8-bit and 4-bit blocks (iOS18)
EXTRA = {"int8-asymmetric": ("iOS16", cto.OpLinearQuantizerConfig(mode="linear", weight_threshold=0)),
         "int8-asymmetric-iOS18": ("iOS18", cto.OpLinearQuantizerConfig(mode="linear", weight_threshold=0)),
         "int4-per-block": ("iOS18", cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4",
                                                                 granularity="per_block", block_size=8,
                                                                 weight_threshold=0))}


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """{(case, target): (compressed .mlpackage, the same program with coremltools' decompressed weights)}."""
    root = tmp_path_factory.mktemp("compressed")
    out = {}
    cases = [(n, t, None) for n in COMPRESSED for t in TARGETS] + [(n, t, c) for n, (t, c) in EXTRA.items()]
    for name, target, config in cases:
        base = _program(target, root)
        model = _compress(base, name, target) if config is None else cto.linear_quantize_weights(
            base, cto.OptimizationConfig(global_config=config))
        path, plain = root / f"{name}-{target}.mlpackage", root / f"{name}-{target}-plain.mlpackage"
        model.save(str(path))
        cto.decompress_weights(model).save(str(plain))
        out[(name, target)] = (path, plain)
    return out


def _constexpr_ops(model):
    return [op for op in model.function.operations if op.op_type.startswith("constexpr_")]


def test_each_compression_writes_the_op_of_its_op_set(packages):
    ops = {key: {op.op_type for op in _constexpr_ops(mil_eval.load_mlpackage(p))} for key, (p, _) in packages.items()}
    assert ops[("int8", "iOS16")] == {"constexpr_affine_dequantize"}
    assert ops[("int8", "iOS18")] == {"constexpr_blockwise_shift_scale"}
    assert ops[("palettize-4", "iOS17")] == ops[("palettize-4", "iOS18")] == {"constexpr_lut_to_dense"}
    assert ops[("prune-50", "iOS16")] == ops[("prune-50", "iOS18")] == {"constexpr_sparse_to_dense"}
    assert set().union(*ops.values()) == set(mil_eval.CONSTEXPR_OPS), "every registered constexpr op is exercised"


@pytest.mark.parametrize("case", [(n, t) for n in COMPRESSED for t in TARGETS] + [(n, t) for n, (t, _) in EXTRA.items()],
                         ids=lambda c: f"{c[0]}-{c[1]}")
def test_decompression_equals_coremltools_bit_for_bit(packages, case):
    path, _ = packages[case]
    model = mil_eval.load_mlpackage(path)
    ops = _constexpr_ops(model)
    assert ops
    for op in ops:
        ours = model.consts[op.outputs[0].name].numpy()
        theirs = np.asarray(op.materialized_val_inference(), dtype=np.float32)
        assert ours.shape == theirs.shape
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("case", [("int8", "iOS16"), ("palettize-4", "iOS18"), ("prune-50", "iOS17")],
                         ids=lambda c: f"{c[0]}-{c[1]}")
def test_compressed_program_computes_what_its_decompressed_twin_computes(packages, case):
    path, plain = packages[case]
    x = torch.from_numpy(np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32))
    a = mil_eval.run_program(mil_eval.load_mlpackage(path), {"x": x})
    b = mil_eval.run_program(mil_eval.load_mlpackage(plain), {"x": x})
    assert not _constexpr_ops(mil_eval.load_mlpackage(plain))
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0)


def test_lut_groups_and_vectors_follow_the_op_definition():
    """The iOS18 LUT's two documented examples (constexpr_lut_to_dense, cases 1 and 2.1), through the evaluator's
    function directly: per-group tables and vector entries are what --compress does not write yet."""
    idx = torch.tensor([2, 3, 3, 0, 1, 0, 3, 0, 2, 1, 0, 3]).reshape(6, 2)
    lut = torch.tensor([1.0, 5.0, 9.0, 13.0, 2.0, 10.0, 18.0, 26.0]).reshape(2, 1, 4, 1)
    out = mil_eval.CONSTEXPR_OPS["constexpr_lut_to_dense"]({"indices": idx, "lut": lut}, None)
    assert out.tolist() == [[9, 13], [13, 1], [5, 1], [26, 2], [18, 10], [2, 26]]
    idx = torch.tensor([[[0, 0], [1, 0]], [[1, 1], [0, 0]]])
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    lut = torch.tensor([a, b]).reshape(1, 1, 1, 2, 3)
    out = mil_eval.CONSTEXPR_OPS["constexpr_lut_to_dense"]({"indices": idx, "lut": lut, "vector_axis": torch.tensor(1)}, None)
    col = lambda u, v: [[u[i], v[i]] for i in range(3)]  # noqa: E731
    assert out.tolist() == [col(a, a) + col(b, a), col(b, b) + col(a, a)]


def test_bits_unpack_lsb_first_as_the_iOS16_ops_pack_them():
    # the op docs' example: n_bits 2, shape (5,): byte 0 = i3 i2 i1 i0 from the MSB, byte 1 holds i4 in its LSBs
    packed = torch.tensor([0b01101100, 0b00000011])
    assert mil_eval.unpack_bits(packed, 2, 5).tolist() == [0, 3, 2, 1, 3]


def test_a_mask_that_disagrees_with_its_values_is_one_line_error():
    with pytest.raises(PipelineError, match="mask sets 2 values, nonzero_data holds 3"):
        mil_eval.CONSTEXPR_OPS["constexpr_sparse_to_dense"](
            {"nonzero_data": torch.ones(3), "mask": torch.tensor([1, 0, 1, 0])}, None)


# ---------------------------------------------------------------- NeuralNetwork quantized weights

@pytest.fixture(scope="module")
def nn_models(tmp_path_factory):
    """{(layer, compression): .mlmodel}: a convolution (the convnets' quantized layers) and an inner product on
    tokens (a ViT's: its 48 linear layers are all the NeuralNetwork quantizes there), each through the same
    quantization_utils call and layer selector the export makes."""
    from coremltools.models.neural_network import quantization_utils

    from export.coreml import _LargeWeightsOnly, _kmeans_lut

    root = tmp_path_factory.mktemp("nn_compressed")
    out = {}
    for layer, prog in NN_LAYERS.items():
        base = ct.convert(prog(), convert_to="neuralnetwork", skip_model_load=True)
        for name in NN_COMPRESSED:
            mode, nbits = compression.COMPRESSIONS[name].neuralnetwork
            lut = {"lut_function": _kmeans_lut} if mode == "kmeans_lut" else {}
            model = quantization_utils.quantize_weights(base, nbits, "custom_lut" if lut else mode,
                                                        selector=_LargeWeightsOnly(quantization_utils.QuantizedLayerSelector()), **lut)
            path = root / f"{layer}-{name}.mlmodel"
            model.save(str(path))
            out[(layer, name)] = path
    return out


def _conv_prog():
    @mb.program(input_specs=[mb.TensorSpec(shape=SHAPE)], opset_version=ct.target.iOS14)
    def prog(x):
        return mb.relu(x=mb.conv(x=x, weight=W, pad_type="same"))

    return prog


TOKENS = (1, 5, 72)  # a batch of 5 tokens of width 72: the weight is 64 x 72 = 4608, above the threshold


def _linear_prog():
    @mb.program(input_specs=[mb.TensorSpec(shape=TOKENS)], opset_version=ct.target.iOS14)
    def prog(x):
        return mb.linear(x=x, weight=W.reshape(64, 72), bias=np.arange(64, dtype=np.float32) / 64)

    return prog


NN_LAYERS = {"convolution": _conv_prog, "innerProduct": _linear_prog}
NN_COMPRESSED = [n for n in compression.neuralnetwork_names()
                 if n != compression.NONE and compression.COMPRESSIONS[n].neuralnetwork]


@pytest.mark.parametrize("layer", NN_LAYERS)
@pytest.mark.parametrize("name", NN_COMPRESSED)
def test_nn_dequantisation_equals_coremltools(nn_models, layer, name):
    from coremltools.models.neural_network.quantization_utils import _dequantize_wp

    model = nn_eval.load_mlmodel(nn_models[(layer, name)])
    spec = ct.utils.load_spec(str(nn_models[(layer, name)]))
    quantized = []
    for proto, ours in zip(spec.neuralNetwork.layers, model.layer_weights):
        w = nn_eval._layer_weights(proto).get("weights")
        if w is None or not len(w.rawValue):
            continue
        quantized.append(proto.WhichOneof("layer"))
        count = nn_eval.quantized_count(proto, "weights")
        rows = getattr(proto, layer).outputChannels
        _dequantize_wp(w, (rows, count // rows))
        np.testing.assert_array_equal(ours["weights"].numpy(), np.asarray(w.floatValue, dtype=np.float32))
    assert quantized == [layer]
    assert model.precision == "fp16"


@pytest.mark.parametrize("name", NN_COMPRESSED)
def test_nn_quantized_inner_product_computes_its_dequantized_weights(nn_models, name):
    """The layer as the evaluator runs it, against F.linear on coremltools' own dequantization of its weights:
    the (C_out, C_in) order of the unpacked fields is what makes tokens come out right."""
    from coremltools.models.neural_network.quantization_utils import _dequantize_wp

    path = nn_models[("innerProduct", name)]
    spec = ct.utils.load_spec(str(path))
    layer = next(p for p in spec.neuralNetwork.layers if p.WhichOneof("layer") == "innerProduct").innerProduct
    _dequantize_wp(layer.weights, (64, 72))
    weight = torch.tensor(np.asarray(layer.weights.floatValue, dtype=np.float32)).reshape(64, 72)
    bias = torch.tensor(np.asarray(layer.bias.floatValue, dtype=np.float32))
    x = torch.from_numpy(np.random.default_rng(2).standard_normal(TOKENS).astype(np.float32))
    out = nn_eval.run_network(nn_eval.load_mlmodel(path), {"x": x}, compute="fp32")
    expected = torch.nn.functional.linear(x, weight, bias)
    torch.testing.assert_close(next(iter(out.values())).reshape(expected.shape), expected, rtol=1e-5, atol=1e-5)


def test_nn_msb_first_fields():
    # 4-bit fields 0xA, 0x3, 0xF packed MSB first: 1010 0011 | 1111 0000
    assert nn_eval.unpack_fields_msb(torch.tensor([0b10100011, 0b11110000]), 4, 3).tolist() == [10, 3, 15]
