"""Parity metrics against naive loops, and the gates: what passes, what fails, and that the message names the metric."""

import math

import numpy as np
import pytest
import torch

from export import parity
from export.encoder import Encoder
from train.augment import MEAN, STD
from train.backbones import build_backbone
from train.data import make_synthetic

GATES = dict(fp32_max_abs=1e-4, fp32_min_cosine=0.99999, fp16_max_rel_l2=1e-2, fp16_min_topk=0.95)


def _naive_topk(ref, out, k):
    def knn(f, i):
        sims = [(float(np.dot(f[i], f[j]) / (np.linalg.norm(f[i]) * np.linalg.norm(f[j]))), j) for j in range(len(f)) if j != i]
        sims.sort(key=lambda t: (-t[0], t[1]))
        return {j for _, j in sims[:k]}

    return float(np.mean([len(knn(ref, i) & knn(out, i)) / k for i in range(len(ref))]))


@pytest.mark.parametrize("n,d", [(5, 3), (12, 16)])
def test_per_image_metrics_match_a_naive_loop(n, d):
    rng = np.random.default_rng(n)
    ref, out = rng.standard_normal((n, d)), rng.standard_normal((n, d))
    m = parity.per_image(ref, out)
    for i in range(n):
        r, a = ref[i], out[i]
        assert m["cosine"][i] == pytest.approx(float(r @ a / (np.linalg.norm(r) * np.linalg.norm(a))))
        assert m["rel_l2"][i] == pytest.approx(float(np.linalg.norm(a - r) / np.linalg.norm(r)))
        assert m["max_abs"][i] == pytest.approx(float(np.max(np.abs(a - r))))


@pytest.mark.parametrize("n,k", [(20, 10), (15, 3), (6, 10)])
def test_topk_agreement_matches_a_naive_loop(n, k):
    rng = np.random.default_rng(k)
    ref = rng.standard_normal((n, 8))
    out = ref + 0.5 * rng.standard_normal((n, 8))
    assert parity.topk_agreement(ref, out, k) == pytest.approx(_naive_topk(ref, out, min(k, n - 1)))


def test_topk_agreement_edges():
    ref = np.random.default_rng(0).standard_normal((30, 8))
    assert parity.topk_agreement(ref, ref, 10) == 1.0
    assert parity.topk_agreement(ref[:1], ref[:1], 10) is None  # nothing to rank
    assert parity.topk_agreement(ref, ref[::-1].copy(), 10) < 0.5  # features attached to the wrong images


def _collapsed(n: int = 40, d: int = 64, spread: float = 1e-6) -> np.ndarray:
    """Features that barely differ between images: one direction plus noise far below fp16's resolution (2^-11
    of each value), as a barely trained encoder's."""
    rng = np.random.default_rng(1)
    f = rng.standard_normal(d) + spread * rng.standard_normal((n, d))
    return f / np.linalg.norm(f, axis=1, keepdims=True)


def test_the_fp16_floor_is_the_agreement_of_the_features_with_themselves_rounded_to_fp16():
    apart = np.random.default_rng(0).standard_normal((40, 64))
    assert parity.fp16_floor(apart, 10) > 0.99  # images an encoder tells apart keep their order in fp16
    collapsed = _collapsed()
    rounded = collapsed.astype(np.float16).astype(np.float64)
    assert parity.fp16_floor(collapsed, 10) == parity.topk_agreement(collapsed, rounded, 10) < 0.5
    assert parity.fp16_floor(apart[:1], 10) is None  # nothing to rank
    assert parity.compare(collapsed, collapsed)["topk_fp16_floor"] == parity.fp16_floor(collapsed, 10)


@pytest.mark.parametrize("precision", ["fp16", "compressed"])
def test_a_failed_top_k_gate_says_when_fp16_alone_cannot_keep_the_order(precision):
    """Collapsed features: the artifact's top-k fails and the phrase gives the floor (the stage then explains it
    once). Features attached to the wrong images fail top-k as well, with a floor of 1: no such phrase, the
    export is to blame."""
    gates = dict(GATES, compressed_min_topk=0.8, compressed_max_knn_drop=0.03, compressed_max_probe_drop=0.03,
                 compressed_min_cosine=0.9)
    collapsed = _collapsed()
    noisy = collapsed + 1e-3 * np.random.default_rng(2).standard_normal(collapsed.shape) / 8  # rel-L2 ~1e-3
    fails = parity.gate_failures(parity.compare(collapsed, noisy), precision, **gates)
    floor = parity.fp16_floor(collapsed, 10)
    assert [f for f in fails if f.startswith("top10_agreement")] == [
        f"top10_agreement {parity.topk_agreement(collapsed, noisy, 10):.3f} < {0.95 if precision == 'fp16' else 0.8:g} "
        f"({parity.UNRESOLVED} {floor:.3f})"]
    apart = np.random.default_rng(0).standard_normal((40, 64))
    fails = parity.gate_failures(parity.compare(apart, apart[::-1].copy()), precision, **gates)
    assert any(f.startswith("top10_agreement") for f in fails) and not any(parity.UNRESOLVED in f for f in fails)


