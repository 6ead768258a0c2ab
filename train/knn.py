"""kNN classification of frozen features: the weighted vote of the SSL literature and a plain majority vote.

Weighted (Wu et al. 2018, "Unsupervised feature learning via non-parametric instance discrimination"; the kNN
monitors of the InstDisc, MoCo and DINO code): cosine similarity to the k = 200 most similar bank features, each
neighbour votes for its class with weight exp(sim / T), T = 0.1. scikit-learn's KNeighborsClassifier offers only
uniform or 1/distance weights, not exp(sim / T), so the vote is written here: a few lines of torch, chunked over
the queries so memory stays at chunk x bank however large the sets are.

Majority: the k = 20 most similar bank features, one vote each; a tie goes to the lowest class index (torch's
argmax returns the first maximum; scikit-learn's uniform vote breaks ties the same way).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from train.configs import MAJORITY_K, TEMPERATURE, WEIGHTED_K
from train.features import extract_features



def knn_scores(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, num_classes: int, k: int,
               temperature: float | None, chunk: int = 1024) -> torch.Tensor:
    """Q x C class scores. temperature=None: each of the k neighbours votes 1 (majority); else exp(sim / T).
    k is capped at the bank size (a few-labels bank can be smaller than 200)."""
    bank = F.normalize(bank.float(), dim=1)
    bank_labels = bank_labels.to(bank.device).long()
    k = min(k, bank.shape[0])
    out = []
    for q in queries.float().split(chunk):
        sim = F.normalize(q.to(bank.device), dim=1) @ bank.T
        top_sim, top_idx = sim.topk(k, dim=1)
        weight = torch.ones_like(top_sim) if temperature is None else (top_sim / temperature).exp()
        scores = torch.zeros(q.shape[0], num_classes, dtype=weight.dtype, device=bank.device)
        scores.scatter_add_(1, bank_labels[top_idx], weight)
        out.append(scores.cpu())
    return torch.cat(out) if out else torch.zeros(0, num_classes)


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, k: int = 1) -> float:
    """Fraction of rows whose label is among the k highest scores. Tied scores rank the lower class first (a
    stable sort; topk's order among ties is unspecified), matching argmax and scikit-learn's vote."""
    k = min(k, scores.shape[1])
    ranked = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    hit = (ranked == labels.view(-1, 1).to(scores.device)).any(dim=1)
    return hit.float().mean().item()


def weighted_knn_top1(bank, bank_labels, queries, query_labels, num_classes, k=WEIGHTED_K, temperature=TEMPERATURE) -> float:
    return topk_accuracy(knn_scores(bank, bank_labels, queries, num_classes, k, temperature), query_labels, 1)


def majority_knn_top1(bank, bank_labels, queries, query_labels, num_classes, k=MAJORITY_K) -> float:
    return topk_accuracy(knn_scores(bank, bank_labels, queries, num_classes, k, None), query_labels, 1)


def make_monitor(data, split: dict, image_size: int, device: torch.device, say=print) -> Callable | None:
    """The pretraining loop's kNN monitor: backbone -> weighted kNN top-1 of the val split against the train split
    (the same split pretraining uses, so val images are never in the bank). None, after one note, when the data
    cannot be monitored (no labels, or no val images)."""
    if data.labels is None:
        say(f"note: knn_every is set but {data.spec} has no labels; the kNN monitor is off for this run")
        return None
    if not split["val"]:
        say("note: knn_every is set but the split has no val images (val_fraction 0); the kNN monitor is off")
        return None
    train_idx = torch.as_tensor(split["train"], dtype=torch.long)
    val_idx = torch.as_tensor(split["val"], dtype=torch.long)
    num_classes = len(data.classes)

    def monitor(backbone: torch.nn.Module) -> float:
        bank = extract_features(backbone, data.images[train_idx], image_size, device)
        queries = extract_features(backbone, data.images[val_idx], image_size, device)
        return weighted_knn_top1(bank, data.labels[train_idx], queries, data.labels[val_idx], num_classes)

    return monitor
