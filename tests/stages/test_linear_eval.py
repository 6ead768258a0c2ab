"""Evaluation stage: deterministic fp32 features, a probe that separates what is separable, model selection that
cannot see val, a baseline that is exactly the step-0 init, the online monitor, and every bad input."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

from core import rundir
from pipeline.cli import main
from core.errors import PipelineError
from stages import linear_eval as le
from train import configs, probe, runspec, training
from train.backbones import build_backbone
from train.data import ImageData
from train.features import extract_features
from train.knn import make_monitor
from tests import tiny_run

# The tiny run at 8 px (the small stem's minimum) keeps every forward pass cheap; nothing here needs good features.
TINY = dict(tiny_run.TINY, data="synthetic:24", image_size=8)
QUIET = dict(say=lambda *_: None)
FEW = dict(device="cpu", labels_per_class=3, label_draws=2)  # 2 draws, not 5: each costs 2 x 16 probe fits
FOLDER_CFG = configs.PretrainConfig(**{**TINY, "image_size": 16, "val_fraction": 0.25})  # 4 images a class: 1 to val


def _pretrain(out, **over):
    """The tiny run at 8 px into `out`; its resolved config (config.yaml)."""
    tiny_run.pretrain_tiny(out, **{**TINY, **over})
    return runspec.read_run(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny 2-epoch run with the kNN monitor on, its step-0 backbone, and one evaluation of it."""
    out = tmp_path_factory.mktemp("le") / "run"
    step0 = {}
    real_build = runspec.build_model

    def recording_build(cfg):
        model, dim = real_build(cfg)
        step0.setdefault("state", {k: v.clone() for k, v in model.backbone.state_dict().items()})
        return model, dim

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(training, "build_model", recording_build)  # what pretraining builds its model with
        cfg = _pretrain(out, knn_every=1)
    result = le.run(le.EvalConfig(**FEW), out, **QUIET)
    return {"dir": out, "cfg": cfg, "step0": step0["state"], "result": result}


def _shadow(trained, tmp_path, link_checkpoints=True):
    """A run directory sharing the fixture's checkpoint and split (symlinks) with its own eval/, so a test can
    re-evaluate without changing what other tests read."""
    run = tmp_path / "shadow"
    run.mkdir()
    for name in (rundir.SPLIT, rundir.CONFIG) + ((rundir.CHECKPOINTS,) if link_checkpoints else ()):
        (run / name).symlink_to(trained["dir"] / name)
    shutil.copytree(trained["dir"] / rundir.EVAL, run / rundir.EVAL)
    return run


# --- features

def test_features_are_deterministic_fp32_and_leave_the_model_as_found():
    torch.manual_seed(0)
    net, _ = build_backbone("resnet18", True)
    net.train()
    bn_before = net.bn1.running_mean.clone()
    images = torch.randint(0, 256, (10, 3, 20, 20), dtype=torch.uint8)  # stored larger than the view: center crop
    cpu = torch.device("cpu")
    a = extract_features(net, images, 16, cpu, batch_size=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a caller's autocast must not reach the features
        b = extract_features(net, images, 16, cpu, batch_size=4)
    c = extract_features(net, images, 16, cpu, batch_size=10)
    assert a.dtype == torch.float32 and a.shape == (10, 512)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)  # eval-mode BN: batch composition does not matter
    assert net.training and torch.equal(net.bn1.running_mean, bn_before)
    with pytest.raises(PipelineError, match="fp32 backbone"):
        extract_features(net.half(), images, 16, cpu)


# --- the linear probe and its model selection

def _blobs(n, classes=10, dim=32, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(classes, dim))
    means *= 5 / np.linalg.norm(means, axis=1, keepdims=True)
    y = np.arange(n) % classes
    return means[y] + rng.normal(size=(n, dim)), y


def test_linear_probe_reaches_100_percent_on_separable_features():
    x, y = _blobs(400)
    res = le.linear_probe(x[:300], y[:300], x[300:], y[300:], 10, 0.2, seed=0)
    assert res["top1"] >= 0.99 and res["top5"] == 1.0
    assert res["selection"]["method"] == "holdout"  # 30 images a class: one held-out part is enough
    assert res["selection"]["fit_size"] + res["selection"]["holdout_size"] == 300
    again = le.linear_probe(x[:300], y[:300], x[300:], y[300:], 10, 0.2, seed=0)
    assert again == res  # deterministic, selection included


