"""Held out means held out: no val row enters a fit, a bank, a selection or a normalisation statistic, wherever a
number is reported on val images.

Spies (tests/heldout_spies.py) record what each learner receives: every probe fit and the StandardScaler and
logistic regression inside it, C's selection, every kNN bank (linear-eval's weighted and majority votes, the few-label
draws, the pretraining monitor), the report's retrieval bank and embedding maps, validate's images. Each is held to
exactly the train rows of the split. Beside the spies, a test that knows no mechanism: poisoning half of val moves
no fit and not one score of the other half's rows, so no statistic over val rows (a scaler refit on val, a bank with
val in it) can hide. Planted duplicates prove the checks can see a leak: a val image copied into train is found by
the bank as its nearest neighbour, one copied within val never is. And every number reported on val images (the
probe's top-1 and top-5, the C it was fitted at, the few-label means and gains, the retrieval grid's marks and
counts, the maps' sample and explained variance) is recomputed here from outside the function that reports it.

Small feature arrays and hand-made run directories only: these tests are in `make mutation`'s selection.
tests/stages/test_heldout_stages.py runs the same checks through the stages on tiny trained runs.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import yaml

from core import rundir
from core.config import load_config, to_dict
from core.errors import PipelineError
from train import knn, probe
from stages import linear_eval as le
from train.augment import center_views
from train.configs import EvalConfig, PretrainConfig
from train.data import load_data, make_split
from tests.heldout_spies import assert_learned_from, positions, spy


def _blobs(n_train=48, n_val=24, classes=4, dim=8, seed=0):
    """Noisy class blobs (so C has something to decide), train and val as float32 tensors."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, dim)) * 2
    ty, vy = np.arange(n_train) % classes, np.arange(n_val) % classes
    tx = centres[ty] + rng.normal(size=(n_train, dim)) * 1.5
    vx = centres[vy] + rng.normal(size=(n_val, dim)) * 1.5
    return torch.tensor(tx, dtype=torch.float32), ty, torch.tensor(vx, dtype=torch.float32), vy


# --- linear-eval's probes: the linear probe, its C selection, the weighted and majority kNN

def test_every_fit_scaler_and_bank_of_the_probes_is_train_rows_only(monkeypatch):
    tx, ty, vx, vy = _blobs()
    seen = spy(monkeypatch)
    selected = []
    real = le.choose_c
    monkeypatch.setattr(le, "choose_c", lambda x, y, *a: selected.append((x, y)) or real(x, y, *a))
    le.probes(tx, ty, vx, vy, 4, load_config(EvalConfig), seed=0)
    assert_learned_from(seen, tx, ty, vx)
    assert len(selected) == 1 and np.array_equal(selected[0][0], tx.double().numpy())  # C chosen on train alone
    assert len(seen.fits) == len(probe.C_GRID) + 1  # one held-out part per C, then the refit
    final_x, final_y = seen.fits[-1]
    assert np.array_equal(final_x, tx.double().numpy()) and np.array_equal(final_y, ty)  # refit on all of train
    assert len(seen.banks) == 2  # weighted, majority
    for bank, labels, queries in seen.banks:
        assert torch.equal(bank, tx) and torch.equal(labels, torch.from_numpy(ty)) and torch.equal(queries, vx)


def test_poisoned_val_rows_move_no_fit_and_no_other_rows_score(monkeypatch):
    """Half of val replaced by far-off noise with shuffled labels: every fit and every bank is the same, and each
    untouched val row's linear and kNN scores are the same to the last bit. A statistic over val rows (a scaler
    fitted on val, a bank holding val, a C scored on val) would move them."""
    tx, ty, vx, vy = _blobs(seed=1)
    keep = len(vx) // 2
    poisoned_x, poisoned_y = vx.clone(), vy.copy()
    poisoned_x[keep:] = 40 * torch.randn(len(vx) - keep, vx.shape[1], generator=torch.Generator().manual_seed(9))
    poisoned_y[keep:] = (vy[keep:] + 1) % 4
    runs = []
    for x, y in ((vx, vy), (poisoned_x, poisoned_y)):
        with monkeypatch.context() as m:
            seen = spy(m)
            le.probes(tx, ty, x, y, 4, load_config(EvalConfig), seed=0)
        runs.append(seen)
    clean, poisoned = runs
    assert len(clean.fits) == len(poisoned.fits) and len(clean.scores) == len(poisoned.scores) == 3
    for (a, ay), (b, by) in zip(clean.fits, poisoned.fits):
        assert np.array_equal(a, b) and np.array_equal(ay, by)
    for (a, *_), (b, *_) in zip(clean.banks, poisoned.banks):
        assert torch.equal(a, b)
    for (a, _), (b, _) in zip(clean.scores, poisoned.scores):  # linear, weighted kNN, majority kNN
        assert torch.equal(a[:keep], b[:keep])
        assert not torch.equal(a[keep:], b[keep:])  # the poisoned rows did change: the comparison can see it


