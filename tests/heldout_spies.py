"""Spies on everything that learns from rows, for the held-out tests: each probe fit (the raw rows it receives), each
StandardScaler statistic, each logistic regression, each kNN bank and each score table linear-eval turns into an
accuracy. The real functions still run; the spies only keep copies of their inputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class Seen:
    fits: list = field(default_factory=list)  # (x, y) of each Pipeline.fit, raw rows
    scalers: list = field(default_factory=list)  # (X, index of the Pipeline.fit it ran in, or None)
    classifiers: list = field(default_factory=list)  # (y, index of the Pipeline.fit it ran in, or None)
    banks: list = field(default_factory=list)  # (bank, bank labels, queries) of each knn_scores call
    scores: list = field(default_factory=list)  # (scores, labels) of each topk_accuracy call in linear_eval


def spy(monkeypatch) -> Seen:
    """Record every fit, scaler, classifier, kNN bank and scored table from now on (sklearn's classes and
    stages.linear_eval's names are patched; monkeypatch undoes it)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    from stages import linear_eval

    seen, inside = Seen(), []
    real_pipe, real_scale, real_lr = Pipeline.fit, StandardScaler.partial_fit, LogisticRegression.fit
    real_knn, real_topk = linear_eval.knn_scores, linear_eval.topk_accuracy

    def pipe_fit(self, X, y=None, **kw):
        seen.fits.append((np.array(X, dtype=np.float64), np.array(y)))
        inside.append(len(seen.fits) - 1)
        try:
            return real_pipe(self, X, y, **kw)
        finally:
            inside.pop()

    def scale_fit(self, X, y=None, sample_weight=None):  # StandardScaler.fit computes its statistics here
        seen.scalers.append((np.array(X, dtype=np.float64), inside[-1] if inside else None))
        return real_scale(self, X, y, sample_weight)

    def lr_fit(self, X, y, sample_weight=None):
        seen.classifiers.append((np.array(y), inside[-1] if inside else None))
        return real_lr(self, X, y, sample_weight)

    def knn(bank, bank_labels, queries, *a, **k):
        seen.banks.append((bank.clone(), bank_labels.clone(), queries.clone()))
        return real_knn(bank, bank_labels, queries, *a, **k)

    def topk(scores, labels, *a, **k):
        seen.scores.append((scores.clone(), labels.clone()))
        return real_topk(scores, labels, *a, **k)

    monkeypatch.setattr(Pipeline, "fit", pipe_fit)
    monkeypatch.setattr(StandardScaler, "partial_fit", scale_fit)
    monkeypatch.setattr(LogisticRegression, "fit", lr_fit)
    monkeypatch.setattr(linear_eval, "knn_scores", knn)
    monkeypatch.setattr(linear_eval, "topk_accuracy", topk)
    return seen


def positions(rows, table) -> np.ndarray:
    """Each row's index in `table`, compared exactly (as float64 bytes); -1 for a row `table` does not hold."""
    as64 = lambda a: np.ascontiguousarray(a.numpy() if isinstance(a, torch.Tensor) else a, dtype=np.float64)
    index = {r.tobytes(): i for i, r in enumerate(as64(table))}
    return np.array([index.get(r.tobytes(), -1) for r in as64(rows)], dtype=np.int64)


def assert_learned_from(seen: Seen, train_x, train_y, val_x, banks: bool = True) -> None:
    """Every fit, scaler and classifier learned from train rows only, with their own labels, and no val row; every
    scaler and classifier ran inside a probe fit on that fit's rows; every kNN bank is the train rows themselves
    (banks=False: the learners had no bank to use, and none was made)."""
    assert seen.fits and bool(seen.banks) == banks
    train_y = np.asarray(train_y)
    for i, (x, y) in enumerate(seen.fits):
        pos = positions(x, train_x)
        assert (pos >= 0).all(), f"fit {i}: {int((pos < 0).sum())} of its {len(x)} rows are not train rows"
        assert (positions(x, val_x) < 0).all(), f"fit {i} holds val rows"
        assert np.array_equal(y, train_y[pos]), f"fit {i}: labels are not its rows' train labels"
    assert len(seen.scalers) == len(seen.classifiers) == len(seen.fits)  # one of each per fit, none elsewhere
    for (x, at), (y, at_lr) in zip(seen.scalers, seen.classifiers):
        assert at is not None and at_lr is not None, "a scaler or classifier fitted outside a probe fit"
        assert np.array_equal(x, seen.fits[at][0]), "a scaler's statistics came from other rows than its fit's"
        assert np.array_equal(y, seen.fits[at_lr][1])
    for bank, labels, _ in seen.banks:
        assert (positions(bank, train_x) >= 0).all() and (positions(bank, val_x) < 0).all()
        assert torch.equal(labels.long(), torch.as_tensor(train_y[positions(bank, train_x)]))
