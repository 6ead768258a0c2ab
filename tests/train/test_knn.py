"""kNN votes against obviously-correct versions: a Python loop for the weighted SSL protocol, scikit-learn for
the majority vote."""

import math

import numpy as np
import pytest
import torch

from train.knn import knn_scores, majority_knn_top1, topk_accuracy, weighted_knn_top1


def _data(seed=0, n_bank=120, n_query=40, dim=16, classes=5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_bank, dim, generator=g), torch.randint(0, classes, (n_bank,), generator=g),
            torch.randn(n_query, dim, generator=g), torch.randint(0, classes, (n_query,), generator=g))


def _naive_weighted(bank, bank_labels, queries, classes, k, temperature):
    """Cosine similarity to every bank row, sort, take the k best, add exp(sim / T) to their classes."""
    out = []
    for q in queries.tolist():
        sims = []
        for row in bank.tolist():
            dot = sum(a * b for a, b in zip(q, row))
            sims.append(dot / (math.sqrt(sum(a * a for a in q)) * math.sqrt(sum(b * b for b in row))))
        order = sorted(range(len(sims)), key=lambda i: -sims[i])[:k]
        scores = [0.0] * classes
        for i in order:
            scores[int(bank_labels[i])] += math.exp(sims[i] / temperature)
        out.append(scores)
    return torch.tensor(out)


@pytest.mark.parametrize("k,temperature", [(1, 0.1), (7, 0.1), (20, 0.5), (200, 0.1)])  # 200 > bank: capped
def test_weighted_matches_naive_loop(k, temperature):
    bank, bl, q, ql = _data()
    got = knn_scores(bank, bl, q, 5, k, temperature, chunk=16)  # chunked: 3 chunks of queries
    want = _naive_weighted(bank, bl, q, 5, k, temperature)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(got.argmax(1), want.argmax(1))
    acc = weighted_knn_top1(bank, bl, q, ql, 5, k, temperature)
    assert acc == pytest.approx((want.argmax(1) == ql).float().mean().item())


@pytest.mark.parametrize("k", [1, 5, 20])
def test_majority_matches_sklearn(k):
    from sklearn.neighbors import KNeighborsClassifier

    bank, bl, q, ql = _data(seed=1, n_bank=300, n_query=200, classes=10)
    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(bank.numpy(), bl.numpy())
    want = clf.predict(q.numpy())
    got = knn_scores(bank, bl, q, 10, k, None).argmax(1).numpy()
    np.testing.assert_array_equal(got, want)  # includes tied votes: both give the lowest class
    assert majority_knn_top1(bank, bl, q, ql, 10, k) == pytest.approx(float((want == ql.numpy()).mean()))


def test_cosine_ignores_feature_scale_and_chunking():
    bank, bl, q, _ = _data(seed=2)
    a = knn_scores(bank, bl, q, 5, 10, 0.1, chunk=1024)
    b = knn_scores(bank * 7.0, bl, q * 0.01, 5, 10, 0.1, chunk=3)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_topk_accuracy_by_hand():
    scores = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    labels = torch.tensor([1, 1, 0])
    assert topk_accuracy(scores, labels, 1) == pytest.approx(1 / 3)
    assert topk_accuracy(scores, labels, 2) == pytest.approx(2 / 3)
    assert topk_accuracy(scores, labels, 5) == 1.0  # k capped at the number of classes


def test_tied_scores_rank_the_lower_class_first():
    scores = torch.tensor([[1.0, 1.0, 0.0]])
    assert topk_accuracy(scores, torch.tensor([0]), 1) == 1.0
    assert topk_accuracy(scores, torch.tensor([1]), 1) == 0.0