def test_few_label_draws_fit_and_vote_on_their_own_train_rows_only(monkeypatch):
    tx, ty, vx, vy = _blobs(n_train=60, seed=2)
    feats = {"pretrained": (tx, vx), "random": (tx.flip(1), vx.flip(1))}
    cfg = EvalConfig(labels_per_class=3, label_draws=3)
    drawn = []
    real = le.per_class_subset
    monkeypatch.setattr(le, "per_class_subset", lambda labels, *a: drawn.append((labels, real(labels, *a))) or drawn[-1][1])
    seen = spy(monkeypatch)
    le.few_label_probes(feats, ty, vy, 4, list("abcd"), cfg, seed=0)
    assert len(drawn) == 3
    fits_per_probe, nth = len(probe.C_GRID) * 3 + 1, 0  # 3 a class: stratified 3-fold for each C, then the refit
    assert len(seen.fits) == 3 * 2 * fits_per_probe and len(seen.banks) == 3 * 2 * 2
    for d, (labels, rows) in enumerate(drawn):
        assert labels is ty  # drawn from the train labels, nothing else
        assert np.bincount(ty[rows]).tolist() == [3] * 4 and rows.max() < len(ty)
        for w in ("pretrained", "random"):
            part = feats[w][0][torch.as_tensor(rows)]
            fits = seen.fits[nth * fits_per_probe:(nth + 1) * fits_per_probe]
            for x, y in fits:  # every fit of this probe: rows of this draw only
                pos = positions(x, part)
                assert (pos >= 0).all() and np.array_equal(y, ty[rows][pos])
            assert np.array_equal(fits[-1][0], part.double().numpy())  # the refit: the whole draw
            for bank, bank_y, queries in seen.banks[2 * nth: 2 * nth + 2]:
                assert torch.equal(bank, part) and torch.equal(bank_y, torch.from_numpy(ty[rows]))
                assert torch.equal(queries, feats[w][1])
            nth += 1
    assert len(seen.scalers) == len(seen.classifiers) == len(seen.fits)  # each scaler on its own fit's rows
    assert all(at is not None and np.array_equal(x, seen.fits[at][0]) for x, at in seen.scalers)


def _noisy_eight_classes():
    """8 classes of blobs, val drowned in noise: the refit probe's top-1, top-2, top-5 and top-6 on val all differ,
    and the C grid's held-out scores on train differ, with ties, so a selection or a score that ranks the wrong way
    shows. Train and val as float64 arrays, as probes() hands them to the linear probe."""
    tx, ty, vx, vy = _blobs(n_train=80, n_val=40, classes=8, seed=3)
    return tx.double().numpy(), ty, vx.double().numpy() + 6 * np.random.default_rng(0).normal(size=vx.shape), vy


def test_c_is_the_smallest_of_the_best_scored_on_held_out_train_rows():
    x, y, _, _ = _noisy_eight_classes()
    sel = le.choose_c(x, y, 0.2, seed=0)
    _, splits = probe.selection_splits(y, 0.2, seed=0)
    scores = {c: np.mean([probe.fit_probe(x[fit], y[fit], c).score(x[held], y[held]) for fit, held in splits]) for c in probe.C_GRID}
    best = max(scores.values())
    assert len(set(scores.values())) > 2 and sum(s == best for s in scores.values()) > 1  # the grid decides, with a tie
    assert sel == {"c": min(c for c in probe.C_GRID if scores[c] == best), "method": "holdout",
                   "holdout_top1_by_c": {f"{c:g}": pytest.approx(s) for c, s in scores.items()},
                   "fit_size": len(splits[0][0]), "holdout_size": len(splits[0][1])}
    folds = le.choose_c(x[:24], y[:24], 0.2, seed=0)  # 3 a class: stratified 3-fold, sizes per fold
    assert folds.keys() == {"c", "method", "holdout_top1_by_c", "fit_size_per_fold", "holdout_size_per_fold"}
    assert (folds["fit_size_per_fold"], folds["holdout_size_per_fold"]) == ([16] * 3, [8] * 3)
    with pytest.raises(PipelineError, match=r"^every class has a single labelled train image: none can be held out to choose C$"):
        le.choose_c(x[:8], y[:8], 0.2, seed=0)
    assert le.choose_c(x[:9], y[:9], 0.2, seed=0)["holdout_size"] == 1  # one class of two: C is scored on its second


def test_the_linear_probe_scores_val_with_its_own_predictions(monkeypatch):
    """top-1 and top-5 are the refit probe's own ranking of each val row, a class missing from the train rows is
    never predicted, top-5 is reported above 5 classes only, and a fit stopped by MAX_ITER is recorded."""
    x, y, vx, vy = _noisy_eight_classes()
    res = le.linear_probe(x, y, vx, vy, 8, 0.2, seed=0)
    model = probe.fit_probe(x, y, res["selection"]["c"])
    ranked = model.classes_[np.argsort(-model.predict_proba(vx), axis=1, kind="stable")]
    hits = {k: float((ranked[:, :k] == vy[:, None]).any(axis=1).mean()) for k in (1, 2, 5, 6)}
    assert hits[1] < hits[2] and hits[5] < hits[6]  # the data tells k from k + 1
    assert (res["top1"], res["top5"]) == pytest.approx((hits[1], hits[5]))
    assert res["selection"] == {**le.choose_c(x, y, 0.2, seed=0), "converged": True}
    seen = y != 7  # val images of a class the train rows lack
    missing = le.linear_probe(x[seen], y[seen], vx, vy, 8, 0.2, seed=0)
    model = probe.fit_probe(x[seen], y[seen], missing["selection"]["c"])
    assert missing["top1"] == pytest.approx(float((model.predict(vx) == vy).mean()))
    for classes in (5, 6):
        rows, val_rows = y < classes, vy < classes
        top5 = le.linear_probe(x[rows], y[rows], vx[val_rows], vy[val_rows], classes, 0.2, seed=0)["top5"]
        assert (top5 is None) == (classes == 5), classes  # with 5 classes it would be 100 % whatever the features
    monkeypatch.setattr(probe, "MAX_ITER", 2)
    monkeypatch.setattr(le, "MAX_ITER", 2)
    assert le.linear_probe(x, y, vx, vy, 8, 0.2, seed=0)["selection"]["converged"] is False


