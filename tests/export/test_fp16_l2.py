"""The encoder's L2 normalisation survives fp16 arithmetic: a NeuralNetwork (.mlmodel) computed in fp16, as an
iPad's GPU and Neural Engine run it, gives unit embeddings for features far beyond fp16's range once squared
(a sum of squares over 65504 became inf, and the embedding all zeros)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from export.encoder import Encoder
from stages.trace import trace_with_export

pytest.importorskip("coremltools")


def test_large_features_normalise_in_an_fp16_neural_network(tmp_path):
    from export import nn_eval
    from export.coreml import write_mlmodel

    torch.manual_seed(0)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 64))
    with torch.no_grad():
        backbone[1].weight.mul_(1000)  # features of norm ~1e4: their squares sum to ~1e8
    enc = Encoder(backbone, [0.5] * 3, [0.25] * 3).eval()
    x = torch.rand(4, 3, 8, 8) * 255
    with torch.no_grad():
        assert (backbone((x / 255 - 0.5) / 0.25).norm(dim=1) > 1000).all()
        ref = enc(x).numpy()
    meta = {"image_size": 8, "embedding_dim": 64, "author": "a", "license": "l", "version": "v", "description": "d",
            "method": "simclr", "backbone": "test", "mean": [0.5] * 3, "std": [0.25] * 3, "l2_normalized": True,
            "small_stem": True}
    write_mlmodel(trace_with_export(enc, x[:2]), tmp_path / "e.mlmodel", meta, "fp16", {})
    out = nn_eval.predict_images(nn_eval.load_mlmodel(tmp_path / "e.mlmodel"), x, compute="fp16")
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=5e-3)
    assert (np.linalg.norm(out - ref, axis=1) < 2e-2).all()
