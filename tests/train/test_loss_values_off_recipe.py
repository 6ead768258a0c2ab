"""Each method's loss, and the kNN probe's votes, at values no recipe uses.

A forward that read a constant instead of its config would pass every test run at a recipe's value: SimCLR's
forward with `0.5` written in is exact at both SimCLR recipes' temperature, MoCo v3's with `0.2` at its small one,
an EMA started from `0.9` at both small recipes' base. Here every method is built with a temperature and an EMA base
that no recipe (paper or small, any method) and no default sets, and its training forward, after one momentum update,
is compared with a reference written out by hand: a Python loop for the loss, the EMA and the cosine schedule
spelled out from the papers. The same for the kNN probe's k, T and majority k against the protocol's defaults.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.config import load_config
from train import configs, recipes
from stages import linear_eval
from train.configs import PretrainConfig
from train.methods import METHODS
from train.runspec import build_model, resolve

TEMPERATURE = 0.37  # no recipe's, no default's: see test_the_values_here_are_no_recipes
MOMENTUM_BASE = 0.73
PROGRESS = 0.3  # the update's share of the run: the cosine schedule's momentum there is neither base nor 1
KNN = dict(knn_k=7, knn_temperature=0.37, majority_k=3)  # against the protocol's 200, 0.1 and 20

FP32 = SimpleNamespace(param_dtype=torch.float32, backbone=lambda: torch.autocast("cpu", enabled=False),
                       heads=lambda: torch.autocast("cpu", enabled=False), head_dtype=None)


def recipe_values(key: str) -> set:
    """Every value `key` gets from a recipe or a method's defaults, over all methods."""
    found = {r[m].values.get(key) for r in recipes.RECIPES.values() for m in METHODS}
    return found - {None}


def test_the_values_here_are_no_recipes():
    assert recipe_values("temperature") == {0.5, 0.2, 1.0}  # the values this file must differ from
    assert recipe_values("momentum_base") == {0.99, 0.9}
    assert TEMPERATURE not in recipe_values("temperature") and MOMENTUM_BASE not in recipe_values("momentum_base")
    assert KNN["knn_k"] not in (configs.WEIGHTED_K, configs.MAJORITY_K) and KNN["majority_k"] != configs.MAJORITY_K
    assert KNN["knn_temperature"] != configs.TEMPERATURE


# --- references written out by hand, in float64