def test_the_probe_fits_at_its_c_on_one_blas_thread_and_stops_quietly_at_max_iter(monkeypatch):
    """The C given is the C fitted (weaker L2, larger weights); BLAS runs on one thread during the fit, so the fit
    cannot depend on the core count; a fit cut at MAX_ITER warns no one (linear_probe records it instead)."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_info

    tx, ty, _, _ = _blobs()
    x = tx.double().numpy()
    weights = [np.abs(probe.fit_probe(x, ty, c)[-1].coef_).sum() for c in probe.C_GRID]
    assert weights == sorted(weights) and weights[0] < weights[-1] / 10
    threads = []
    real = LogisticRegression.fit
    monkeypatch.setattr(LogisticRegression, "fit", lambda self, *a, **k: threads.extend(
        i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas") or real(self, *a, **k))
    monkeypatch.setattr(probe, "MAX_ITER", 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = probe.fit_probe(x, ty, 10.0)
    assert model[-1].n_iter_.max() == 2 and threads and set(threads) == {1}


def test_selection_splits_hold_out_per_class_and_use_k_fold_for_small_classes():
    labels = np.repeat(np.arange(4), [1, 2, 10, 20])
    for fraction, held_per_class in ((0.1, [0, 1, 1, 2]), (0.5, [0, 1, 5, 10]), (0.99, [0, 1, 9, 19])):
        fit, held = probe.holdout_split(labels, fraction, seed=0)  # at least one held out, at least one left to fit
        assert sorted(np.concatenate([fit, held]).tolist()) == list(range(len(labels)))
        assert np.bincount(labels[held], minlength=4).tolist() == held_per_class, fraction
    for smallest, method in ((1, "holdout"), (2, "stratified 2-fold"), (9, "stratified 5-fold"), (10, "holdout")):
        assert probe.selection_splits(np.repeat([0, 1], [smallest, 20]), 0.2, seed=0)[0] == method, smallest


def test_per_class_subset_is_seeded_and_names_a_class_too_small_for_k():
    labels = np.repeat([0, 1, 2], [6, 4, 5])  # the smallest class is not the first
    classes = ["cat", "dog", "owl"]
    rows = le.per_class_subset(labels, 4, 3, classes, draw=1)
    assert np.bincount(labels[rows]).tolist() == [4, 4, 4]  # K = the smallest class's count is allowed
    assert np.array_equal(rows, le.per_class_subset(labels, 4, 3, classes, draw=1))
    assert not np.array_equal(rows, le.per_class_subset(labels, 4, 3, classes, draw=2))
    with pytest.raises(PipelineError, match=r"^--labels-per-class 5 is more than the 4 train images of class 'dog': use at most 4$"):
        le.per_class_subset(labels, 5, 3, classes)
    with pytest.raises(PipelineError, match=r"of class '3': use at most 2$"):  # a label beyond the class names
        le.per_class_subset(np.repeat([0, 3], [5, 2]), 3, 0, classes)
    feats = {w: (torch.zeros(len(labels), 2), torch.zeros(3, 2)) for w in ("pretrained", "random")}
    with pytest.raises(PipelineError, match="class 'dog'"):
        le.few_label_probes(feats, labels, np.arange(3), 3, classes, EvalConfig(labels_per_class=5), seed=0)


def test_few_label_results_are_their_draws_seeded_by_the_run_seed(monkeypatch):
    """Each draw its own rows, drawn again the same from the seed; C's selection seeded by it too; the reported
    means, stds and paired gains are those of the per-draw results, whose selections are recorded draw by draw."""
    tx, ty, vx, vy = _blobs(n_train=60, seed=2)
    feats = {"pretrained": (tx, vx), "random": (tx.flip(1), vx.flip(1))}
    cfg = EvalConfig(labels_per_class=3, label_draws=2)
    seeds, selections, drawn = [], [], []
    real_choose, real_probes, real_subset = le.choose_c, le.probes, le.per_class_subset
    monkeypatch.setattr(le, "choose_c", lambda x, y, fraction, seed: seeds.append(seed) or real_choose(x, y, fraction, seed))
    monkeypatch.setattr(le, "probes", lambda *a: (lambda r: selections.append(dict(r["selection"])) or r)(real_probes(*a)))
    monkeypatch.setattr(le, "per_class_subset", lambda *a: drawn.append(real_subset(*a)) or drawn[-1])
    few = le.few_label_probes(feats, ty, vy, 4, list("abcd"), cfg, seed=7)
    assert seeds == [7] * 4
    assert [d.tolist() for d in drawn] == [real_subset(ty, 3, 7, list("abcd"), d).tolist() for d in range(2)]
    assert drawn[0].tolist() != drawn[1].tolist()
    assert few.keys() == {"k", "num_train", "draws", *le.METRICS, "baseline", "std", "gain", "gain_std", "knn_k_used",
                          "majority_k_used", "per_draw", "linear_selection"}
    assert (few["k"], few["num_train"], few["draws"], len(few["per_draw"])) == (3, 12, 2, 2)
    assert few["linear_selection"] == [{"pretrained": selections[2 * d], "baseline": selections[2 * d + 1]} for d in range(2)]
    for m in le.METRICS:
        pre, base = [r[m] for r in few["per_draw"]], [r["baseline"][m] for r in few["per_draw"]]
        if m == "top5":  # 4 classes
            assert {few[m], few["gain"][m], few["std"]["baseline"][m]} == {None}
            continue
        diff = np.subtract(pre, base)
        assert (few[m], few["baseline"][m], few["gain"][m], few["gain_std"][m]) == pytest.approx(
            (np.mean(pre), np.mean(base), np.mean(diff), np.std(diff)))
        assert (few["std"]["pretrained"][m], few["std"]["baseline"][m]) == pytest.approx((np.std(pre), np.std(base)))


# --- validate's probe gate: each model's own probe, on its own train rows

def _two_models(seed=3):
    """The fp32 encoder's rows and a compressed artifact's (the same images, every feature moved a little),
    train then val, float64 as parity receives them."""
    tx, ty, vx, vy = _blobs(seed=seed)
    move = np.random.default_rng(seed).normal(size=tx.shape[1]) * 0.05
    fp32 = (tx.double().numpy(), vx.double().numpy())
    return fp32, (fp32[0] + move, fp32[1] + move), ty, vy


def test_validates_probes_fit_each_models_own_train_rows_only(monkeypatch):
    from export import parity
    from train.probe import C_GRID

    fp32, artifact, ty, vy = _two_models()
    seen = spy(monkeypatch)
    reference = parity.reference_probe(fp32[0], ty, fp32[1], vy, 0.2, seed=0)
    assert len(seen.fits) == len(C_GRID) + 1  # C's selection on one held-out part of fp32's train rows, the refit
    parity.probe_metrics(reference, artifact[0], ty, artifact[1], vy)
    assert_learned_from(seen, np.concatenate([fp32[0], artifact[0]]), np.concatenate([ty, ty]),
                        np.concatenate([fp32[1], artifact[1]]), banks=False)
    *selection, fp32_refit, own = seen.fits
    assert all((positions(x, fp32[0]) >= 0).all() for x, _ in selection)  # C: fp32's train rows, nothing else
    assert np.array_equal(fp32_refit[0], fp32[0]) and np.array_equal(own[0], artifact[0])  # each its own, all of them


def test_poisoned_val_rows_move_no_fit_and_no_c_of_validates_probes(monkeypatch):
    from export import parity

    fp32, artifact, ty, vy = _two_models(seed=4)
    keep = len(vy) // 2
    poisoned = [v.copy() for v in (fp32[1], artifact[1])]
    for v in poisoned:
        v[keep:] = 40 * np.random.default_rng(9).normal(size=v[keep:].shape)
    runs = []
    for val, labels in (((fp32[1], artifact[1]), vy), (poisoned, np.where(np.arange(len(vy)) < keep, vy, (vy + 1) % 4))):
        with monkeypatch.context() as m:
            seen = spy(m)
            reference = parity.reference_probe(fp32[0], ty, val[0], labels, 0.2, seed=0)
            metrics = parity.probe_metrics(reference, artifact[0], ty, val[1], labels)
        runs.append((seen, reference, metrics))
    (clean, ref_clean, m_clean), (dirty, ref_dirty, m_dirty) = runs
    assert ref_clean["selection"] == ref_dirty["selection"] and len(clean.fits) == len(dirty.fits)
    for (a, ay), (b, by) in zip(clean.fits, dirty.fits):
        assert np.array_equal(a, b) and np.array_equal(ay, by)
    assert m_clean["probe_top1"] != m_dirty["probe_top1"]  # the poisoned rows were scored: the check can see them


def test_validates_probe_images_are_train_images_of_the_split_spread_over_it(tmp_path):
    from stages import validate

    run, split, _, data = _run_dir(tmp_path)
    for cap in (3, 256):
        images, sources, labels = validate.train_images(run, 8, cap)
        idx = validate.spread(split["train"], cap)
        assert len(idx) == min(cap, len(split["train"])) and set(idx) <= set(split["train"])
        assert sources == [data.sources[i] for i in idx] and set(sources).isdisjoint(split["val_sources"])
        assert torch.equal(images, center_views(data.images[torch.as_tensor(idx)], 8))
        assert list(labels) == data.labels[torch.as_tensor(idx)].tolist()
    assert validate.spread(list(range(0, 100, 2)), 5) == [0, 20, 40, 60, 80]  # evenly over the split, not its head


# --- a stand-in backbone: features are a fixed linear map of the pixels, so identical images give identical rows

def _backbone(size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    # the pooling is the identity at `size` and lets other sizes through (a cache keyed by size is tested)
    return torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(size), torch.nn.Flatten(), torch.nn.Linear(3 * size * size, 16))


def _data(n=24, size=8):
    data = load_data(f"synthetic:{n}", size, seed=0)
    return data, make_split(data, 0.25, seed=0)


def _plant(data, split, where: str):
    """Copy val image 0 over another image (its pixels only, its source and label kept): over val image 1 ("val",
    a duplicate held out twice) or over train image 0 ("train", a duplicate the bank holds). Returns (v, twin)."""
    v, twin = split["val"][0], split["val" if where == "val" else "train"][1 if where == "val" else 0]
    data.images[twin] = data.images[v]
    return v, twin


def _near(a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Which rows equal `a` up to float32 rounding (distinct images are far apart)."""
    return ((rows - a).abs().max(dim=1).values <= 1e-5 * a.abs().max()).nonzero().flatten()


