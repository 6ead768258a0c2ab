"""parity.compare's whole report (what validate writes into parity.json) on values worked out by hand, including
the empty set and the error reports. test_parity.py checks the metrics against loops; this checks every field."""

import math

import numpy as np
import pytest

from export import parity


def test_every_field_of_the_report_by_hand():
    ref = np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    out = np.array([[1.0, 0.0], [0.0, 2.2], [4.0, 3.0]])
    # row 0 equal; row 1 scaled by 1.1 (cos 1, rel 0.1, max abs 0.2); row 2 swapped (cos 24/25, rel sqrt2/5, max abs 1)
    m = parity.compare(ref, out, top_k=10)
    assert m["images"] == 3
    assert m["worst_cosine"] == pytest.approx(0.96)
    assert m["mean_cosine"] == pytest.approx((1 + 1 + 0.96) / 3)
    assert m["worst_rel_l2"] == pytest.approx(math.sqrt(2) / 5)
    assert m["mean_rel_l2"] == pytest.approx((0 + 0.1 + math.sqrt(2) / 5) / 3)
    assert m["max_abs"] == pytest.approx(1.0)
    assert m["top_k"] == 2 and m["topk_agreement"] == 1.0  # k clamped to N - 1: each image's two others
    assert m["worst_image"] == 2
    assert m["per_image"]["cosine"] == pytest.approx([1, 1, 0.96])
    assert m["per_image"]["rel_l2"] == pytest.approx([0, 0.1, math.sqrt(2) / 5])
    assert m["per_image"]["max_abs"] == pytest.approx([0, 0.2, 1.0])
    assert set(m) == {"images", "worst_cosine", "mean_cosine", "worst_rel_l2", "mean_rel_l2", "max_abs", "top_k",
                      "topk_agreement", "worst_image", "per_image"}


def test_default_top_k_is_10():
    ref = np.random.default_rng(0).standard_normal((15, 4))
    assert parity.compare(ref, ref)["top_k"] == 10


def test_no_images():
    m = parity.compare(np.zeros((0, 4)), np.zeros((0, 4)))
    assert m["images"] == 0 and m["top_k"] == 0
    for key in ("worst_cosine", "mean_cosine", "worst_rel_l2", "mean_rel_l2", "max_abs", "topk_agreement", "worst_image"):
        assert m[key] is None, key
    assert m["per_image"] == {"cosine": [], "rel_l2": [], "max_abs": []}


def test_one_image_has_no_neighbours():
    m = parity.compare(np.ones((1, 3)), np.ones((1, 3)))
    assert m["images"] == 1 and m["top_k"] == 0 and m["topk_agreement"] is None
    assert m["worst_cosine"] == pytest.approx(1.0) and m["worst_image"] == 0


def test_errors_name_the_shapes_and_the_count():
    assert parity.compare(np.ones((2, 4)), np.ones((2, 3))) == {"error": "output shape (2, 3) != reference (2, 4)"}
    bad = np.ones((3, 4))
    bad[0, 1], bad[2, 3] = np.nan, np.inf
    assert parity.compare(np.ones((3, 4)), bad) == {"error": "2 non-finite values in the output"}