def test_model_selection_is_blind_to_val(monkeypatch):
    """choose_c gets train rows only, and poisoning val (labels and features) changes no selection."""
    x, y = _blobs(300, seed=1)
    x = x + np.random.default_rng(2).normal(0, 3, x.shape)  # noisy, so the C grid has something to decide
    train_x, train_y, val_x, val_y = x[:200], y[:200], x[200:], y[200:]
    seen = []
    real = le.choose_c
    monkeypatch.setattr(le, "choose_c", lambda tx, ty, *a: seen.append((tx, ty)) or real(tx, ty, *a))
    clean = le.linear_probe(train_x, train_y, val_x, val_y, 10, 0.2, seed=0)
    poisoned = le.linear_probe(train_x, train_y, -val_x * 100, (val_y + 3) % 10, 10, 0.2, seed=0)
    assert clean["selection"] == poisoned["selection"] and clean["top1"] != poisoned["top1"]
    for tx, ty in seen:
        assert tx is train_x and ty is train_y


def test_holdout_split_is_per_class_and_works_with_few_labels():
    y = np.repeat(np.arange(10), 2)  # 2 per class: a global 20% (4 images) could not cover 10 classes
    fit, held = probe.holdout_split(y, 0.2, seed=0)
    assert sorted(np.concatenate([fit, held]).tolist()) == list(range(20))
    assert np.bincount(y[held]).tolist() == [1] * 10 and np.bincount(y[fit]).tolist() == [1] * 10


def test_few_labels_choose_c_by_stratified_cv_holding_each_row_out_once(monkeypatch):
    x, y = _blobs(50, seed=3)  # 5 a class: one held-out part would be 1 image a class, and every C would tie
    method, splits = probe.selection_splits(y, 0.2, seed=0)
    assert method == "stratified 5-fold" and len(splits) == 5
    assert sorted(np.concatenate([held for _, held in splits]).tolist()) == list(range(50))  # each row once
    for fit, held in splits:
        assert sorted(np.concatenate([fit, held]).tolist()) == list(range(50))
        assert np.bincount(y[held]).tolist() == [1] * 10  # stratified: every class in every fold
    sizes = []
    real = probe.fit_probe
    monkeypatch.setattr(probe, "fit_probe", lambda fx, fy, c: sizes.append(len(fx)) or real(fx, fy, c))
    sel = probe.choose_c(x, y, 0.2, seed=0)
    assert sel["method"] == "stratified 5-fold" and sel["c"] in probe.C_GRID
    assert sel["fit_size_per_fold"] == [40] * 5 and sel["holdout_size_per_fold"] == [10] * 5
    assert sizes == [40] * 5 * len(probe.C_GRID)  # every C scored on every fold
    assert probe.selection_splits(np.repeat(np.arange(10), 3), 0.2, 0)[0] == "stratified 3-fold"
    assert probe.selection_splits(np.repeat(np.arange(10), probe.CV_BELOW), 0.2, 0)[0] == "holdout"


def _features(n_train=48, n_val=60, classes=6):
    """The same images as separable blobs ("pretrained") and as noise ("random init"), train then val."""
    x, y = _blobs(n_train + n_val, classes=classes, dim=16, seed=4)
    noise = np.random.default_rng(5).normal(size=x.shape)
    parts = lambda a: (torch.tensor(a[:n_train], dtype=torch.float32), torch.tensor(a[n_train:], dtype=torch.float32))
    return {"pretrained": parts(x), "random": parts(noise)}, y[:n_train], y[n_train:]


