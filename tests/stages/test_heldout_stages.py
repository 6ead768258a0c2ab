"""Held out through the stages themselves, on tiny trained runs: pretraining and its kNN monitor, linear-eval (full
and few-label probes, with the kNN at a k and T of its own), the report's retrieval grid and maps and validate's
images see the split as split.json records it, and a planted duplicate shows that they would see a leak.

The planted runs share one checkpoint, trained on a folder of images, and differ only in one extra file: a copy of a
val image, recorded once among the train images (the bank must find it: the check can see a duplicate) and once
among the val images (no bank may hold it, and every fit, every other val row's score and the reported numbers
follow from the run without it). tests/stages/test_heldout.py holds the same properties function by function.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from core import rundir
from train import knn
from stages import linear_eval as le, pretrain, report, validate
from train.data import load_data
from train.runspec import read_run, store_size_for
from tests import tiny_run
from tests.heldout_spies import assert_learned_from, positions, spy

TINY = dict(tiny_run.TINY, data="synthetic:24", image_size=8)  # the small stem's minimum: every pass is cheap
KNN = dict(knn_k=7, knn_temperature=0.37, majority_k=3)  # not the protocol's: the stage must pass its own down
QUIET = dict(say=lambda *_: None)


def _data_and_split(run):
    cfg = read_run(run)
    return load_data(cfg.data, store_size_for(cfg), seed=cfg.seed), json.loads((run / rundir.SPLIT).read_text())


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    """The tiny run, pretrained with the kNN monitor every epoch, with the images every epoch's batches were drawn
    from and what each monitor pass extracted and voted with."""
    out = tmp_path_factory.mktemp("heldout") / "run"
    trained_on, extracted, voted = [], [], []
    real_batches, real_extract, real_vote = pretrain.view_batches, knn.extract_features, knn.weighted_knn_top1
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pretrain, "view_batches", lambda mode, images, *a: trained_on.append(images) or real_batches(mode, images, *a))
        mp.setattr(knn, "extract_features", lambda b, images, *a: extracted.append(images.clone()) or real_extract(b, images, *a))
        mp.setattr(knn, "weighted_knn_top1", lambda *a, **k: voted.append([t.clone() for t in a[:4]]) or real_vote(*a, **k))
        tiny_run.pretrain_tiny(out, **{**TINY, "knn_every": 1})
    return {"dir": out, "trained_on": trained_on, "extracted": extracted, "voted": voted}


def test_pretraining_and_its_monitor_see_the_split_json_records(monitored):
    data, split = _data_and_split(monitored["dir"])
    train, val = torch.as_tensor(split["train"]), torch.as_tensor(split["val"])
    assert set(split["train"]).isdisjoint(split["val"])
    assert len(monitored["trained_on"]) == TINY["epochs"]
    assert all(torch.equal(images, data.images[train]) for images in monitored["trained_on"])
    assert len(monitored["extracted"]) == 2 * TINY["epochs"] == 2 * len(monitored["voted"])  # one pass per epoch
    for i, (bank, bank_y, queries, query_y) in enumerate(monitored["voted"]):
        assert torch.equal(monitored["extracted"][2 * i], data.images[train])  # the bank: the train images
        assert torch.equal(monitored["extracted"][2 * i + 1], data.images[val])  # the queries: the val images
        assert torch.equal(bank_y, data.labels[train]) and torch.equal(query_y, data.labels[val])
        assert len(bank) == len(train) and len(queries) == len(val)


def _shadow(run, dst):
    """A run directory sharing `run`'s checkpoint, config and split (links) with an eval/ of its own."""
    dst.mkdir(parents=True)
    for name in (rundir.SPLIT, rundir.CONFIG, rundir.CHECKPOINTS):
        (dst / name).symlink_to((run / name).resolve())
    return dst


def _cached(run):
    out = {}
    for which in ("pretrained", "random"):
        c = torch.load(run / rundir.EVAL / f"features_{which}.pt", weights_only=True)
        out[which] = (c["train"], c["val"])
    return out