def naive_nt_xent(z1, z2, t):
    """SimCLR: each of the 2N views against the 2N - 1 others, its other view the positive; mean over the 2N."""
    z = torch.cat([z1, z2]).double()
    z = z / z.norm(dim=1, keepdim=True)
    n2 = z.shape[0]
    total = 0.0
    for i in range(n2):
        logits = {j: float(z[i] @ z[j]) / t for j in range(n2) if j != i}
        total -= logits[(i + n2 // 2) % n2] - math.log(sum(math.exp(v) for v in logits.values()))
    return total / n2


def naive_info_nce(q, k, t):
    """MoCo v3: query i's positive is key i, every other key a negative; cross-entropy x 2t."""
    q = q.double() / q.double().norm(dim=1, keepdim=True)
    k = k.double() / k.double().norm(dim=1, keepdim=True)
    total = 0.0
    for i in range(q.shape[0]):
        logits = [float(q[i] @ k[j]) / t for j in range(k.shape[0])]
        total -= logits[i] - math.log(sum(math.exp(v) for v in logits))
    return total / q.shape[0] * 2 * t


def naive_byol(p, z):
    """BYOL: the squared distance of the unit vectors, 2 - 2 cos, averaged over the batch."""
    p, z = p.double(), z.double()
    return sum(float(((p[i] / p[i].norm() - z[i] / z[i].norm()) ** 2).sum()) for i in range(p.shape[0])) / p.shape[0]


def scheduled(base: float, progress: float) -> float:
    """BYOL's cosine schedule from `base` to 1 (Grill et al. 2020, eq. in section 3.2)."""
    return 1 - (1 - base) * (math.cos(math.pi * progress) + 1) / 2


def ema_by_hand(old: torch.nn.Module, online: torch.nn.Module, m: float) -> torch.nn.Module:
    """A copy of `old` with each parameter m * old + (1 - m) * online, and the online network's BN statistics."""
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p, o in zip(new.parameters(), online.parameters()):
            p.copy_(m * p + (1 - m) * o)
        for b, o in zip(new.buffers(), online.buffers()):
            b.copy_(o)
    return new


# --- the methods, built at the off-recipe values

def _built(method: str):
    torch.manual_seed(0)
    cfg = resolve(PretrainConfig(method=method, backbone="resnet18", image_size=16, proj_dim=16, proj_hidden_dim=32,
                                 pred_hidden_dim=32, temperature=TEMPERATURE, momentum_base=MOMENTUM_BASE))
    model, _ = build_model(cfg)
    x1, x2 = (torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(s)) for s in (1, 2))
    return model.train(), x1, x2


def _move_online(model: torch.nn.Module) -> None:
    """A stand-in for an optimizer step: the online networks move, so an EMA of them is not a copy."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=g))


def _online(model, x1, x2, heads):
    z = model.backbone(torch.cat([x1, x2]))
    for h in heads:
        z = h(z)
    return z.chunk(2)


def test_simclr_forward_is_nt_xent_at_the_configured_temperature():
    model, x1, x2 = _built("simclr")
    loss = model([x1, x2], FP32).item()
    z1, z2 = _online(model, x1, x2, [model.projector])
    want = naive_nt_xent(z1.detach(), z2.detach(), TEMPERATURE)
    assert loss == pytest.approx(want, rel=1e-5)
    for t in recipe_values("temperature"):  # the reference tells the configured value from each recipe's
        assert abs(naive_nt_xent(z1.detach(), z2.detach(), t) - want) > 1e-3 * want


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_momentum_forward_after_an_ema_update_at_the_configured_base(method):
    """One after_step at PROGRESS: the momentum networks become the hand-made EMA at the scheduled momentum of
    MOMENTUM_BASE, and the forward's loss is the hand-written loss of the online outputs against those networks'
    (MoCo v3 at TEMPERATURE)."""
    model, x1, x2 = _built(method)
    pairs = {"byol": [("backbone", "target_backbone"), ("projector", "target_projector")],
             "mocov3": [("backbone", "momentum_backbone"), ("projector", "momentum_projector")]}[method]
    old = {mom: copy.deepcopy(getattr(model, mom)) for _, mom in pairs}
    _move_online(model)
    model.after_step(PROGRESS)
    m = scheduled(MOMENTUM_BASE, PROGRESS)
    assert model.momentum == pytest.approx(m, rel=1e-12)
    reference = {mom: ema_by_hand(old[mom], getattr(model, on), m) for on, mom in pairs}
    for on, mom in pairs:
        for (name, got), want in zip(getattr(model, mom).state_dict().items(), reference[mom].state_dict().values()):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, msg=f"{mom}.{name}")

    loss = model([x1, x2], FP32).item()
    p1, p2 = (p.detach() for p in _online(model, x1, x2, [model.projector, model.predictor]))
    with torch.no_grad():
        k1, k2 = _online(SimpleNamespace(backbone=reference[pairs[0][1]]), x1, x2, [reference[pairs[1][1]]])
    if method == "byol":
        want = naive_byol(p1, k2) + naive_byol(p2, k1)
        others = []
    else:
        want = naive_info_nce(p1, k2, TEMPERATURE) + naive_info_nce(p2, k1, TEMPERATURE)
        others = [naive_info_nce(p1, k2, t) + naive_info_nce(p2, k1, t) for t in recipe_values("temperature")]
    assert loss == pytest.approx(want, rel=1e-5)
    for other in others:
        assert abs(other - want) > 1e-3 * want
    # and the targets at a recipe's base would give another loss: the test can tell the base apart
    for base in recipe_values("momentum_base"):
        at_base = {mom: ema_by_hand(old[mom], getattr(model, on), scheduled(base, PROGRESS)) for on, mom in pairs}
        with torch.no_grad():
            b1, b2 = _online(SimpleNamespace(backbone=at_base[pairs[0][1]]), x1, x2, [at_base[pairs[1][1]]])
        other = (naive_byol(p1, b2) + naive_byol(p2, b1) if method == "byol" else
                 naive_info_nce(p1, b2, TEMPERATURE) + naive_info_nce(p2, b1, TEMPERATURE))
        assert abs(other - want) > 1e-4 * want, base


# --- the kNN probe at its configured k, T and majority k

def naive_knn_top1(bank, bank_y, queries, query_y, k, temperature):
    """Cosine similarity to every bank row, the k best vote exp(sim / T) (or 1 each), argmax (ties: lowest class)."""
    hits = 0
    for q, y in zip(queries.astype(np.float64), query_y):
        sims = sorted(((float(q @ b) / (np.linalg.norm(q) * np.linalg.norm(b)), int(c)) for b, c in zip(bank, bank_y)),
                      key=lambda s: -s[0])
        votes = np.zeros(int(bank_y.max()) + 1)
        for s, c in sims[:k]:
            votes[c] += 1.0 if temperature is None else math.exp(s / temperature)
        hits += int(np.argmax(votes) == y)
    return hits / len(query_y)


def _one_point_bank():
    """Bank items at chosen cosines to one query point (the rest of each item orthogonal to it), so the votes can be
    counted by hand: 2 of class 0 at cos 0.95, 5 of class 1 at 0.80, 30 of class 2 at 0.75. Weighted, k 7, T 0.37:
    class 1 (5 e^2.16 > 2 e^2.57); at T 0.1 class 0 (2 e^9.5 > 5 e^8); with k 200 (all 37) class 2. Majority, k 3:
    class 0 (2 of 3); k 20: class 2; k 7: class 1. Queries at that point labelled 1, 1, 0 tell every pair apart."""
    rows, labels = [], []
    for cls, count, cos in ((0, 2, 0.95), (1, 5, 0.80), (2, 30, 0.75)):
        rows += [[cos, 0.0, np.sqrt(1 - cos * cos)]] * count
        labels += [cls] * count
    queries = np.array([[1.0, 0.0, 0.0]] * 3)
    return np.array(rows, dtype=np.float32), np.array(labels), queries.astype(np.float32), np.array([1, 1, 0])


def test_probes_vote_with_the_configured_k_and_temperature():
    bank, bank_y, queries, query_y = _one_point_bank()
    cfg = load_config(linear_eval.EvalConfig, overrides=KNN)
    res = linear_eval.probes(torch.from_numpy(bank), bank_y, torch.from_numpy(queries), query_y, 3, cfg, seed=0)
    weighted = naive_knn_top1(bank, bank_y, queries, query_y, KNN["knn_k"], KNN["knn_temperature"])
    majority = naive_knn_top1(bank, bank_y, queries, query_y, KNN["majority_k"], None)
    assert (weighted, majority) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert (res["knn_top1"], res["knn_majority_top1"]) == (pytest.approx(weighted), pytest.approx(majority))
    # each default, or the weighted vote's k in the majority vote, gives another accuracy than the values set
    assert naive_knn_top1(bank, bank_y, queries, query_y, configs.WEIGHTED_K, KNN["knn_temperature"]) == 0
    assert naive_knn_top1(bank, bank_y, queries, query_y, KNN["knn_k"], configs.TEMPERATURE) == pytest.approx(1 / 3)
    assert naive_knn_top1(bank, bank_y, queries, query_y, configs.MAJORITY_K, None) == 0
    assert naive_knn_top1(bank, bank_y, queries, query_y, KNN["knn_k"], None) == pytest.approx(2 / 3)
