"""The seed spread of one configuration: each run's gain over its random init (points) on every probe linear-eval
reports, then mean ± std over the runs and mean − std (the bar `make all`'s default is held to: > +5).

    python benchmarks/seed_spread.py RUN [RUN ...]

Each RUN is a run directory with eval/linear.json made with `--labels-per-class K` (benchmarks/default_run_candidates.sh
writes them, one per seed: `CANDIDATES="s0:--seed 0;s1:--seed 1;s2:--seed 2;s3:--seed 3"`). Prints a Markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

METRICS = (("kNN (k 200)", lambda ev: ev["knn_top1"] - ev["baseline"]["knn_top1"]),
           ("linear", lambda ev: ev["top1"] - ev["baseline"]["top1"]),
           ("few-label linear", lambda ev: ev["labels_per_class"]["gain"]["top1"]),
           ("few-label kNN", lambda ev: ev["labels_per_class"]["gain"]["knn_top1"]))


def main(runs: list[Path]) -> None:
    evals = {run.name: json.loads((run / "eval" / "linear.json").read_text()) for run in runs}
    print("| metric | " + " | ".join(evals) + " | mean ± std | mean − std |")
    print("|---" * (len(evals) + 3) + "|")
    for name, gain in METRICS:
        points = [100 * gain(ev) for ev in evals.values()]
        mean, std = statistics.mean(points), statistics.stdev(points) if len(points) > 1 else 0.0
        print(f"| {name} | " + " | ".join(f"{p:+.1f}" for p in points) + f" | {mean:+.1f} ± {std:.1f} | {mean - std:+.1f} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main([Path(a) for a in sys.argv[1:]])