def test_linear_eval_learns_from_the_train_rows_of_split_json_alone(monitored, tmp_path, monkeypatch):
    run = _shadow(monitored["dir"], tmp_path / "run")
    data, split = _data_and_split(run)
    extracted = []
    real = le.extract_features
    monkeypatch.setattr(le, "extract_features", lambda b, images, *a: extracted.append(images) or real(b, images, *a))
    seen = spy(monkeypatch)
    result = le.run(le.EvalConfig(device="cpu", labels_per_class=2, label_draws=2, **KNN), run, **QUIET)
    train, val = torch.as_tensor(split["train"]), torch.as_tensor(split["val"])
    assert len(extracted) == 4  # each backbone: train, then val
    for i in range(0, 4, 2):
        assert torch.equal(extracted[i], data.images[train]) and torch.equal(extracted[i + 1], data.images[val])

    feats, train_y, val_y = _cached(run), data.labels[train].numpy(), data.labels[val].numpy()
    both_train = torch.cat([feats["pretrained"][0], feats["random"][0]])
    both_val = torch.cat([feats["pretrained"][1], feats["random"][1]])
    assert_learned_from(seen, both_train, np.concatenate([train_y, train_y]), both_val)
    full = [x for x, _ in seen.fits if len(x) == len(train)]
    assert len(full) == 2  # the refit of each backbone's probe on all of train ...
    for x in full:  # ... is exactly split.json's train images, in its order
        assert [split["train"][p % len(train)] for p in positions(x, both_train)] == split["train"]

    for which, reported in (("pretrained", result), ("random", result["baseline"])):
        bank, queries = feats[which]
        assert reported["knn_top1"] == knn.weighted_knn_top1(bank, data.labels[train], queries, data.labels[val],
                                                             len(data.classes), KNN["knn_k"], KNN["knn_temperature"])
        assert reported["knn_majority_top1"] == knn.majority_knn_top1(bank, data.labels[train], queries,
                                                                      data.labels[val], len(data.classes), KNN["majority_k"])
    assert {k: result["protocol"]["knn"][k] for k in ("k", "temperature", "majority_k")} == {
        "k": KNN["knn_k"], "temperature": KNN["knn_temperature"], "majority_k": KNN["majority_k"]}


# --- planted duplicates: one checkpoint, three folders that differ by one copied val image

PER_CLASS, CLASSES = 6, ("a", "b", "c", "d")


def _write_folder(root):
    rng = np.random.default_rng(0)
    for c in CLASSES:
        (root / c).mkdir(parents=True)
        for i in range(PER_CLASS):
            Image.fromarray(rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)).save(root / c / f"{c}{i}.png")
    return root


def _planted(base, folder, where, dst):
    """`base`'s checkpoint on a copy of `folder` with val image 0 copied once more (as <class>/twin.png), recorded in
    split.json among the `where` images; every other image keeps its part and its place in the order."""
    new_folder = dst / "images"
    shutil.copytree(folder, new_folder)
    split0 = json.loads((base / rundir.SPLIT).read_text())
    v = split0["val_sources"][0]
    twin = new_folder / (v[len(str(folder)) + 1:].split("/")[0]) / "twin.png"
    shutil.copy(v, twin)
    moved = lambda s: str(new_folder) + s[len(str(folder)):]
    cfg = yaml.safe_load((base / rundir.CONFIG).read_text())
    cfg["data"] = f"folder:{new_folder}"
    data = load_data(cfg["data"], store_size_for(read_run(base)), seed=cfg["seed"])
    parts = {p: [moved(s) for s in split0[f"{p}_sources"]] + ([str(twin)] if p == where else []) for p in ("train", "val")}
    split = {**split0, "spec": cfg["data"], "num_images": len(data), **{f"{p}_sources": parts[p] for p in parts},
             **{p: [data.sources.index(s) for s in parts[p]] for p in parts}}
    run = dst / "run"
    run.mkdir()
    (run / rundir.CHECKPOINTS).symlink_to((base / rundir.CHECKPOINTS).resolve())
    rundir.write_text_atomic(run / rundir.CONFIG, yaml.safe_dump(cfg, sort_keys=False))
    rundir.write_json_atomic(run / rundir.SPLIT, split)
    return run


def _evaluate(run):
    """linear-eval (full probes) with every learner spied on, and the report's retrieval grid of every val image."""
    with pytest.MonkeyPatch.context() as mp:
        seen = spy(mp)
        result = le.run(le.EvalConfig(device="cpu"), run, **QUIET)
    split = json.loads((run / rundir.SPLIT).read_text())
    cfg = report.ReportConfig(queries=len(split["val"]), neighbours=3)
    page = report.Run(run, cfg, lambda *_: None)
    return {"dir": run, "seen": seen, "result": result, "split": split, "feats": _cached(run),
            "retrieval": report.retrieval(page), "maps": report.embedding_map(page)}


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("planted")
    folder = _write_folder(root / "images")
    base = root / "run"
    tiny_run.pretrain_tiny(base, **{**TINY, "data": f"folder:{folder}", "val_fraction": 0.34})
    return {"none": _evaluate(base), **{w: _evaluate(_planted(base, folder, w, root / w)) for w in ("train", "val")}}


