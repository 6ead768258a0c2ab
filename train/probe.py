"""The linear probe of frozen features, as linear-eval reports it and validate gates a compressed encoder with:
StandardScaler + L2 logistic regression (lbfgs, deterministic), its inverse strength C chosen on the train rows
alone (a per-class held-out part, or stratified k-fold when a class is small), then refit on all of them.

Numpy and scikit-learn only, rows in and a fitted model out: whoever calls it decides which rows are train rows,
and val is never an argument of a fit or of the selection.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from core.errors import PipelineError

# Inverse L2 strengths on standardised features, a decade apart from strong to weak regularisation: five fits are
# cheap next to feature extraction, and a finer grid would mostly fit the noise of a small held-out part.
C_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0)
CV_BELOW = 10  # below this many images in a class a held-out part is 1-2 of them: too few to rank C, so use k-fold
CV_FOLDS = 5  # the usual k, capped at the smallest class's count so every fold holds out every class
MAX_ITER = 1000  # lbfgs needs tens of iterations on standardised features; the cap only stops pathologies


def holdout_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit, held-out) indices: per class, `fraction` of the images (at least 1) held out and at least 1 kept to
    fit; deterministic in seed. Hand-written because StratifiedShuffleSplit draws one global fraction and fails
    when that is smaller than the number of classes, as with a few labels per class."""
    rng = np.random.default_rng(seed)
    fit, held = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_held = min(len(idx) - 1, max(1, round(len(idx) * fraction)))
        held.append(idx[:n_held])
        fit.append(idx[n_held:])
    return np.sort(np.concatenate(fit)), np.sort(np.concatenate(held))


@functools.cache
def _blas_controller():
    """Built once: threadpool_limits rescans the loaded libraries on every call, a third of a few-label fit's time
    (the k-fold selection makes hundreds). Called after sklearn is imported, so its BLAS is already loaded."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def fit_probe(x: np.ndarray, y: np.ndarray, c: float):
    """StandardScaler (fitted on these rows only) + L2 logistic regression (lbfgs: deterministic)."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=MAX_ITER))
    # One BLAS thread: the fit no longer depends on the core count (threaded sums round differently), and
    # OpenBLAS's thread hand-offs cost more than they save at this size (measured on 2 busy cores: 8 ms vs
    # 0.1 ms per L-BFGS step with 2k parameters).
    with warnings.catch_warnings(), _blas_controller().limit(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)  # recorded per fit instead (n_iter == MAX_ITER)
        model.fit(x, y)
    return model


def selection_splits(labels: np.ndarray, holdout_fraction: float, seed: int) -> tuple[str, list[tuple[np.ndarray, np.ndarray]]]:
    """(method, [(fit, held-out) indices]). A class with 2 to CV_BELOW - 1 images: stratified k-fold, k = min(CV_FOLDS,
    smallest class), so every image is held out exactly once; else one per-class held-out part (a full train split:
    cheap and large enough; a class with one image cannot be in every fold)."""
    smallest = int(np.unique(labels, return_counts=True)[1].min())
    if not 2 <= smallest < CV_BELOW:
        return "holdout", [holdout_split(labels, holdout_fraction, seed)]
    from sklearn.model_selection import StratifiedKFold

    folds = min(CV_FOLDS, smallest)
    kfold = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    return f"stratified {folds}-fold", list(kfold.split(np.zeros((len(labels), 1)), labels))


def choose_c(train_x: np.ndarray, train_y: np.ndarray, holdout_fraction: float, seed: int) -> dict:
    """Model selection on the train rows alone (val is not an argument, so it cannot leak in): each C of the grid
    is scored by its mean held-out top-1 over the splits of selection_splits; ties go to the smaller C (stronger L2)."""
    method, splits = selection_splits(train_y, holdout_fraction, seed)
    if len(splits[0][1]) == 0:
        raise PipelineError("every class has a single labelled train image: none can be held out to choose C")
    scores = {c: float(np.mean([(fit_probe(train_x[fit], train_y[fit], c).predict(train_x[held]) == train_y[held]).mean()
                                for fit, held in splits])) for c in C_GRID}
    best = max(C_GRID, key=lambda c: (scores[c], -c))
    sizes = ({"fit_size": len(splits[0][0]), "holdout_size": len(splits[0][1])} if method == "holdout" else
             {"fit_size_per_fold": [len(f) for f, _ in splits], "holdout_size_per_fold": [len(h) for _, h in splits]})
    return {"c": best, "method": method, "holdout_top1_by_c": {f"{c:g}": s for c, s in scores.items()}, **sizes}
