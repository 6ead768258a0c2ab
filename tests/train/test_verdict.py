"""The evaluation's verdict: better, level or worse than random init by how much on which probes, with the spread of
the few-label draws; a probe that cannot be read (kNN k above a class's images, both backbones at chance) is marked,
explained, left out of the verdict and of the few-label chart. The report and `pipeline show` print the same line."""

from __future__ import annotations

import re

import pytest

from core import rundir
from stages import report
from train import verdict
from stages.report import ReportConfig
from tests.cli_helpers import cli

KEYS = ("top1", "top5", "knn_top1", "knn_majority_top1")


def linear_json(pre: dict, base: dict, few_pre: dict, few_base: dict, few_gain_std: dict, *, per_class=180,
                classes=10, num_val=500, knn_k=200, majority_k=20, k=5) -> dict:
    """A linear.json as stages/linear_eval.py writes it, scores in %: full-train scores, few-label means and
    the std of the paired gain over draws."""
    def frac(d):
        return {key: None if d.get(key) is None else d[key] / 100 for key in KEYS}

    gains = {key: (few_pre[key] - few_base[key]) / 100 for key in few_pre}
    draws = [{**frac(few_pre), "baseline": frac(few_base)} for _ in range(5)]
    return {
        **frac(pre), "baseline": frac(base), "num_train": per_class * classes, "num_val": num_val, "num_classes": classes,
        "train_per_class": {f"c{i}": per_class for i in range(classes)}, "chance_top1": 1 / classes,
        "protocol": {"data": "folder:photos", "linear": {"model": "StandardScaler + LogisticRegression"},
                     "knn": {"k": knn_k, "k_used": min(knn_k, per_class * classes), "temperature": 0.1,
                             "majority_k": majority_k, "majority_k_used": majority_k}},
        "checkpoint": {"method": "simclr", "backbone": "resnet18", "step": 500, "weights_sha256": "a"},
        "baseline_init": {"weights_sha256": "b"},
        "labels_per_class": {"k": k, "num_train": k * classes, "draws": 5, **frac(few_pre), "baseline": frac(few_base),
                             "std": {"pretrained": frac(few_gain_std), "baseline": frac(few_gain_std)},
                             "gain": {**dict.fromkeys(KEYS), **gains}, "gain_std": {**dict.fromkeys(KEYS), **frac(few_gain_std)},
                             "knn_k_used": min(knn_k, k * classes), "majority_k_used": min(majority_k, k * classes),
                             "per_draw": draws},
    }


def probes_of(result: dict) -> dict[str, verdict.Probe]:
    return {p.name: p for p in verdict.probes(result)}


# k=5 and 3 <= the 5 labels a class of the few-label draws: every probe readable
READABLE = dict(knn_k=5, majority_k=3)


def test_better_with_the_gains_and_the_spread():
    r = linear_json({"top1": 90, "knn_top1": 85, "knn_majority_top1": 84}, {"top1": 80, "knn_top1": 75, "knn_majority_top1": 74},
                    {"top1": 70, "knn_top1": 65, "knn_majority_top1": 60}, {"top1": 60, "knn_top1": 55, "knn_majority_top1": 50},
                    {"top1": 2.0, "knn_top1": 3.0, "knn_majority_top1": 4.0}, **READABLE)
    assert verdict.verdict_line(r) == (
        "verdict: better than random init: better on linear top-1 +10.0, kNN top-1 (k=5) +10.0, kNN majority top-1 "
        "(k=3) +10.0, 5-label linear top-1 +10.0 ± 2.0, 5-label kNN top-1 (k=5) +10.0 ± 3.0, 5-label kNN majority "
        "top-1 (k=3) +10.0 ± 4.0 points (level = within 1.0 points or the std over draws)")


def test_level_means_within_a_point_or_the_draws_spread():
    r = linear_json({"top1": 80.5, "knn_top1": 75.9, "knn_majority_top1": 74}, {"top1": 80, "knn_top1": 75, "knn_majority_top1": 74},
                    {"top1": 63, "knn_top1": 55, "knn_majority_top1": 50}, {"top1": 60, "knn_top1": 55, "knn_majority_top1": 50},
                    {"top1": 3.5, "knn_top1": 1.0, "knn_majority_top1": 1.0}, **READABLE)
    found = probes_of(r)
    assert {p.outcome for p in found.values()} == {"level"}  # +3.0 ± 3.5 is within its spread
    assert found["5-label linear top-1"].level_within == pytest.approx(3.5)
    assert verdict.verdict_line(r).startswith("verdict: level with random init: level on linear top-1 +0.5, ")


