"""Summary of benchmarks/recipes_gpu.sh: kNN top-1 per dataset x method (x variant) over seeds, beside the random
init of the same seeds, with the pretraining wall times.

    python benchmarks/recipe_summary.py OUT_DIR

    python benchmarks/recipe_summary.py --finished OUT_DIR   (the cells already done, for recipes_gpu.sh)

    python benchmarks/recipe_summary.py --pairs eager compiled FILE.jsonl [FILE.jsonl ...]

    python benchmarks/recipe_summary.py --groups eager,auto compiled FILE.jsonl [FILE.jsonl ...]

--pairs compares two variants of the same cells, seed by seed (the second minus the first): per backbone, dataset
and method, then per method over every backbone and dataset in the files given, as mean ± std with the paired t
(mean / (std / sqrt(n))), the evidence docs/benchmarks.md asks of a compile default (train/backbones.py's
compile_methods). --groups compares every seed of one group of variants with every seed of another, unpaired, per
backbone, dataset and method, with Welch's t: for seeds one side ran and the other did not (a comma joins variants
that ran the same step under two labels, as `auto` is `eager` where a backbone's row compiles no such method).

Reads OUT_DIR/results.jsonl (one line per kNN, written by benchmarks/recipe_knn.py) and OUT_DIR/wall.txt; a grid
of several backbones gets one table per backbone (lines without a backbone tag are ResNet-18's). Per cell:
mean ± sample standard deviation over seeds, [min, max], the gain over random init as the mean ± std of the
per-seed paired differences, and the mean pretraining wall time (shared-GPU time when several ran at once).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def spread(xs: list[float]) -> str:
    """mean ± sample std (n >= 2) and [min, max]."""
    if not xs:
        return "-"
    sd = f" ± {statistics.stdev(xs):.1f}" if len(xs) > 1 else ""
    return f"{statistics.mean(xs):.1f}{sd} [{min(xs):.1f}, {max(xs):.1f}]"


def read_rows(path: Path) -> list[dict]:
    """A results.jsonl's lines; a blank one, or one a kill cut short, is skipped (the grid runs that cell again)."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def cell(r: dict) -> tuple[str, ...]:
    """The cell a line is of: backbone, dataset, method, seed, variant (a random init's variant is "-")."""
    return r.get("backbone", "resnet18"), r["dataset"], r["method"], str(r["seed"]), r.get("variant", "auto")


def finished(rows: list[dict]) -> set[tuple[str, ...]]:
    """The cells with a result: a failed line counts only until a later run of its cell succeeds."""
    return {cell(r) for r in rows if "failed" not in r}


def summarize(out: Path) -> str:
    rows = read_rows(_results_in(out))
    lines = []
    wall = out / "wall.txt"
    if wall.is_file():
        lines.append(wall.read_text().strip())
    by_backbone: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_backbone[r.get("backbone", "resnet18")].append(r)
    for backbone, its in by_backbone.items():
        if len(by_backbone) > 1:
            lines.append(f"## {backbone}")
        lines += table(its)
    return "\n".join(lines)


