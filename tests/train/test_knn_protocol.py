"""The kNN protocol linear-eval and the pretraining monitor ship (weighted: k = 200, T = 0.1; majority: k = 20, one
vote each), checked on a bank built so that every plausible slip gives another accuracy.

Each query's bank holds exactly 200 items at chosen cosine similarities (all other items are orthogonal to it), so
the votes can be counted by hand. Query point A: 3 items of class 0 at cos 0.99, 17 of class 1 at 0.80, 180 of
class 2 at 0.70. Query point B: 3 of class 0 at 0.99, 197 of class 1 at 0.50. Then
  A: weighted k=200 T=0.1 -> class 2 (180 e^7 > 3 e^9.9), weighted k=20 -> class 0 (3 e^9.9 > 17 e^8),
     majority k=20 -> class 1 (17 of 20), majority k=200 -> class 2;
  B: weighted T=0.1 -> class 0 (3 e^9.9 > 197 e^5), weighted T=1 -> class 1 (197 e^0.5 > 3 e^0.99).
With queries A (label 2), A (label 1), A (label 1), B (label 0) the protocol scores weighted 2/4 and majority 2/4;
k = 20 for the weighted vote, T = 1, the majority vote weighted, or k = 200 for the majority vote score 1/4.
(On the 20-image bank of test_linear_json_contract, k = 20 and k = 200 are the same vote.)
"""

import math

import numpy as np
import pytest
import torch

from core.config import load_config
from train import knn
from stages import linear_eval

GROUPS = {  # query point -> (class, count, cosine to the query)
    "A": [(0, 3, 0.99), (1, 17, 0.80), (2, 180, 0.70)],
    "B": [(0, 3, 0.99), (1, 197, 0.50)],
}
QUERIES = [("A", 2), ("A", 1), ("A", 1), ("B", 0)]
DIM = 4  # axis 0: point A, axis 1: point B, axis 3: the rest of every bank item (orthogonal to both queries)


def bank_and_queries():
    axis = {"A": 0, "B": 1}
    rows, labels = [], []
    for point, groups in GROUPS.items():
        for cls, count, cos in groups:
            v = np.zeros(DIM)
            v[axis[point]], v[3] = cos, math.sqrt(1 - cos * cos)
            rows += [v] * count
            labels += [cls] * count
    queries = np.zeros((len(QUERIES), DIM))
    for i, (point, _) in enumerate(QUERIES):
        queries[i, axis[point]] = 1.0
    return (torch.tensor(np.array(rows), dtype=torch.float32), np.array(labels),
            torch.tensor(queries, dtype=torch.float32), np.array([label for _, label in QUERIES]))


def naive_top1(bank, labels, queries, query_labels, k, temperature):
    """One query at a time: the k most cosine-similar bank rows vote exp(sim / T), or 1 each when T is None."""
    hits = 0
    for q, y in zip(queries.numpy().astype(np.float64), query_labels):
        sims = [(float(q @ b / (np.linalg.norm(q) * np.linalg.norm(b))), int(c)) for b, c in zip(bank.numpy(), labels)]
        sims.sort(key=lambda t: -t[0])
        votes = [0.0, 0.0, 0.0]
        for s, c in sims[:k]:
            votes[c] += 1.0 if temperature is None else math.exp(s / temperature)
        hits += int(np.argmax(votes) == y)
    return hits / len(query_labels)


def test_the_bank_separates_the_protocol_from_each_slip():
    bank, labels, queries, qy = bank_and_queries()
    assert naive_top1(bank, labels, queries, qy, 200, 0.1) == 0.5
    assert naive_top1(bank, labels, queries, qy, 20, None) == 0.5
    for k, t in [(20, 0.1), (200, 1.0), (200, None)]:  # weighted with k=20 or T=1, majority weighted or k=200
        assert naive_top1(bank, labels, queries, qy, k, t) == 0.25, (k, t)