def test_worse_and_mixed():
    base = {"top1": 80, "knn_top1": 75, "knn_majority_top1": 74}
    worse = {k: v - 5 for k, v in base.items()}
    r = linear_json(worse, base, worse, base, dict.fromkeys(base, 1.0), **READABLE)
    assert verdict.verdict_line(r).startswith("verdict: worse than random init: worse on linear top-1 -5.0, ")
    r = linear_json({**worse, "top1": 86}, base, worse, base, dict.fromkeys(base, 1.0), **READABLE)
    line = verdict.verdict_line(r)
    assert line.startswith("verdict: mixed against random init: better on linear top-1 +6.0; worse on kNN top-1")


def test_one_val_image_is_level_when_it_is_more_than_a_point():
    base = {"top1": 80, "knn_top1": 75, "knn_majority_top1": 74}
    r = linear_json({**base, "top1": 84}, base, base, base, dict.fromkeys(base, 0.0), num_val=20, **READABLE)
    assert probes_of(r)["linear top-1"].outcome == "level"  # 4 points < one of 20 val images (5 points)
    assert "(level = within 5.0 points (one val image) or the std over draws)" in verdict.verdict_line(r)


def unreadable_run() -> dict:
    """The 3-class photo run: 108 train images a class under a k=200 kNN, and a few-label majority vote of 15 over
    5 labels a class that gives 33.3 ± 0.0 for both backbones."""
    return linear_json({"top1": 90, "knn_top1": 77.8, "knn_majority_top1": 85}, {"top1": 80, "knn_top1": 33.4, "knn_majority_top1": 80},
                       {"top1": 70, "knn_top1": 60, "knn_majority_top1": 33.3}, {"top1": 60, "knn_top1": 50, "knn_majority_top1": 33.3},
                       {"top1": 2.0, "knn_top1": 3.0, "knn_majority_top1": 0.0},
                       per_class=108, classes=3, num_val=120, knn_k=200, majority_k=20, k=5)


def test_a_k_above_a_class_and_a_probe_at_chance_are_not_read():
    found = probes_of(unreadable_run())
    assert found["kNN top-1 (k=200)"].outcome == "unreadable" and found["kNN top-1 (k=200)"].reason == "k"
    assert found["kNN top-1 (k=200)"].why == "k=200 > the 108 train images of class 'c0'"
    assert found["5-label kNN top-1 (k=15)"].reason == "k"  # 15 votes over 5 labels a class
    assert found["kNN majority top-1 (k=20)"].outcome == "better"  # 20 <= 108
    chance = linear_json({"top1": 33.3}, {"top1": 33.5}, {"top1": 33.3}, {"top1": 33.3}, {"top1": 0.0},
                         per_class=108, classes=3, num_val=120)
    assert probes_of(chance)["linear top-1"].reason == "chance"
    line = verdict.verdict_line(unreadable_run())
    assert line.startswith("verdict: better than random init: better on linear top-1 +10.0, kNN majority top-1 (k=20) "
                           "+5.0, 5-label linear top-1 +10.0 ± 2.0 points")
    assert line.endswith("; not read: kNN top-1 (k=200 > the 108 train images of class 'c0'), 5-label kNN top-1 "
                         "(k=15 > the 5 labels per class), 5-label kNN majority top-1 (k=15 > the 5 labels per class)")
    assert "+44.4" not in line


def test_an_older_linear_json_without_class_counts_uses_the_mean():
    r = unreadable_run()
    del r["train_per_class"], r["chance_top1"]
    assert probes_of(r)["kNN top-1 (k=200)"].why == "k=200 > the 108 train images per class on average"


def _run_with(tmp_path, result: dict):
    run = tmp_path / "run"
    (run / rundir.EVAL).mkdir(parents=True)
    rundir.write_json_atomic(run / rundir.EVAL / "linear.json", result)
    return run


def test_the_report_puts_the_verdict_on_top_and_marks_what_it_cannot_read(tmp_path, monkeypatch):
    charted = []
    monkeypatch.setattr("stages.report_figures.few_label_draws", lambda metrics: charted.extend(m[0] for m in metrics) or b"")
    result = unreadable_run()
    run = _run_with(tmp_path, result)
    page = report.build(ReportConfig(), run, say=lambda *a: None)
    body = page[page.index("<body>"):]
    first = re.search(r'<p class="verdict">(.*?)</p>', body).group(1)
    assert body.index(first) < body.index("<nav>") and first == report.esc(verdict.verdict_line(result))
    section = body[body.index('id="evaluation"'):body.index('id="retrieval"')]
    assert section.count("not read: k=") == 3 and "not read: k=200 &gt; the 108 train images" in section
    assert '<span class="unread">77.8</span>' in section  # the number is greyed, not shown as a result
    assert "the number measures k more than the encoder" in section and "left out of the verdict" in section
    assert charted == ["linear top-1"]  # the two unreadable few-label kNN are not charted
    assert "probes marked not read are not charted" in section


def test_show_prints_the_same_verdict_line(tmp_path):
    result = unreadable_run()
    run = _run_with(tmp_path, result)
    res = cli("show", "--run", run)
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0] == verdict.verdict_line(result)