def test_compare_reports_shape_and_non_finite_instead_of_numbers():
    ref = np.ones((4, 3))
    assert "error" in parity.compare(ref, np.ones((4, 2)))
    bad = ref.copy()
    bad[1, 2] = np.nan
    m = parity.compare(ref, bad)
    assert "non-finite" in m["error"]
    assert parity.gate_failures(m, "fp16", **GATES) == [m["error"]]


def test_fp32_gates():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((16, 32))
    assert parity.gate_failures(parity.compare(ref, ref + 1e-6), "fp32", **GATES) == []
    fails = parity.gate_failures(parity.compare(ref, ref + 1e-3), "fp32", **GATES)
    assert len(fails) == 1 and fails[0].startswith("max_abs")  # cosine is still ~1: only max abs catches it


def test_fp16_gates():
    rng = np.random.default_rng(2)
    ref = rng.standard_normal((40, 32))
    near = ref * (1 + 1e-3 * rng.standard_normal(ref.shape))
    assert parity.gate_failures(parity.compare(ref, near), "fp16", **GATES) == []
    far = ref + 0.05 * np.abs(ref).mean() * rng.standard_normal(ref.shape)
    fails = parity.gate_failures(parity.compare(ref, far), "fp16", **GATES)
    assert any(f.startswith("worst_rel_l2") for f in fails)
    shuffled = ref.copy()
    shuffled[[0, 1]] = shuffled[[1, 0]]  # two images' features swapped: each still "close" to some reference row
    fails = parity.gate_failures(parity.compare(ref, shuffled), "fp16", **GATES)
    assert any(f.startswith("worst_rel_l2") for f in fails)
    with pytest.raises(ValueError):
        parity.gate_failures(parity.compare(ref, ref), "int8", **GATES)


def test_rgb_bgr_swap_keeps_cosine_high_but_fails_the_gates():
    """The issue's point: on a random-init ResNet a channel swap still looks "similar" by cosine."""
    torch.manual_seed(0)
    backbone, _ = build_backbone("resnet18", small_stem=True)
    enc = Encoder(backbone, MEAN, STD).eval()
    x = make_synthetic(24, 16, seed=0).images.float()  # coloured textures
    with torch.no_grad():
        ref, swapped = enc(x).numpy(), enc(x.flip(1)).numpy()
    m = parity.compare(ref, swapped)
    assert m["worst_cosine"] > 0.95
    fp16 = parity.gate_failures(m, "fp16", **GATES)
    assert any(f.startswith("worst_rel_l2") for f in fp16), m
    assert parity.gate_failures(m, "fp32", **GATES)


def test_every_field_of_the_report_by_hand():
    """compare's whole report (what validate writes into parity.json), every field worked out by hand."""
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
                      "topk_agreement", "topk_fp16_floor", "worst_image", "per_image"}


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


def test_zero_rows_without_warnings():
    """An all-zero feature row (a dead ReLU output): equal zeros are a match, a zero on one side is the worst
    cosine and an infinite (or 1.0) relative error; no division warning escapes."""
    import warnings

    ref = np.array([[0.0, 0.0], [0.0, 0.0], [3.0, 4.0], [1.0, 1.0]])
    out = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = parity.per_image(ref, out)
    assert m["cosine"].tolist() == pytest.approx([1.0, 0.0, 0.0, 1.0])
    assert m["rel_l2"].tolist() == [0.0, math.inf, 1.0, 0.0]
    assert m["max_abs"].tolist() == [0.0, 1.0, 4.0, 0.0]