@pytest.mark.parametrize("where", ["val", "train"])
def test_the_monitor_banks_the_train_images_and_finds_a_planted_duplicate_only_there(monkeypatch, where):
    data, split = _data()
    v, twin = _plant(data, split, where)
    net, cpu = _backbone(8), torch.device("cpu")
    extracted, voted = [], []
    real_extract, real_vote = knn.extract_features, knn.weighted_knn_top1
    monkeypatch.setattr(knn, "extract_features", lambda b, images, *a: extracted.append(images) or real_extract(b, images, *a))
    monkeypatch.setattr(knn, "weighted_knn_top1", lambda *a, **k: voted.append(a) or real_vote(*a, **k))
    top1 = knn.make_monitor(data, split, 8, cpu, lambda *_: None)(net)
    train, val = (torch.as_tensor(split[p]) for p in ("train", "val"))
    assert len(extracted) == 2 and torch.equal(extracted[0], data.images[train]) and torch.equal(extracted[1], data.images[val])
    bank, bank_y, queries, query_y, _ = voted[0]
    assert torch.equal(bank_y, data.labels[train]) and torch.equal(query_y, data.labels[val])
    v_feature = real_extract(net, data.images[[v]], 8, cpu)[0]
    found = _near(v_feature, bank)
    if where == "val":
        assert len(found) == 0  # held out twice, banked never
    else:
        assert found.tolist() == [split["train"].index(twin)]  # the check can see a duplicate the bank holds
    assert top1 == real_vote(real_extract(net, data.images[train], 8, cpu), data.labels[train],
                             real_extract(net, data.images[val], 8, cpu), data.labels[val], len(data.classes))


