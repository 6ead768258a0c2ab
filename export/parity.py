"""How far an exported artifact's features are from PyTorch's, and whether that is close enough to ship.

Per image: cosine similarity, relative L2 error ||a - r|| / ||r||, max abs error. Over the set: the worst and mean of
each, and top-k retrieval agreement: for every query, the overlap of its k nearest neighbours (cosine, the query
itself excluded) by PyTorch's features and by the artifact's. Pure numpy; no model in sight.

Cosine alone is too loose a gate: an RGB/BGR swap on a random-init ResNet still scores 0.9989. So an fp32
artifact must match to max abs 1e-4 *and* cosine 0.99999, and an fp16 one must keep every image's relative
error under 1e-2 *and* keep the neighbours an app would retrieve.

Compressed weights (8-bit, 6/4-bit palettized, pruned) move every feature by far more than fp16 storage, and an
elementwise bound would only say so. What an app does with an embedding is retrieve neighbours and classify, so a
compressed artifact is gated on exactly that, against the fp32 encoder, on labelled val images: top-k neighbour
agreement, the drop in leave-one-out kNN top-1, the drop in val top-1 of a linear probe, and the worst cosine,
which catches one image gone wrong that the averages hide.

The probe is the artifact's own, as an app's classifier is fitted on the features of the model it ships: fitted on
the artifact's features of the run's train images and scored on its val features, against the fp32 encoder's own
probe on its own features, with one C for both (chosen on the fp32 train rows by linear-eval's rule, train/probe.py).
A probe fitted on fp32 features and fed the artifact's would measure something else: on an encoder whose features
share one direction, the standardised near-constant dimensions make it fall to chance when every feature moves by
1e-5, while each model's own probe answers as before.
"""

from __future__ import annotations

import math

import numpy as np

PRECISIONS = ("fp32", "fp16", "compressed")  # compressed: weights of `pipeline export --compress`, gated on use