def table(rows: list[dict]) -> list[str]:
    """One backbone's lines: the cells' table, then its failed runs that no later run of the cell made good."""
    ok, done = [r for r in rows if "failed" not in r], finished(rows)
    failed = [r for r in rows if "failed" in r and cell(r) not in done]
    random_init = {(r["dataset"], r["seed"]): r["knn_top1"] for r in ok if r["method"] == "random-init"}
    cells: dict[tuple, list[dict]] = defaultdict(list)
    for r in ok:
        if r["method"] != "random-init":
            cells[(r["dataset"], r["method"], r.get("variant", "auto"))].append(r)
    lines = []
    lines.append("kNN top-1 % (k=200, T=0.1, cosine) of eval images against train images; mean ± std [min, max] over "
                 "seeds; gain = mean ± std of per-seed (pretrained - random init of that seed)")
    lines.append("| dataset | method | variant (recipe) | seeds | kNN top-1 | random init | gain | pretrain wall s |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for ds in sorted({k[0] for k in cells} | {k[0] for k in random_init}):
        for key in sorted(k for k in cells if k[0] == ds):
            rs = sorted(cells[key], key=lambda r: int(r["seed"]))
            accs = [r["knn_top1"] for r in rs]
            base = [random_init[(ds, r["seed"])] for r in rs if (ds, r["seed"]) in random_init]
            gains = [r["knn_top1"] - random_init[(ds, r["seed"])] for r in rs if (ds, r["seed"]) in random_init]
            gain = (f"{statistics.mean(gains):+.1f}" + (f" ± {statistics.stdev(gains):.1f}" if len(gains) > 1 else "")
                    if gains else "-")
            secs = [int(r["pretrain_ms"]) / 1000 for r in rs if "pretrain_ms" in r]
            recipes = ",".join(sorted({r.get("recipe", "?") for r in rs}))
            wall_s = f"{statistics.mean(secs):.0f}" if secs else "-"
            lines.append(f"| {ds} | {key[1]} | {key[2]} ({recipes}) | {len(rs)} | {spread(accs)} | {spread(base)} | "
                         f"{gain} | {wall_s} |")
        if not any(k[0] == ds for k in cells):
            base = [v for (d, _), v in random_init.items() if d == ds]
            lines.append(f"| {ds} | (random init only) | - | {len(base)} | - | {spread(base)} | - | - |")
    for r in failed:
        lines.append(f"FAILED {r['dataset']} {r['method']} seed {r['seed']} {r.get('variant', '')}: {r['failed']} "
                     f"(log {r['log']})")
    return lines


def pairs(rows: list[dict], first: str, second: str) -> list[str]:
    """second - first per seed, for every backbone, dataset and method that ran both variants of a seed."""
    got: dict[tuple, dict[str, float]] = defaultdict(dict)
    for r in rows:
        if "failed" not in r and r.get("variant") in (first, second):
            got[cell(r)[:4]][r["variant"]] = r["knn_top1"]
    by_cell: dict[tuple, list[tuple[str, float]]] = defaultdict(list)
    for (backbone, ds, method, seed), v in sorted(got.items()):
        if first in v and second in v:
            by_cell[(backbone, ds, method)].append((seed, v[second] - v[first]))

    def stats(ds: list[float]) -> str:
        if len(ds) < 2:
            return f"{ds[0]:+.1f} (one pair)"
        mean, sd = statistics.mean(ds), statistics.stdev(ds)
        t = f", paired t {mean / (sd / math.sqrt(len(ds))):.2f}" if sd > 0 else ""
        return f"{mean:+.1f} ± {sd:.1f} over {len(ds)} pairs{t}"

    lines = [f"kNN top-1 points, {second} - {first}, per seed"]
    by_method: dict[str, list[float]] = defaultdict(list)
    for (backbone, ds, method), its in by_cell.items():
        diffs = [d for _, d in its]
        by_method[method] += diffs
        each = ", ".join(f"s{seed} {d:+.1f}" for seed, d in its)
        lines.append(f"  {backbone} {ds} {method}: {each}; {stats(diffs)}")
    for method, ds in sorted(by_method.items()):
        lines.append(f"{method}, every backbone and set: {stats(ds)}")
    return lines


def groups(rows: list[dict], first: str, second: str) -> list[str]:
    """Every seed of the variants in `second` against every seed of those in `first` (each a comma-separated list),
    per backbone, dataset and method that ran both: each side's mean ± std over its seeds, their difference and
    Welch's t. A cell in several files counts once."""
    sides = first.split(","), second.split(",")
    got: dict[tuple, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in (r for r in rows if "failed" not in r):
        for i, variants in enumerate(sides):
            if r.get("variant") in variants:
                got[cell(r)[:3]][i][f"{r['seed']}/{r['variant']}"] = r["knn_top1"]
    lines = [f"kNN top-1 %, {second} against {first}, every seed of each (unpaired)"]
    for (backbone, ds, method), by_side in sorted(got.items()):
        if len(by_side) < 2:
            continue
        a, b = list(by_side[0].values()), list(by_side[1].values())
        each = "; ".join(f"{name} {spread(xs)} over {len(xs)}" for name, xs in ((first, a), (second, b)))
        diff, t = statistics.mean(b) - statistics.mean(a), ""
        if min(len(a), len(b)) > 1 and (var := statistics.variance(a) / len(a) + statistics.variance(b) / len(b)):
            t = f", Welch t {diff / math.sqrt(var):.2f}"
        lines.append(f"  {backbone} {ds} {method}: {each}; difference {diff:+.1f}{t}")
    return lines


def _results_in(out: Path) -> Path:
    """A grid folder's results.jsonl; one line, not a traceback, for a path that is not such a folder (a results
    file itself belongs to --pairs or --groups)."""
    if not (out / "results.jsonl").is_file():
        raise SystemExit(f"error: {out} is not a grid folder (no results.jsonl in it)")
    return out / "results.jsonl"


def _rows_of(files: list[str]) -> list[dict]:
    rows = []
    for f in map(Path, files):  # results.jsonl files, whichever folders and names they were kept under
        if not f.is_file():
            raise SystemExit(f"error: no results file {f}")
        rows += read_rows(f)
    return rows


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--finished":  # one cell a line, tab-separated
        print("\n".join("\t".join(c) for c in sorted(finished(read_rows(_results_in(Path(sys.argv[2])))))))
    elif len(sys.argv) >= 5 and sys.argv[1] in ("--pairs", "--groups"):
        compare = pairs if sys.argv[1] == "--pairs" else groups
        print("\n".join(compare(_rows_of(sys.argv[4:]), sys.argv[2], sys.argv[3])))
    elif len(sys.argv) == 2:
        print(summarize(Path(sys.argv[1])))
    else:
        raise SystemExit("usage: python benchmarks/recipe_summary.py [--finished] OUT_DIR\n"
                         "       python benchmarks/recipe_summary.py --pairs|--groups VARIANT_A VARIANT_B "
                         "FILE.jsonl...")