# --- what linear-eval and pretraining extract and train on

def test_cached_features_extract_train_then_val_images_of_the_split(tmp_path, monkeypatch):
    data, split = _data()
    v, twin = _plant(data, split, "val")
    extracted, args = [], []
    real = le.extract_features
    monkeypatch.setattr(le, "extract_features", lambda b, images, *a: extracted.append(images) or args.append(a) or real(b, images, *a))
    net = _backbone(8)
    train, val, device = le.cached_features(tmp_path / "f.pt", net, 0, data, split, 8, torch.device("cpu"), 7, lambda *_: None)
    assert [len(e) for e in extracted] == [len(split["train"]), len(split["val"])]
    assert torch.equal(extracted[0], data.images[torch.as_tensor(split["train"])])
    assert torch.equal(extracted[1], data.images[torch.as_tensor(split["val"])])
    assert [a[-1] for a in args] == [7, 7] and device == "cpu"  # the batch size asked for; the device recorded
    assert len(_near(val[0], train)) == 0 and _near(val[0], val).tolist() == [0, 1]  # the planted pair: val only


def test_cached_features_are_never_served_for_another_split_or_other_weights(tmp_path, monkeypatch):
    """Features cached for one split are never reused for another, whose val images may be the first one's train
    images (nor for other weights, another step, other data or another size); the file holds what the report
    reads: train and val rows and the weights' hash."""
    import dataclasses

    data, split = _data()
    net, cpu, path = _backbone(8), torch.device("cpu"), tmp_path / "f.pt"
    calls = []
    real = le.extract_features
    monkeypatch.setattr(le, "extract_features", lambda b, images, *a: calls.append(len(images)) or real(b, images, *a))

    def cached(data=data, split=split, net=net, step=0, size=8):
        return le.cached_features(path, net, step, data, split, size, cpu, 64, lambda *_: None)

    first = cached()
    assert calls == [len(split["train"]), len(split["val"])]
    again = cached()
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(first[:2], again[:2])) and again[2] == "cpu"
    stored = torch.load(path, weights_only=True)
    assert torch.equal(stored["train"], first[0]) and torch.equal(stored["val"], first[1])
    assert stored["key"]["weights_sha256"] == le.weights_sha256(net)
    # one val image and one train image trade places: the indices' counts are the same, the images are not
    swapped = dict(split, train=[split["val"][0]] + split["train"][1:], val=[split["train"][0]] + split["val"][1:])
    swapped.update(train_sources=[data.sources[i] for i in swapped["train"]],
                   val_sources=[data.sources[i] for i in swapped["val"]])
    moved = cached(split=swapped)
    assert len(calls) == 4 and torch.equal(moved[0], real(net, data.images[torch.as_tensor(swapped["train"])], 8, cpu))
    other = _backbone(8)
    with torch.no_grad():
        other[2].weight.add_(1.0)
    for change in (dict(net=other), dict(step=1), dict(size=7),
                   dict(data=dataclasses.replace(data, spec="synthetic:other")),
                   dict(data=dataclasses.replace(data, images=torch.nn.functional.pad(data.images, (0, 1, 0, 1))))):
        n = len(calls)
        cached(split=swapped, **change)
        assert len(calls) == n + 2, change
        cached(split=swapped)  # back to the swapped split's own features
    path.write_bytes(b"not a cache")
    n = len(calls)
    cached()
    assert len(calls) == n + 2  # a damaged file is only a cache: recomputed
    torch.save({**torch.load(path, weights_only=True), "device": _Pickled()}, path)  # the right key, and an object
    cached()
    assert len(calls) == n + 4  # that only a full unpickling would build: not unpickled, recomputed