def test_neighbour_ties_go_to_the_lower_index_and_zero_rows_tie_with_everything():
    """40 equal features: every other row ties, so each query's neighbours are the lowest other indices (a
    quicksort would shuffle them). A zero row is similar (0) to every row, so it is never nearer than a real match."""
    same = np.ones((40, 4))
    expected = [[j for j in range(40) if j != i][:10] for i in range(40)]
    assert parity.neighbours(same, 10).tolist() == expected
    feats = np.array([[1.0, 0.0], [0.0, 0.0], [2.0, 0.1], [0.0, 1.0]])
    assert parity.neighbours(feats, 3).tolist() == [[2, 1, 3], [0, 2, 3], [0, 3, 1], [2, 0, 1]]


def test_two_images_are_each_others_only_neighbour():
    ref = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert parity.topk_agreement(ref, ref, 10) == 1.0
    m = parity.compare(ref, ref)
    assert m["top_k"] == 1 and m["topk_agreement"] == 1.0


def test_any_output_layout_and_dtype_is_compared_as_float64_rows():
    """N x D x 1 x 1 (a conv head) is N rows of D; float32 features are measured in float64, not in their own
    precision (which would round the very errors being measured)."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((6, 300)).astype(np.float32)
    out = (ref + 1e-4 * rng.standard_normal(ref.shape)).astype(np.float32)
    flat = parity.compare(ref.astype(np.float64), out.astype(np.float64))
    assert parity.compare(ref, out) == flat
    assert parity.compare(ref.reshape(6, 300, 1, 1), out.reshape(6, 300, 1, 1)) == flat
    assert parity.compare(ref.reshape(6, 3, 10, 10), out.reshape(6, 3, 10, 10)) == flat


def test_features_of_width_zero():
    m = parity.per_image(np.zeros((3, 0)), np.zeros((3, 0)))
    assert m["max_abs"].tolist() == [0.0, 0.0, 0.0] and m["cosine"].tolist() == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------- compressed artifacts: gated on use

def _naive_knn_top1(feats, labels, k):
    f = feats / np.linalg.norm(feats, axis=1, keepdims=True)
    hits = 0
    for i in range(len(f)):
        others = [(-(f[i] @ f[j]), j) for j in range(len(f)) if j != i]
        nearest = [j for _, j in sorted(others)[:k]]
        votes = {c: sum(labels[j] == c for j in nearest) for c in sorted(set(labels))}
        best = max(votes.values())
        hits += min(c for c, v in votes.items() if v == best) == labels[i]
    return hits / len(f)


@pytest.mark.parametrize("k", [1, 3, 10])
def test_knn_top1_matches_a_naive_loop(k):
    rng = np.random.default_rng(k)
    labels = rng.integers(0, 3, 40)
    feats = rng.standard_normal((40, 6)) + labels[:, None]
    assert parity.knn_top1(feats, labels, k) == pytest.approx(_naive_knn_top1(feats, labels, k))


def test_knn_top1_votes_every_other_image_when_k_reaches_past_them():
    """k = 10 among 7 images: every image's 6 others vote, never itself (these features tell the three apart: 0.0,
    against 1/7 with 5 voters and 3/7 with the image's own vote counted)."""
    rng = np.random.default_rng(14)
    labels = rng.integers(0, 3, 7)
    feats = rng.standard_normal((7, 4)) + labels[:, None]
    assert parity.knn_top1(feats, labels, 10) == _naive_knn_top1(feats, labels, 6) == 0.0
    assert _naive_knn_top1(feats, labels, 5) == pytest.approx(1 / 7)


def test_use_metrics_of_the_fewest_images_they_read():
    """Two labelled images: each one's only neighbour votes (k 1), and every field is there by name; fewer: none."""
    ref = np.array([[1.0, 0.0], [0.9, 0.1]])
    assert parity.use_metrics(ref, ref, np.array([0, 0]), 10) == {"labelled_images": 2, "knn_k": 1,
                                                                  "knn_top1_ref": 1.0, "knn_top1": 1.0,
                                                                  "knn_drop": 0.0}
    assert parity.use_metrics(ref[:1], ref[:1], np.array([0]), 10) == {}


def test_use_metrics_see_knn_lose_its_answers():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 20)
    ref = np.eye(4)[labels] * 3 + 0.3 * rng.standard_normal((80, 4))
    same = parity.use_metrics(ref, ref + 1e-6, labels, 10)
    assert same["knn_drop"] == 0 and same["knn_top1_ref"] > 0.9
    shuffled = ref[rng.permutation(80)]  # every image answered with a random image's features
    assert parity.use_metrics(ref, shuffled, labels, 10)["knn_drop"] > 0.5
    assert parity.use_metrics(ref, ref, None, 10) == {}