def _rows(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(a.shape[0], -1) if a.ndim != 2 else a


def per_image(ref, out) -> dict[str, np.ndarray]:
    """cosine, rel_l2 and max_abs per row. Zero-norm rows get cosine 0 / rel_l2 inf unless both are zero."""
    r, a = _rows(ref), _rows(out)
    nr, na = np.linalg.norm(r, axis=1), np.linalg.norm(a, axis=1)
    diff = np.linalg.norm(a - r, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where((nr > 0) & (na > 0), (r * a).sum(1) / (nr * na), np.where((nr == 0) & (na == 0), 1.0, 0.0))
        rel = np.where(nr > 0, diff / nr, np.where(diff == 0, 0.0, np.inf))
    return {"cosine": cos, "rel_l2": rel, "max_abs": np.abs(a - r).max(axis=1) if r.shape[1] else np.zeros(len(r))}


def neighbours(feats, k: int) -> np.ndarray:
    """Indices of each row's k most cosine-similar other rows (N x k); ties broken by index, stably."""
    f = _rows(feats)
    n = np.linalg.norm(f, axis=1, keepdims=True)
    f = f / np.where(n > 0, n, 1.0)
    sim = f @ f.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, axis=1, kind="stable")[:, :k]


def topk_agreement(ref, out, k: int) -> float | None:
    """Mean over queries of |kNN_ref & kNN_out| / k, with k clamped to N-1; None when N < 2 (nothing to rank)."""
    n = _rows(ref).shape[0]
    k = min(k, n - 1)
    if k < 1:
        return None
    a, b = neighbours(ref, k), neighbours(out, k)
    return float(np.mean([len(set(x) & set(y)) / k for x, y in zip(a, b)]))


def fp16_floor(ref, k: int) -> float | None:
    """top-k agreement of PyTorch's features with themselves rounded to fp16: what an fp16 artifact keeps even if
    everything before its output were exact. About 1 for images an encoder tells apart; far below when their
    features barely differ (an encoder that has hardly trained, or near-copies of one picture): the neighbour order
    is then decided below fp16's resolution, and a failed top-k gate says so instead of blaming the export."""
    r = _rows(ref)
    return topk_agreement(r, r.astype(np.float16), k)


UNRESOLVED = "PyTorch's own features rounded to fp16 keep"  # the phrase gate_failures adds; validate explains it once
UNRESOLVED_WHY = ("the features barely differ between these images, so their neighbour order is below fp16's "
                  "resolution: an encoder trained too little (train longer, then export again) or near-copies of "
                  "one picture")


def _topk_failure(metrics: dict, bound: float) -> str:
    """The failed top-k gate's phrase, with the fp16 floor when that alone falls below the bound."""
    phrase = f"top{metrics['top_k']}_agreement {metrics['topk_agreement']:.3f} < {bound:g}"
    floor = metrics.get("topk_fp16_floor")
    return phrase + (f" ({UNRESOLVED} {floor:.3f})" if floor is not None and floor < bound else "")


FEW_LABELLED = "labelled val images, each alone moving it by"  # gate_failures' phrase; validate explains it once


def labelled_needed(*bounds: float | None) -> int | None:
    """The fewest labelled val images on which one image changing its answer stays within every drop bound given
    (34 for 0.03): a drop is a count of images over n, so on fewer the gate cannot tell one image from a real loss.
    A bound of 0 (no image may change, at any n) or None asks for none; None when none does."""
    return max((math.ceil(1 / b - 1e-9) for b in bounds if b is not None and b > 0), default=None)


def too_few_labelled(n: int | None, *bounds: float | None) -> int | None:
    """labelled_needed(*bounds) when n labelled images (None or 0: not known) are fewer than that; else None."""
    needed = labelled_needed(*bounds)
    return needed if n and needed and n < needed else None


def _drop_failure(metrics: dict, key: str, bound: float) -> str:
    """The failed drop gate's phrase, saying how many images the drop was read on when one of them alone exceeds
    the bound."""
    phrase = f"{key} {metrics[key]:.3f} > {bound:g}"
    n = metrics.get("labelled_images")
    return phrase + (f" ({n} {FEW_LABELLED} {1 / n:.3f})" if too_few_labelled(n, bound) else "")


def knn_top1(feats, labels, k: int) -> float | None:
    """Leave-one-out majority-vote kNN top-1 within the set (cosine; ties to the lowest class); None: < 2 images."""
    labels = np.asarray(labels)
    n = len(labels)
    k = min(k, n - 1)
    if k < 1:
        return None
    votes = labels[neighbours(feats, k)]
    classes = np.unique(labels)
    counts = (votes[:, :, None] == classes[None, None, :]).sum(axis=1)
    return float(np.mean(classes[counts.argmax(axis=1)] == labels))


def reference_probe(ref_train, train_labels, ref_val, val_labels, holdout_fraction: float, seed: int) -> dict | None:
    """The fp32 encoder's own probe: C chosen on its train rows alone (train/probe.py's rule, as linear-eval), refit
    on all of them, scored once on val. {"c", "selection", "top1"}; None when the train rows cannot train a probe
    (fewer than two classes, or no class with two images to hold one out)."""
    from train.probe import choose_c

    train_labels = np.asarray(train_labels)
    _, counts = np.unique(train_labels, return_counts=True)
    if len(counts) < 2 or counts.max() < 2:
        return None
    selection = choose_c(_rows(ref_train), train_labels, holdout_fraction, seed)
    return {"c": selection["c"], "selection": selection,
            "top1": probe_top1(ref_train, train_labels, ref_val, val_labels, selection["c"])}


def probe_top1(train_x, train_labels, val_x, val_labels, c: float) -> float:
    """Val top-1 of the probe (train/probe.py: StandardScaler + L2 logistic regression at inverse strength c)
    fitted on these train rows alone."""
    from train.probe import fit_probe

    model = fit_probe(_rows(train_x), np.asarray(train_labels), c)
    return float((model.predict(_rows(val_x)) == np.asarray(val_labels)).mean())


def probe_metrics(reference: dict, out_train, train_labels, out_val, val_labels) -> dict:
    """The artifact's own probe (fitted on its train features with the reference's C) against the fp32 encoder's:
    probe_drop > 0 when the artifact's classifier answers worse, read on labelled_images val images."""
    top1 = probe_top1(out_train, train_labels, out_val, val_labels, reference["c"])
    return {"labelled_images": len(val_labels), "probe_c": reference["c"], "probe_top1_ref": reference["top1"],
            "probe_top1": top1, "probe_drop": reference["top1"] - top1}


def use_metrics(ref, out, labels, k: int) -> dict:
    """Leave-one-out kNN top-1 within the labelled val images, fp32 encoder against artifact, the drop (positive:
    the artifact answers worse) and how many images it was read on. Empty without labels. The probe is
    probe_metrics: it needs train rows."""
    if labels is None or len(labels) < 2:
        return {}
    kr, ka = knn_top1(ref, labels, k), knn_top1(out, labels, k)
    return {"labelled_images": len(labels), "knn_k": min(k, len(labels) - 1), "knn_top1_ref": kr, "knn_top1": ka,
            "knn_drop": None if kr is None else kr - ka}


def compare(ref, out, top_k: int = 10) -> dict:
    """All metrics of `out` against `ref` (N x D each). Shapes must match; NaN/inf are reported, not hidden."""
    r, a = _rows(ref), _rows(out)
    if r.shape != a.shape:
        return {"error": f"output shape {tuple(np.shape(out))} != reference {tuple(np.shape(ref))}"}
    if not np.isfinite(a).all():
        return {"error": f"{int((~np.isfinite(a)).sum())} non-finite values in the output"}
    m = per_image(r, a)
    n = r.shape[0]
    return {
        "images": n,
        "worst_cosine": float(m["cosine"].min()) if n else None,
        "mean_cosine": float(m["cosine"].mean()) if n else None,
        "worst_rel_l2": float(m["rel_l2"].max()) if n else None,
        "mean_rel_l2": float(m["rel_l2"].mean()) if n else None,
        "max_abs": float(m["max_abs"].max()) if n else None,
        "top_k": min(top_k, n - 1) if n > 1 else 0,
        "topk_agreement": topk_agreement(r, a, top_k),
        "topk_fp16_floor": fp16_floor(r, top_k),
        "worst_image": int(m["rel_l2"].argmax()) if n else None,
        "per_image": {k: [float(v) for v in m[k]] for k in ("cosine", "rel_l2", "max_abs")},
    }


def gate_failures(metrics: dict, precision: str, *, fp32_max_abs: float, fp32_min_cosine: float,
                  fp16_max_rel_l2: float, fp16_min_topk: float, compressed_min_topk: float | None = None,
                  compressed_max_knn_drop: float | None = None, compressed_max_probe_drop: float | None = None,
                  compressed_min_cosine: float | None = None) -> list[str]:
    """Empty when the artifact passes; else one phrase per failed gate naming the metric, value and bound.
    The bounds (and why) are `stages.validate.ValidateConfig`'s."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if "error" in metrics:
        return [metrics["error"]]
    fails = []
    if precision == "compressed":
        bounds = (compressed_min_topk, compressed_max_knn_drop, compressed_max_probe_drop, compressed_min_cosine)
        if any(b is None for b in bounds):
            raise ValueError("compressed artifacts need all four compressed_* gates")
        agree = metrics["topk_agreement"]
        if agree is None:
            fails.append("top-k agreement needs at least 2 images")
        elif not agree >= compressed_min_topk:
            fails.append(_topk_failure(metrics, compressed_min_topk))
        if not metrics["worst_cosine"] >= compressed_min_cosine:
            fails.append(f"worst_cosine {metrics['worst_cosine']:.4f} < {compressed_min_cosine:g}")
        for key, bound in (("knn_drop", compressed_max_knn_drop), ("probe_drop", compressed_max_probe_drop)):
            if metrics.get(key) is not None and not metrics[key] <= bound:
                fails.append(_drop_failure(metrics, key, bound))
        return fails
    if precision == "fp32":
        if not metrics["max_abs"] <= fp32_max_abs:
            fails.append(f"max_abs {metrics['max_abs']:.3g} > {fp32_max_abs:g}")
        if not metrics["worst_cosine"] >= fp32_min_cosine:
            fails.append(f"worst_cosine {metrics['worst_cosine']:.7f} < {fp32_min_cosine:g}")
    else:
        if not metrics["worst_rel_l2"] <= fp16_max_rel_l2:
            fails.append(f"worst_rel_l2 {metrics['worst_rel_l2']:.3g} > {fp16_max_rel_l2:g}")
        agree = metrics["topk_agreement"]
        if agree is None:
            fails.append("top-k agreement needs at least 2 images")
        elif not agree >= fp16_min_topk:
            fails.append(_topk_failure(metrics, fp16_min_topk))
    return fails