class _Pickled:
    """Stands for any object a planted cache file could make torch.load build (weights_only=False runs its code)."""


def test_pretraining_trains_on_the_train_images_of_the_split(tmp_path, tiny_overrides):
    from stages import pretrain
    from train import runspec

    cfg = runspec.config_for_run(None, {**tiny_overrides, "val_fraction": 0.25, "seed": 3}, tmp_path, False)
    data, split, images = pretrain.train_split(cfg, tmp_path, resume=False)
    assert set(split["train"]).isdisjoint(split["val"]) and len(split["train"]) + len(split["val"]) == len(data)
    assert torch.equal(images, data.images[torch.as_tensor(split["train"])])
    evaluated = load_data(cfg.data, runspec.store_size_for(cfg), seed=3)  # what linear-eval loads: the run's seed
    assert torch.equal(data.images, evaluated.images) and split == make_split(evaluated, 0.25, 3)


def test_pretraining_over_an_old_run_takes_its_own_split_of_one_batch_or_refuses_no_train_images(tmp_path, tiny_overrides):
    """--overwrite reads the data before it deletes the old run: the old split.json is not this run's to check
    against; a train split of exactly one batch trains; a split that leaves no train image is one clear error."""
    from stages import pretrain
    from train import runspec

    cfg = runspec.config_for_run(None, {**tiny_overrides, "val_fraction": 0.25, "batch_size": 36}, tmp_path, False)
    rundir.write_json_atomic(tmp_path / rundir.SPLIT, {"train_sources": ["an image of the old run"]})
    _, split, images = pretrain.train_split(cfg, tmp_path, resume=False)
    assert len(images) == len(split["train"]) == 36
    cfg = runspec.config_for_run(None, {**tiny_overrides, "data": "synthetic:4", "val_fraction": 0.75}, tmp_path / "b", False)
    with pytest.raises(PipelineError, match="larger than the 0 training images of synthetic:4$"):
        pretrain.train_split(cfg, tmp_path / "b", resume=False)


# --- a hand-made run directory for the report and validate: config, split, linear.json and cached features

def _run_dir(tmp_path, plant: str | None = None, n: int = 24, scale: float = 1.0):
    """`scale` shrinks the features (below unit length at 1e-5), `n` is the number of images, half of them val."""
    cfg = PretrainConfig(data=f"synthetic:{n}", image_size=8, val_fraction=0.5, seed=0)
    data = load_data(cfg.data, 8, seed=0)
    split = make_split(data, cfg.val_fraction, 0)
    run = tmp_path / "run"
    (run / rundir.EVAL).mkdir(parents=True)
    rundir.write_text_atomic(run / rundir.CONFIG, yaml.safe_dump(to_dict(cfg), sort_keys=False))
    rundir.write_json_atomic(run / rundir.SPLIT, split)
    rundir.write_json_atomic(run / rundir.EVAL / "linear.json", {"checkpoint": {"weights_sha256": "trained"},
                                                                 "baseline_init": {"weights_sha256": "init"}})
    pixels = center_views(data.images, 8).float().flatten(1)
    feats = {}
    for which, seed in (("pretrained", 1), ("random", 2)):
        f = scale * pixels @ torch.randn(pixels.shape[1], 16, generator=torch.Generator().manual_seed(seed))
        train, val = f[split["train"]].clone(), f[split["val"]].clone()
        if plant == "train":
            train[0] = val[0]  # a val image's twin among the train images
        elif plant == "val":
            val[1] = val[0]  # a val image's twin within val
        feats[which] = (train, val)
        key = {"weights_sha256": "trained" if which == "pretrained" else "init"}
        torch.save({"key": key, "train": train, "val": val}, run / rundir.EVAL / f"features_{which}.pt")
    return run, split, feats, data


def _neighbour_titles(html: str) -> list[tuple[str, list[str]]]:
    """(query source, its neighbours' sources in the order shown) per row of the retrieval grid."""
    import re

    rows = []
    for row in html.split("<tr>")[2:]:
        titles = re.findall(r'title="([^"]+)"', row)
        rows.append((titles[0], titles[1:]))
    return rows