def test_linear_eval_probes_use_the_shipped_protocol():
    bank, labels, queries, qy = bank_and_queries()
    cfg = load_config(linear_eval.EvalConfig)  # the defaults `pipeline linear-eval` runs with
    res = linear_eval.probes(bank, labels, queries, qy, 3, cfg, seed=0)
    assert res["knn_top1"] == naive_top1(bank, labels, queries, qy, 200, 0.1) == 0.5
    assert res["knn_majority_top1"] == naive_top1(bank, labels, queries, qy, 20, None) == 0.5


def test_monitor_functions_use_the_shipped_protocol():
    bank, labels, queries, qy = bank_and_queries()
    ty, vy = torch.from_numpy(labels), torch.from_numpy(qy)
    assert knn.weighted_knn_top1(bank, ty, queries, vy, 3) == 0.5
    assert knn.majority_knn_top1(bank, ty, queries, vy, 3) == 0.5


@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_knn_scores_are_the_hand_counted_votes(chunk):
    bank, labels, queries, _ = bank_and_queries()
    weighted = knn.knn_scores(bank, torch.from_numpy(labels), queries[:1], 3, 200, 0.1, chunk=chunk)[0]
    expected = [3 * math.exp(9.9), 17 * math.exp(8.0), 180 * math.exp(7.0)]
    torch.testing.assert_close(weighted.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=0)
    majority = knn.knn_scores(bank, torch.from_numpy(labels), queries, 3, 20, None, chunk=chunk)
    assert majority.tolist() == [[3, 17, 0]] * 3 + [[3, 17, 0]]


def test_topk_accuracy_is_top1_unless_told():
    scores = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.15, 0.05]])  # row 1's label is its second-best class
    labels = torch.tensor([1, 1])
    assert knn.topk_accuracy(scores, labels) == knn.topk_accuracy(scores, labels, 1) == 0.5
    assert knn.topk_accuracy(scores, labels, 2) == 1.0


def test_no_queries_give_an_empty_score_table():
    bank, labels, _, _ = bank_and_queries()
    for t in (0.1, None):
        scores = knn.knn_scores(bank, torch.from_numpy(labels), torch.zeros(0, DIM), 3, 200, t)
        assert scores.shape == (0, 3) and scores.dtype == torch.float32


def test_probes_weighted_knn_is_scored_top1_not_top2():
    """Query A labelled 0: the weighted vote's best is class 2 and its second class 0, so top-1 misses (a top-2
    score would hit); the majority vote's best is class 1 (17 of 20)."""
    bank, labels, queries, _ = bank_and_queries()
    res = linear_eval.probes(bank, labels, queries[:1], np.array([0]), 3, load_config(linear_eval.EvalConfig), seed=0)
    assert res["knn_top1"] == 0.0 and res["knn_majority_top1"] == 0.0
    weighted = knn.knn_scores(bank, torch.from_numpy(labels), queries[:1], 3, 200, 0.1)
    assert knn.topk_accuracy(weighted, torch.tensor([0]), 2) == 1.0


def test_probes_linear_part_is_the_probe_with_the_configured_holdout_and_seed():
    """probes reports linear_probe's top-1, top-5 and C selection for the config's held-out fraction and the given
    seed; two seeds select on different held-out parts, so a seed not passed on would show."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(6, 8, generator=g)
    train_y, val_y = np.repeat(np.arange(6), 12), np.repeat(np.arange(6), 3)  # 12 per class: a held-out part
    train_x = centres[train_y] + 1.5 * torch.randn(len(train_y), 8, generator=g)
    val_x = centres[val_y] + 1.5 * torch.randn(len(val_y), 8, generator=g)
    cfg = load_config(linear_eval.EvalConfig, overrides={"holdout_fraction": 0.25})
    selections = []
    for seed in (0, 1):
        res = linear_eval.probes(train_x, train_y, val_x, val_y, 6, cfg, seed)
        want = linear_eval.linear_probe(train_x.double().numpy(), train_y, val_x.double().numpy(), val_y, 6, 0.25, seed)
        assert (res["top1"], res["top5"], res["selection"]) == (want["top1"], want["top5"], want["selection"])
        assert res["selection"]["method"] == "holdout" and res["selection"]["holdout_size"] == 6 * 3
        selections.append(res["selection"]["holdout_top1_by_c"])
    assert selections[0] != selections[1]