def _unit(a):
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _one_direction(seed=0, n_train=240, n_val=120, classes=6, dim=48, quiet=32):
    """Features like the trained MobileNet's: every image near one direction (mean cosine ~0.97), the class signal
    in small deviations, and `quiet` dimensions whose spread (class signal included) is a hundredth of the others'.
    (train features, train labels, val features, val labels)."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((classes, dim)) * 0.03
    spread = np.where(np.arange(dim) >= dim - quiet, 0.01, 1.0)
    axis = np.eye(dim)[0]

    def feats(y):
        return _unit(axis + (centres[y] + 0.04 * rng.standard_normal((len(y), dim))) * spread)

    ty, vy = np.arange(n_train) % classes, np.arange(n_val) % classes
    return feats(ty), ty, feats(vy), vy


def test_each_models_own_probe_keeps_its_answers_when_every_feature_moves_alike():
    """The case the probe gate exists to get right: compressed weights move every image's feature by the same small
    vector (cosine 0.99996, every neighbour kept). A probe fitted on the fp32 features and fed the moved ones loses
    nearly half its answers, as the fp32-fitted gate measured; the artifact's own probe, fitted on its own train
    features, answers as the fp32 encoder's own does."""
    from train.probe import fit_probe

    tr, ty, va, vy = _one_direction()
    shift = np.where(np.arange(48) >= 16, np.random.default_rng(1).standard_normal(48) * 0.002, 0.0)
    out_tr, out_va = _unit(tr + shift), _unit(va + shift)
    ref = parity.reference_probe(tr, ty, va, vy, 0.2, seed=0)
    m = parity.probe_metrics(ref, out_tr, ty, out_va, vy)
    assert ref["top1"] > 0.95 and m["probe_top1_ref"] == ref["top1"] and m["probe_c"] == ref["c"]
    assert m["probe_drop"] == 0.0
    assert parity.per_image(va, out_va)["cosine"].min() > 0.9999 and parity.topk_agreement(va, out_va, 10) == 1.0
    fp32_fitted = (fit_probe(tr, ty, ref["c"]).predict(out_va) == vy).mean()
    assert ref["top1"] - fp32_fitted > 0.3  # what the fp32-fitted probe made of the same artifact