@pytest.mark.parametrize("plant", [None, "val", "train"])
def test_retrieval_banks_the_train_features_and_finds_a_planted_duplicate_only_there(tmp_path, monkeypatch, plant):
    from stages import report

    run, split, feats, data = _run_dir(tmp_path, plant)
    banks = []
    real = report.cosine_neighbours
    monkeypatch.setattr(report, "cosine_neighbours", lambda b, q, k: banks.append((b, q)) or real(b, q, k))
    cfg = report.ReportConfig(queries=len(split["val"]), neighbours=3)
    html = report.retrieval(report.Run(run, cfg, lambda *_: None))
    assert len(banks) == 2
    for (bank, queries), which in zip(banks, ("pretrained", "random")):
        assert np.array_equal(bank, feats[which][0].numpy()) and np.array_equal(queries, feats[which][1].numpy())
    rows = _neighbour_titles(html)
    assert sorted(q for q, _ in rows) == sorted(split["val_sources"])  # every val image is a query here
    for query, shown in rows:
        assert len(shown) == 2 * 3 and set(shown) <= set(split["train_sources"])
        if plant == "train" and query == split["val_sources"][0]:
            assert shown[0] == shown[3] == split["train_sources"][0]  # its twin, first for both backbones
    if plant == "val":  # the twin within val is never shown as a neighbour, and is no query's nearest
        twin = split["val_sources"][1]
        assert all(twin not in shown for _, shown in rows)
    train_y, val_y = data.labels[split["train"]].numpy(), data.labels[split["val"]].numpy()
    agree = (train_y[real(feats["pretrained"][0].numpy(), feats["pretrained"][1].numpy(), 3)] == val_y[:, None]).mean()
    assert f"pretrained {100 * agree:.1f} %" in html  # the reported agreement: val queries against the train bank


def test_the_retrieval_grid_shows_seeded_queries_and_marks_each_neighbour_by_its_own_label(tmp_path):
    """The grid's queries are pick_queries' seeded choice of val images, each with its class; each neighbour shown is
    marked right or wrong by its own train label against the query's, and the counts under the grid are those marks;
    the agreement over every val image is reported for both backbones."""
    import re

    from stages import report

    run, split, feats, data = _run_dir(tmp_path)
    html = report.retrieval(report.Run(run, report.ReportConfig(queries=4, neighbours=3, seed=5), lambda *_: None))
    train_y, val_y = data.labels[split["train"]].numpy(), data.labels[split["val"]].numpy()
    nbrs = {w: report.cosine_neighbours(feats[w][0].numpy(), feats[w][1].numpy(), 3) for w in feats}
    expected, right = [], {w: 0 for w in nbrs}
    for q in report.pick_queries(val_y, 4, 5):
        row = [("", "", split["val_sources"][q], data.classes[val_y[q]])]
        for w in ("pretrained", "random"):
            for j in nbrs[w][q]:
                ok = train_y[j] == val_y[q]
                right[w] += int(ok)
                row.append(("ok" if ok else "bad", w, split["train_sources"][j], f"{data.classes[train_y[j]]} {'✓' if ok else '✗'}"))
        expected.append(row)
    figure = r'<figure(?: class="(\w+) (\w+)")?><img [^>]*title="([^"]+)"[^>]*><figcaption>(.*?)</figcaption></figure>'
    assert [re.findall(figure, row) for row in html.split("<tr>")[2:]] == expected
    assert 0 < sum(right.values()) < 2 * 4 * 3  # both marks are shown
    assert f"Shown: pretrained {right['pretrained']}/12 right, random init {right['random']}/12." in html
    agree = {w: (train_y[nbrs[w]] == val_y[:, None]).mean() for w in nbrs}
    assert f"<b>pretrained {100 * agree['pretrained']:.1f} %</b>, random init {100 * agree['random']:.1f} %." in html


def test_cosine_neighbours_rank_by_angle_whatever_the_lengths_and_break_ties_by_index():
    from stages import report

    bank = np.array([[2, 0, 0], [0, 0.05, 0], [0.03, 0, 0], [1.4, 0.2, 0], [0, 0, 4], [0.5, 0, 0], [0, 3, 0], [0.01, 0, 0],
                     [0, 0, 0.2], [0.7, 0, 0], [0, 0.3, 0], [0, 0, 0.9]])
    queries = np.array([[1, 0, 0], [0, 0.001, 0], [0, 0, 7]])
    # on the query's axis, short or long, in index order; then the one 8 degrees off it; then the rest, tied at 0
    assert report.cosine_neighbours(bank, queries, len(bank)).tolist() == [
        [0, 2, 5, 7, 9, 3, 1, 4, 6, 8, 10, 11], [1, 6, 10, 3, 0, 2, 4, 5, 7, 8, 9, 11], [4, 8, 11, 0, 1, 2, 3, 5, 6, 7, 9, 10]]
    assert report.cosine_neighbours(bank, queries, 2).tolist() == [[0, 2], [1, 6], [4, 8]]