def test_few_label_draws_share_rows_across_backbones_and_report_their_mean(monkeypatch):
    feats, train_y, val_y = _features()
    cfg = le.EvalConfig(labels_per_class=3, label_draws=3)
    drawn, probed = [], []
    real_subset, real_probes = le.per_class_subset, le.probes
    monkeypatch.setattr(le, "per_class_subset", lambda *a: drawn.append(real_subset(*a)) or drawn[-1])
    monkeypatch.setattr(le, "probes", lambda tx, ty, *a: probed.append((tx, ty)) or real_probes(tx, ty, *a))
    few = le.few_label_probes(feats, train_y, val_y, 6, list("abcdef"), cfg, seed=0)
    assert len(drawn) == few["draws"] == len(few["per_draw"]) == len(few["linear_selection"]) == 3
    assert len({tuple(rows) for rows in drawn}) == 3  # each draw its own rows ...
    for d, rows in enumerate(drawn):  # ... K of each class, the same for both backbones
        assert np.bincount(train_y[rows]).tolist() == [3] * 6 and few["num_train"] == len(rows)
        (px, py), (rx, ry) = probed[2 * d], probed[2 * d + 1]
        assert torch.equal(px, feats["pretrained"][0][rows]) and torch.equal(rx, feats["random"][0][rows])
        assert np.array_equal(py, train_y[rows]) and np.array_equal(ry, train_y[rows])
    for m in le.METRICS:
        pre, base = [r[m] for r in few["per_draw"]], [r["baseline"][m] for r in few["per_draw"]]
        diff = np.subtract(pre, base)  # paired: draw by draw
        assert (few[m], few["baseline"][m]) == pytest.approx((np.mean(pre), np.mean(base)))
        assert (few["std"]["pretrained"][m], few["std"]["baseline"][m]) == pytest.approx((np.std(pre), np.std(base)))
        assert (few["gain"][m], few["gain_std"][m]) == pytest.approx((np.mean(diff), np.std(diff)))
    assert few["gain"]["top1"] > 0.2  # separable blobs beat noise
    again = le.few_label_probes(feats, train_y, val_y, 6, list("abcdef"), cfg, seed=0)
    assert json.dumps(again) == json.dumps(few)  # deterministic in the seed, selections included


# --- the stage on a real (tiny) run

def test_baseline_is_exactly_the_step0_init(trained):
    base = le.random_backbone(trained["cfg"]).state_dict()
    assert base.keys() == trained["step0"].keys()
    for k, v in trained["step0"].items():
        assert torch.equal(base[k], v), k
    net, _, _ = le.load_trained_backbone(trained["dir"])
    assert not torch.equal(net.state_dict()["conv1.weight"], base["conv1.weight"])  # and it was trained
    r = trained["result"]
    assert r["baseline_init"]["weights_sha256"] == le.weights_sha256(le.random_backbone(trained["cfg"]))
    assert r["baseline_init"]["weights_sha256"] != r["checkpoint"]["weights_sha256"]


def test_linear_json_contract(trained):
    r = json.loads((trained["dir"] / rundir.EVAL / "linear.json").read_text())
    split = json.loads((trained["dir"] / rundir.SPLIT).read_text())
    for key in ("top1", "top5", "knn_top1", "knn_majority_top1"):
        assert key in r and key in r["baseline"] and key in r["labels_per_class"]["baseline"]
    assert 0 <= r["top1"] <= 1 and r["top5"] is None  # 4 classes: top-5 would be trivially 100%
    assert (r["num_train"], r["num_val"]) == (len(split["train"]), len(split["val"]))
    assert sum(r["train_per_class"].values()) == r["num_train"] and len(r["train_per_class"]) == r["num_classes"]
    assert 1 / r["num_classes"] <= r["chance_top1"] < 1  # the share of the largest val class (train/verdict.py)
    assert r["protocol"]["knn"]["k_used"] == min(200, r["num_train"]) and r["protocol"]["knn"]["temperature"] == 0.1
    assert r["protocol"]["linear"]["pretrained"]["c"] in le.C_GRID
    few = r["labels_per_class"]
    assert few["num_train"] == 3 * 4 and few["draws"] == 2 and len(few["per_draw"]) == len(few["linear_selection"]) == 2
    assert few["top5"] is None and few["std"]["baseline"]["top5"] is None and few["gain_std"]["top5"] is None
    assert {s["pretrained"]["method"] for s in few["linear_selection"]} == {"stratified 3-fold"}  # 3 a class
    assert "draws" in r["protocol"]["labels_per_class"] and "fold" in r["protocol"]["linear"]["selection"]
    assert r == trained["result"]