@pytest.mark.parametrize("noise,fails", [(0.0, False), (0.03, True)])
def test_each_models_own_probe_sees_an_artifact_lose_class_information(noise, fails):
    """Noise of every image's own in the features (what pruning without fine-tuning does) takes information an own
    probe cannot get back: its drop passes the gate at none and fails it at a few times the class signal's scale."""
    tr, ty, va, vy = _one_direction(seed=2)
    rng = np.random.default_rng(3)
    out_tr, out_va = (_unit(x + noise * rng.standard_normal(x.shape)) for x in (tr, va))
    m = parity.probe_metrics(parity.reference_probe(tr, ty, va, vy, 0.2, seed=0), out_tr, ty, out_va, vy)
    assert m["labelled_images"] == len(vy) == 120
    failures = parity.gate_failures({"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, **m}, "compressed",
                                    **GATES, compressed_min_topk=0.8, compressed_max_knn_drop=0.03,
                                    compressed_max_probe_drop=0.03, compressed_min_cosine=0.9)
    if fails:
        assert m["probe_drop"] > 0.1 and failures == [f"probe_drop {m['probe_drop']:.3f} > 0.03"]
    else:
        assert m["probe_drop"] == 0.0 and failures == []


def test_a_drop_bound_needs_the_images_that_resolve_it():
    """A drop is a count of images over n: 0.03 is resolved by 34 images (1/34 <= 0.03 < 1/33), 0.05 by exactly
    20, and a bound of 0 by none (no image may change, at any n); several bounds by the count of the strictest."""
    assert [parity.labelled_needed(b) for b in (0.03, 0.05, 0.1, 0.5, 1.0, 0.0)] == [34, 20, 10, 2, 1, None]
    assert 1 / 34 <= 0.03 < 1 / 33
    assert parity.labelled_needed(0.2, 0.03) == 34 and parity.labelled_needed(0.0, 0.1, None) == 10  # the strictest
    assert parity.labelled_needed() is None


GATES_COMPRESSED = dict(GATES, compressed_min_topk=0.8, compressed_max_knn_drop=0.03, compressed_max_probe_drop=0.03,
                        compressed_min_cosine=0.9)


def test_a_drop_gate_says_when_one_image_alone_exceeds_it():
    """Eight labelled val images, one of them moved to another class's features: the kNN answer of that image
    flips, a drop of exactly 1/8, and the failure says the gate was read on too few images to tell one image from
    a loss. On 34 or more the phrase is gone: a failed drop there is more than one image."""
    labels = np.repeat(np.arange(2), 4)
    ref = np.eye(2)[labels] + 0.01 * np.arange(8)[:, None]
    out = ref.copy()
    out[0] = ref[7]  # image 0 (class 0) now looks like class 1
    m = {"topk_agreement": 1.0, "top_k": 7, "worst_cosine": 1.0, **parity.use_metrics(ref, out, labels, 3)}
    assert m["knn_drop"] == 1 / 8 and m["labelled_images"] == 8
    assert parity.gate_failures(m, "compressed", **GATES_COMPRESSED) == [
        f"knn_drop 0.125 > 0.03 (8 {parity.FEW_LABELLED} 0.125)"]
    for n, drops, phrased in ((33, 1, True), (34, 2, False), (120, 5, False)):
        m = {"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, "labelled_images": n, "knn_drop": drops / n}
        fails = parity.gate_failures(m, "compressed", **GATES_COMPRESSED)
        assert len(fails) == 1 and (parity.FEW_LABELLED in fails[0]) == phrased
    probe = {"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, "labelled_images": 8, "probe_drop": 0.25}
    assert parity.gate_failures(probe, "compressed", **GATES_COMPRESSED) == [
        f"probe_drop 0.250 > 0.03 (8 {parity.FEW_LABELLED} 0.125)"]
    one_in_34 = {"topk_agreement": 1.0, "top_k": 10, "worst_cosine": 1.0, "labelled_images": 34, "knn_drop": 1 / 34}
    assert parity.gate_failures(one_in_34, "compressed", **GATES_COMPRESSED) == []


def test_no_reference_probe_without_two_classes_or_an_image_to_hold_out():
    x = np.random.default_rng(0).standard_normal((6, 3))
    assert parity.reference_probe(x, np.zeros(6), x, np.zeros(6), 0.2, 0) is None
    assert parity.reference_probe(x[:3], np.arange(3), x, np.arange(6) % 3, 0.2, 0) is None  # one image a class
    assert parity.reference_probe(x, np.arange(6) % 2, x, np.arange(6) % 2, 0.2, 0)["c"] is not None
    # two images of one class are enough to hold one out
    assert parity.reference_probe(x[:3], np.array([0, 0, 1]), x[:3], np.array([0, 0, 1]), 0.2, 0) is not None


def test_compressed_gates_name_each_failed_metric():
    gates = dict(fp32_max_abs=1e-4, fp32_min_cosine=0.99999, fp16_max_rel_l2=1e-2, fp16_min_topk=0.95,
                 compressed_min_topk=0.8, compressed_max_knn_drop=0.03, compressed_max_probe_drop=0.03,
                 compressed_min_cosine=0.9)
    ok = {"topk_agreement": 0.85, "top_k": 10, "worst_cosine": 0.95, "knn_drop": 0.01, "probe_drop": -0.01,
          "worst_rel_l2": 0.3, "max_abs": 0.1}
    assert parity.gate_failures(ok, "compressed", **gates) == []
    assert parity.gate_failures(ok, "fp16", **gates)  # the same numbers fail as an fp16 file
    bad = {**ok, "topk_agreement": 0.5, "worst_cosine": 0.7, "knn_drop": 0.1, "probe_drop": 0.2}
    assert parity.gate_failures(bad, "compressed", **gates) == [
        "top10_agreement 0.500 < 0.8", "worst_cosine 0.7000 < 0.9", "knn_drop 0.100 > 0.03", "probe_drop 0.200 > 0.03"]
    at_bounds = {**ok, "topk_agreement": 0.8, "worst_cosine": 0.9, "knn_drop": 0.03, "probe_drop": 0.03}
    assert parity.gate_failures(at_bounds, "compressed", **gates) == []  # each bound itself passes
    assert parity.gate_failures({**ok, "topk_agreement": None}, "compressed", **gates) == [
        "top-k agreement needs at least 2 images"]
    with pytest.raises(ValueError, match="^compressed artifacts need all four compressed_\\* gates$"):
        parity.gate_failures(ok, "compressed", fp32_max_abs=1, fp32_min_cosine=1, fp16_max_rel_l2=1, fp16_min_topk=1)