@pytest.mark.parametrize("n, map_max, tsne_max, keep, tsne", [
    (24, 5, 2000, [0, 3, 6, 8, 11], False),  # an even sample of the 12 val rows, first and last; t-SNE needs 6
    (24, 6, 2000, [0, 2, 4, 7, 9, 11], True),
    (24, 5000, 12, list(range(12)), True),  # t-SNE up to --tsne-max ...
    (24, 5000, 11, list(range(12)), False),  # ... and not beyond
    (200, 5000, 2000, list(range(100)), True),  # perplexity capped at 30
])
def test_embedding_maps_sample_val_evenly_and_report_the_variance_of_its_unit_rows(tmp_path, monkeypatch, n, map_max,
                                                                                   tsne_max, keep, tsne):
    """The maps show an even sample of at most --map-max val rows, L2-normalised however short the features; PCA
    and t-SNE are 2-D and seeded by --seed, t-SNE at perplexity min(30, (n - 1) / 3); the variance the two
    components explain is reported for both backbones. t-SNE itself is not run: its inputs are what is checked."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    from stages import report, report_figures

    run, split, feats, data = _run_dir(tmp_path, n=n, scale=1e-5)
    pcas, tsnes, drawn = [], [], []
    real_pca, real_maps = PCA.fit, report_figures.embedding_maps
    monkeypatch.setattr(PCA, "fit", lambda self, x, y=None: pcas.append((self, np.array(x))) or real_pca(self, x, y))
    monkeypatch.setattr(TSNE, "fit_transform",
                        lambda self, x, y=None: tsnes.append((self, np.array(x))) or np.zeros((len(x), self.n_components)))
    monkeypatch.setattr(report_figures, "embedding_maps",
                        lambda maps, labels, classes: drawn.append((maps, labels)) or real_maps(maps, labels, classes))
    cfg = report.ReportConfig(map_max=map_max, tsne_max=tsne_max, seed=3)
    html = report.embedding_map(report.Run(run, cfg, lambda *_: None))
    val = {w: feats[w][1].double().numpy()[keep] for w in feats}
    unit = {w: x / np.linalg.norm(x, axis=1, keepdims=True) for w, x in val.items()}
    assert all(np.linalg.norm(x, axis=1).max() < 0.5 for x in val.values())  # too short to pass for unit rows
    assert len(pcas) == 2 and len(tsnes) == (2 if tsne else 0)
    for (model, x), w in zip(pcas + tsnes, ("pretrained", "random") * 2):
        np.testing.assert_allclose(x, unit[w], rtol=1e-5, atol=1e-7)
        assert (model.n_components, model.random_state) == (2, 3)
    perplexity = min(30.0, (len(keep) - 1) / 3)
    assert [model.perplexity for model, _ in tsnes] == [perplexity] * len(tsnes)
    (maps, labels), = drawn
    assert np.array_equal(labels, data.labels[split["val"]].numpy()[keep])
    assert [xy.shape for _, xy in maps] == [(len(keep), 2)] * (4 if tsne else 2)
    explained = {w: PCA(n_components=2).fit(x).explained_variance_ratio_.sum() for w, x in unit.items()}
    assert (f"explain <b>{100 * explained['pretrained']:.1f} %</b> of the variance (pretrained) and "
            f"{100 * explained['random']:.1f} % (random init)") in html
    left_out = (f"t-SNE left out: {len(keep):,} images is more than --tsne-max {tsne_max:,}." if len(keep) > tsne_max
                else f"t-SNE left out: {len(keep):,} images are too few for its perplexity.")
    assert (f"t-SNE: perplexity {perplexity:.1f}, seed 3." if tsne else left_out) in html


def test_embedding_maps_are_the_val_rows_alone_with_their_own_labels(tmp_path, monkeypatch):
    """The maps picture val: PCA and t-SNE see exactly the (L2-normalised) val rows, no train row, and each point
    is coloured by its own val label."""
    from sklearn.decomposition import PCA
    from sklearn.manifold import TSNE

    from stages import report, report_figures

    run, split, feats, data = _run_dir(tmp_path)
    fitted, drawn = [], []
    real_pca, real_tsne, real_maps = PCA.fit, TSNE.fit_transform, report_figures.embedding_maps
    monkeypatch.setattr(PCA, "fit", lambda self, x, y=None: fitted.append(np.array(x)) or real_pca(self, x, y))
    monkeypatch.setattr(TSNE, "fit_transform", lambda self, x, y=None: fitted.append(np.array(x)) or real_tsne(self, x, y))
    monkeypatch.setattr(report_figures, "embedding_maps", lambda maps, labels, classes: drawn.append(labels) or real_maps(maps, labels, classes))
    report.embedding_map(report.Run(run, report.ReportConfig(), lambda *_: None))
    assert len(fitted) == 4  # PCA and t-SNE, each backbone
    for x, which in zip(fitted, ("pretrained", "random", "pretrained", "random")):
        val = feats[which][1].double().numpy()
        np.testing.assert_allclose(x, val / np.linalg.norm(val, axis=1, keepdims=True), rtol=1e-6)
        assert (positions(x, feats[which][0].double().numpy() / np.linalg.norm(feats[which][0].double().numpy(), axis=1,
                                                                                 keepdims=True)) < 0).all()
    assert np.array_equal(drawn[0], data.labels[split["val"]].numpy())


def test_validate_checks_with_the_val_images_of_the_split(tmp_path):
    from stages import validate

    run, split, _, data = _run_dir(tmp_path)
    for cap in (5, 256):
        images, sources = validate.val_images(run, 8, cap)
        idx = validate.spread(split["val"], cap)
        assert sources == [data.sources[i] for i in idx] and set(sources).isdisjoint(split["train_sources"])
        assert set(idx) <= set(split["val"]) and len(idx) == min(cap, len(split["val"]))
        assert torch.equal(images, center_views(data.images[torch.as_tensor(idx)], 8))
    images, sources, n_val, labels = validate.check_images(load_config(validate.ValidateConfig), run, 8, lambda *_: None)
    assert n_val == len(sources) == len(split["val"]) and sources == split["val_sources"]
    assert list(labels) == data.labels[torch.as_tensor(split["val"])].tolist()  # the compressed gates' labels: val's
    assert json.loads((run / rundir.SPLIT).read_text()) == split