def test_table_shows_few_label_spread_and_paired_gain(trained):
    lines = le.format_table(trained["result"]).splitlines()
    few = [line for line in lines if "3/class" in line]
    assert len(few) == 3 and all(line.count("±") == 3 and line.endswith(" pt") for line in few)
    assert any("over 2 draws" in line for line in lines) and max(map(len, lines)) < 110
    old = {**trained["result"], "labels_per_class": {"k": 3, "top1": 0.5, "baseline": {"top1": 0.25}}}
    assert "older single-draw" in le.format_table(old)  # a linear.json from before draws still shows


def test_cached_features_are_reused_then_invalidated_by_new_weights(trained, tmp_path, monkeypatch):
    run = _shadow(trained, tmp_path, link_checkpoints=False)
    calls = []
    real = le.extract_features
    monkeypatch.setattr(le, "extract_features", lambda net, imgs, *a: calls.append(len(imgs)) or real(net, imgs, *a))
    ckpt = torch.load(trained["dir"] / rundir.LAST_CHECKPOINT, weights_only=False)
    (run / rundir.CHECKPOINTS).mkdir()
    torch.save(ckpt, run / rundir.LAST_CHECKPOINT)
    again = le.run(le.EvalConfig(**FEW), run, **QUIET)
    assert calls == []  # from the cache ...
    assert {k: v for k, v in again.items() if k != "checkpoint"} == {k: v for k, v in trained["result"].items() if k != "checkpoint"}
    ckpt["model"]["backbone.conv1.weight"] += 0.5
    ckpt["step"] += 1
    torch.save(ckpt, run / rundir.LAST_CHECKPOINT)  # "retrained"
    le.run(le.EvalConfig(device="cpu"), run, **QUIET)
    split = json.loads((run / rundir.SPLIT).read_text())
    assert calls == [len(split["train"]), len(split["val"])]  # the trained features only; the baseline's still hold


def test_selection_in_the_stage_never_receives_val_rows(trained, tmp_path, monkeypatch):
    val_rows = torch.load(trained["dir"] / rundir.EVAL / "features_pretrained.pt", weights_only=True)["val"].double().numpy()
    seen = []
    real = le.choose_c
    monkeypatch.setattr(le, "choose_c", lambda tx, ty, *a: seen.append(tx) or real(tx, ty, *a))
    le.run(le.EvalConfig(device="cpu", labels_per_class=2, label_draws=2), _shadow(trained, tmp_path), **QUIET)
    assert len(seen) == 2 + 2 * 2  # pretrained + baseline: full, then each few-label draw
    for tx in seen:
        assert not any((tx == row).all(1).any() for row in val_rows)


def test_online_knn_monitor_logs_and_does_not_change_training(trained, tmp_path):
    lines = [json.loads(x) for x in (trained["dir"] / rundir.METRICS).read_text().splitlines()]
    knn = [x for x in lines if "knn_top1" in x]
    spe = torch.load(trained["dir"] / rundir.LAST_CHECKPOINT, weights_only=False)["meta"]["steps_per_epoch"]
    assert [(x["step"], x["epoch"]) for x in knn] == [(spe, 0), (2 * spe, 1)]
    assert all(0 <= x["knn_top1"] <= 1 for x in knn)
    _pretrain(tmp_path / "plain")  # same run, monitor off: the weights must be identical
    a = torch.load(trained["dir"] / rundir.LAST_CHECKPOINT, weights_only=False)["model"]
    b = torch.load(tmp_path / "plain" / rundir.LAST_CHECKPOINT, weights_only=False)["model"]
    assert all(torch.equal(v, b[k]) for k, v in a.items())


def test_monitor_without_labels_notes_once_and_is_off():
    notes = []
    data = ImageData(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), None, [], [f"x{i}" for i in range(4)], "folder:x")
    assert make_monitor(data, {"train": [0, 1], "val": [2, 3]}, 8, torch.device("cpu"), notes.append) is None
    assert len(notes) == 1 and "no labels" in notes[0]


# --- few labels and bad input

