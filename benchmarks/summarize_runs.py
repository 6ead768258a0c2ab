"""Print, per run: loss at the first and last logged step, kNN monitor values, and linear-eval vs random init.
Usage: python benchmarks/summarize_runs.py RUN [RUN ...] [--markdown-rows]"""

import json
import sys
from pathlib import Path


def pct(x):
    return "-" if x is None else f"{100 * x:.1f}"


runs = [Path(a) for a in sys.argv[1:] if a != "--markdown-rows"]
for run in runs:
    if not (run / "metrics.jsonl").is_file():
        print(f"== {run.name}: no metrics.jsonl (pretraining did not start; see its log)")
        continue
    lines = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [l for l in lines if "loss" in l]
    knn = [f"{l['epoch']}:{pct(l['knn_top1'])}" for l in lines if "knn_top1" in l]
    if losses:
        print(f"== {run.name}: steps {losses[-1]['step']}, loss {losses[0]['loss']:.4f} (step {losses[0]['step']}) -> "
              f"{losses[-1]['loss']:.4f} (step {losses[-1]['step']}), median img/s {sorted(l['img_s'] for l in losses)[len(losses) // 2]:.0f}")
    print(f"   kNN monitor (epoch:top1%) {' '.join(knn)}")
    if not (run / "eval" / "linear.json").is_file():
        print("   no eval/linear.json (linear-eval did not finish; see its log)")
        continue
    ev = json.loads((run / "eval" / "linear.json").read_text())
    b = ev["baseline"]
    few = ev.get("labels_per_class") or {}
    print(f"   linear top1 {pct(ev['top1'])} vs {pct(b['top1'])} | kNN-200 top1 {pct(ev['knn_top1'])} vs {pct(b['knn_top1'])}"
          f" | kNN-20 majority {pct(ev.get('knn_majority_top1'))} vs {pct(b.get('knn_majority_top1'))}")
    if few and "gain" in few:  # means over draws; the paired gain's std says whether the gain is more than the draw
        fb, g, gs = few["baseline"], few["gain"], few["gain_std"]
        print(f"   {few['k']} labels/class, mean of {few['draws']} draws (pretrained vs random, paired gain ± std pt):")
        metrics = (("linear top1", "top1"), ("kNN-200 top1", "knn_top1"), ("kNN-20 majority", "knn_majority_top1"))
        print("     " + " | ".join(f"{name} {pct(few[key])} vs {pct(fb[key])} ({100 * g[key]:+.1f} ± {100 * gs[key]:.1f})"
                                   for name, key in metrics))
    elif few:
        print(f"   {few['k']} labels/class: single draw (older linear.json): linear top1 {pct(few['top1'])} vs "
              f"{pct(few['baseline']['top1'])}; re-run linear-eval for means over draws")

# --markdown-rows: docs/recipes.md's table rows (top-1 %, pretrained vs random init, gain in points), one per run that has
# an eval/linear.json with few-label draws, named by its directory.
if "--markdown-rows" in sys.argv:
    print()
    for run in runs:
        path = run / "eval" / "linear.json"
        if not path.is_file():
            continue
        ev = json.loads(path.read_text())
        b, few = ev["baseline"], ev.get("labels_per_class") or {}
        if "gain" not in few:
            continue
        cells = [f"{pct(ev['top1'])} vs {pct(b['top1'])}",
                 f"{pct(ev['knn_top1'])} vs {pct(b['knn_top1'])} ({100 * (ev['knn_top1'] - b['knn_top1']):+.1f})",
                 f"{pct(ev['knn_majority_top1'])} vs {pct(b['knn_majority_top1'])}"]
        cells += [f"{pct(few[k])} vs {pct(few['baseline'][k])} ({100 * few['gain'][k]:+.1f} ± {100 * few['gain_std'][k]:.1f})"
                  for k in ("top1", "knn_top1", "knn_majority_top1")]
        print(f"| {run.name} | " + " | ".join(cells) + " |")
