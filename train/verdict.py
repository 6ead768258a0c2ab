"""What an evaluation found: each probe better, level or worse than random init, or the reason it cannot be read,
and one verdict line from them. A pure function of eval/linear.json, torch-free: the report (stages/report.py)
puts the line at the top of the page and `pipeline show` prints it.

A probe cannot be read when its number says nothing about the features:
- a kNN whose k is larger than a class's train images: at least k - n of the votes come from other classes
  however good the features are (k=200 with 108 images per class; a 20-vote majority over 5 labels per class);
- a probe at chance for both backbones (33.3 % on 3 balanced classes, the same on every draw): it predicted one
  class whatever it was given, so the two backbones cannot be told apart by it.
"""

from __future__ import annotations

from dataclasses import dataclass

LEVEL_POINTS = 1.0  # gains this close to 0 are level: a point is below what one re-run of the probe moves
METRICS = {"top1": "linear top-1", "knn_top1": "kNN top-1", "knn_majority_top1": "kNN majority top-1"}  # top-5: no


# Why a probe cannot be read, in full (the report's note); Probe.why says it in a few words with the numbers.
EXPLAIN = {
    "k": "a kNN vote over more neighbours than a class has train images: the extra votes come from other classes "
         "however good the features are, so the number measures k more than the encoder (`pipeline linear-eval "
         "--knn-k N --majority-k N` with N at most the smallest class reads it)",
    "chance": "both backbones score the best constant guess: the probe predicts (nearly) one class whatever it is "
              "given, so it cannot tell the two backbones apart",
}


@dataclass(frozen=True)
class Probe:
    name: str  # e.g. "5-label kNN top-1 (k=50)"
    title: str  # the name without its k (a reason that cannot be read repeats it)
    key: str  # its metric in linear.json
    few: bool  # a few-labels probe (mean over draws)
    gain: float  # points, pretrained - random init
    spread: float  # points: std of the paired gain over draws (0: one measurement)
    level_within: float  # points: |gain| up to this is level
    outcome: str  # better | level | worse | unreadable
    reason: str = ""  # a key of EXPLAIN when it cannot be read
    why: str = ""  # the reason in a few words, with its numbers


def _smallest_class(result: dict) -> tuple[int, str]:
    """(train images, name) of the smallest class the run's train split holds; from the counts linear-eval records,
    else the mean (an older linear.json)."""
    counts = {c: n for c, n in (result.get("train_per_class") or {}).items() if n > 0}
    if counts:
        name = min(counts, key=counts.get)
        return counts[name], f"train images of class {name!r}"
    return result["num_train"] // max(1, result["num_classes"]), "train images per class on average"


def _unreadable(key: str, pre: float, base: float, k_used: int | None, per_class: tuple[int, str], chance: float,
                tol: float) -> tuple[str, str]:
    """(reason, why) or ("", "") for a readable probe."""
    if key != "top1" and k_used is not None and k_used > per_class[0]:
        return "k", f"k={k_used} > the {per_class[0]} {per_class[1]}"
    if abs(100 * pre - 100 * chance) <= tol and abs(100 * base - 100 * chance) <= tol:
        return "chance", f"both within {tol:.1f} points of chance, {100 * chance:.1f} %"
    return "", ""


def probes(result: dict) -> list[Probe]:
    """Every probe of a linear.json with its outcome: linear top-1 and both kNN on all train labels, then the same on
    K labels per class (the draws' mean, its paired std as the spread)."""
    knn = result["protocol"]["knn"]
    classes = result["num_classes"]
    chance = result.get("chance_top1", 1.0 / max(1, classes))
    one_image = 100.0 / max(1, result["num_val"])
    out = []
    few = result.get("labels_per_class")
    sets = [(False, result, result["baseline"], {}, knn["k_used"], knn["majority_k_used"], _smallest_class(result))]
    if few and "per_draw" in few:
        sets.append((True, few, few["baseline"], few["gain_std"], few["knn_k_used"], few["majority_k_used"],
                     (few["k"], "labels per class")))
    for is_few, pre, base, gain_std, k, majority_k, per_class in sets:
        for key, title in METRICS.items():
            if pre.get(key) is None or base.get(key) is None:
                continue
            k_used = {"knn_top1": k, "knn_majority_top1": majority_k}.get(key)
            title = (f"{few['k']}-label " if is_few else "") + title
            name = title + (f" (k={k_used})" if k_used is not None else "")
            spread = 100 * (gain_std.get(key) or 0.0)
            tol = max(LEVEL_POINTS, one_image, spread)
            gain = 100 * (pre[key] - base[key])
            reason, why = _unreadable(key, pre[key], base[key], k_used, per_class, chance, max(LEVEL_POINTS, one_image))
            outcome = "unreadable" if reason else "better" if gain > tol else "worse" if gain < -tol else "level"
            out.append(Probe(name, title, key, is_few, gain, spread, tol, outcome, reason, why))
    return out


def gain_text(p: Probe) -> str:
    return f"{p.gain:+.1f}" + (f" ± {p.spread:.1f}" if p.few else "")


def overall(found: list[Probe]) -> str:
    """better | worse | level | mixed | unreadable: the probes that can be read, taken together."""
    outcomes = {p.outcome for p in found if p.outcome != "unreadable"}
    if not outcomes:
        return "unreadable"
    if "better" in outcomes and "worse" in outcomes:
        return "mixed"
    return "better" if "better" in outcomes else "worse" if "worse" in outcomes else "level"


HEADLINE = {"better": "better than random init", "worse": "worse than random init", "level": "level with random init",
            "mixed": "mixed against random init", "unreadable": "no probe can be read"}


def verdict_line(result: dict) -> str:
    """One line: the verdict, the gain (points) of each probe by outcome, what level means, the probes not read."""
    found = probes(result)
    parts = []
    for outcome in ("better", "level", "worse"):
        those = [p for p in found if p.outcome == outcome]
        if those:
            parts.append(f"{outcome} on " + ", ".join(f"{p.name} {gain_text(p)}" for p in those))
    line = f"verdict: {HEADLINE[overall(found)]}"
    if parts:
        one_image = 100.0 / max(1, result["num_val"])
        rule = f"within {max(LEVEL_POINTS, one_image):.1f} points" + (" (one val image)" if one_image > LEVEL_POINTS else "")
        rule += " or the std over draws" if any(p.few for p in found) else ""
        line += f": {'; '.join(parts)} points (level = {rule})"
    unread = [p for p in found if p.outcome == "unreadable"]
    if unread:
        line += "; not read: " + ", ".join(f"{p.title} ({p.why})" for p in unread)
    return line