def test_labels_per_class_bounds(trained):
    with pytest.raises(PipelineError, match=r"--labels-per-class 50 is more than the \d+ train images of class"):
        le.run(le.EvalConfig(device="cpu", labels_per_class=50), trained["dir"], **QUIET)
    with pytest.raises(PipelineError, match="at least 2"):
        le.run(le.EvalConfig(device="cpu", labels_per_class=1), trained["dir"], **QUIET)
    with pytest.raises(PipelineError, match="--label-draws must be >= 1"):
        le.run(le.EvalConfig(device="cpu", labels_per_class=3, label_draws=0), trained["dir"], **QUIET)


def test_run_without_checkpoint(tmp_path):
    with pytest.raises(PipelineError, match="no checkpoint at"):
        le.run(le.EvalConfig(device="cpu"), tmp_path, **QUIET)


def _folder(root, side, classes=("a", "b"), per_class=4):
    rng = np.random.default_rng(0)
    for c in classes:
        for i in range(per_class):
            d = root / c if c else root
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(d / f"{c}{i}.png")
    return root


def _split_only_run(tmp_path, data, sources):
    """A run directory holding just the split.json a pretraining on `data` would have written."""
    run = tmp_path / "run"
    run.mkdir()
    n = len(sources)
    rundir.write_json_atomic(run / rundir.SPLIT, {"spec": data, "seed": 0, "val_fraction": 0.25, "num_images": n,
                                                   "train": list(range(n)), "val": [], "train_sources": sources,
                                                   "val_sources": []})
    return run


def test_data_without_labels(tmp_path):
    flat = _folder(tmp_path / "flat", 16, classes=("",))
    run = _split_only_run(tmp_path, "synthetic:48", [f"synthetic#{i}" for i in range(48)])
    with pytest.raises(PipelineError, match="has no labels"):
        le.eval_data(FOLDER_CFG, run, f"folder:{flat}")


def test_data_too_small_for_the_image_size(tmp_path):
    small = _folder(tmp_path / "small", 6)  # 16 px run, 6 px images: 2.7x upscale, the run's own needed 1x
    run = _split_only_run(tmp_path, "synthetic:48", [f"synthetic#{i}" for i in range(48)])
    with pytest.raises(PipelineError, match=r"6 px .* 16 px, a 2.7x upscale"):
        le.eval_data(FOLDER_CFG, run, f"folder:{small}")
    ok = _folder(tmp_path / "ok", 8)  # 2x: allowed
    data, split, own = le.eval_data(FOLDER_CFG, run, f"folder:{ok}")
    assert not own and len(split["val"]) == 2 and data.images.shape[-1] == 18  # folders are stored at 8/7 x


def test_data_whose_val_images_were_pretrained_on(tmp_path):
    imgs = _folder(tmp_path / "imgs", 16)
    run = _split_only_run(tmp_path, f"folder:{tmp_path / 'flat'}", sorted(str(p) for p in imgs.rglob("*.png")))
    cfg = dataclasses.replace(FOLDER_CFG, data=f"folder:{tmp_path / 'flat'}")
    with pytest.raises(PipelineError, match="val images were pretraining images"):
        le.eval_data(cfg, run, f"folder:{imgs}")


def test_changed_images_since_the_split(trained, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    split = json.loads((trained["dir"] / rundir.SPLIT).read_text())
    split["train_sources"][0] = "synthetic#999"
    rundir.write_json_atomic(run / rundir.SPLIT, split)
    with pytest.raises(PipelineError, match="no longer those recorded"):
        le.eval_data(trained["cfg"], run, "")


def test_cli_prints_table_and_one_line_errors(trained, tmp_path):
    res = CliRunner().invoke(main, ["linear-eval", "--run", str(_shadow(trained, tmp_path)), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "random init" in res.output and "linear top-1" in res.output and "kNN top-1 (k=20, majority)" in res.output
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["linear-eval", "--run", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1].startswith("error: no checkpoint at")
    (tmp_path / "bad").mkdir()  # a run that has a checkpoint: on an empty one the missing checkpoint is said first
    res = CliRunner().invoke(main, ["linear-eval", "--run", str(_shadow(trained, tmp_path / "bad")), "--label-draws", "0"])
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1].startswith("error: --label-draws must be >= 1")