def _hits(seen):
    """Per score table (pretrained linear, weighted kNN, majority kNN, then the baseline's): each val row's hit."""
    return [(torch.sort(s, dim=1, descending=True, stable=True).indices[:, 0] == y).numpy() for s, y in seen.scores]


def _near(a, rows):
    return ((rows - a).abs().max(dim=1).values <= 1e-4 * a.abs().max()).nonzero().flatten().tolist()


def _grid(html):
    import re

    return [(re.findall(r'title="([^"]+)"', row)[0], re.findall(r'title="([^"]+)"', row)[1:]) for row in html.split("<tr>")[2:]]


def test_a_val_image_copied_within_val_is_in_no_bank_and_moves_nothing_else(planted):
    clean, twin = planted["none"], planted["val"]
    n = len(clean["split"]["val"])
    assert len(twin["split"]["val"]) == n + 1 and len(twin["split"]["train"]) == len(clean["split"]["train"])
    for which in ("pretrained", "random"):
        assert torch.equal(twin["feats"][which][0], clean["feats"][which][0])  # the same train features, bit for bit
        v = twin["feats"][which][1][0]
        assert _near(v, twin["feats"][which][1]) == [0, n]  # the planted pair, both in val
    assert len(twin["seen"].fits) == len(clean["seen"].fits)
    for (a, ay), (b, by) in zip(clean["seen"].fits, twin["seen"].fits):  # every fit, C's selection included
        assert np.array_equal(a, b) and np.array_equal(ay, by)
    assert len(twin["seen"].banks) == 4  # weighted and majority, each backbone
    for bank, _, queries in twin["seen"].banks:  # no bank holds either of the pair
        assert _near(queries[0], bank) == [] and _near(queries[0], queries) == [0, n]
    # every other val row scores as it did; the copy scores as its original; the reported numbers follow
    results = [("top1", 0), ("knn_top1", 1), ("knn_majority_top1", 2)]
    before, after = _hits(clean["seen"]), _hits(twin["seen"])
    for table, (a, b) in enumerate(zip(before, after)):
        assert np.array_equal(b[:n], a) and b[n] == a[0], table
    for key, table in results:
        assert twin["result"][key] == pytest.approx(after[table].mean())
        assert twin["result"]["baseline"][key] == pytest.approx(after[3 + table].mean())
    v_source, twin_source = twin["split"]["val_sources"][0], twin["split"]["val_sources"][n]
    rows = _grid(twin["retrieval"])
    assert len(rows) == n + 1
    assert all(set(shown) <= set(twin["split"]["train_sources"]) and v_source not in shown and twin_source not in shown
               for _, shown in rows)


def test_a_val_image_copied_into_train_is_found_and_changes_nothing_measured(planted):
    clean, dup = planted["none"], planted["train"]
    assert dup["split"]["val_sources"][0].endswith(clean["split"]["val_sources"][0].split("/images/")[-1])
    at = len(dup["split"]["train"]) - 1  # the copy: the last train image
    for which in ("pretrained", "random"):
        assert torch.equal(dup["feats"][which][1], clean["feats"][which][1])  # what is measured: the same val rows
        assert _near(dup["feats"][which][1][0], dup["feats"][which][0]) == [at]  # and the bank holds its copy
    # every fit and bank on train rows (val image 0 left out of the val rows: its twin is, rightly, a train row)
    assert_learned_from(dup["seen"], torch.cat([dup["feats"][w][0] for w in ("pretrained", "random")]),
                        np.tile(_labels(dup, "train"), 2), torch.cat([dup["feats"][w][1][1:] for w in ("pretrained", "random")]))
    query, shown = next(r for r in _grid(dup["retrieval"]) if r[0] == dup["split"]["val_sources"][0])
    assert shown[0] == shown[3] == dup["split"]["train_sources"][at]  # its copy, nearest for both backbones
    assert dup["maps"] == clean["maps"]  # the maps picture the val rows: identical
    a, _ = validate.val_images(clean["dir"], 8, 256)
    b, _ = validate.val_images(dup["dir"], 8, 256)
    assert torch.equal(a, b)  # validate checks with the same images


def _labels(run, part):
    data, split = _data_and_split(run["dir"])
    return data.labels[torch.as_tensor(split[part])].numpy()
