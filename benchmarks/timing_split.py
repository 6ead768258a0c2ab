"""Where a pretraining run's wall time went, for benchmarks/recipe_timing.sh: from the run's metrics.jsonl (one line
every log_every steps, each with its window's img/s), the steps' time, the first window's share of it (the views'
graph capture and the first steps' warm-up: the model's own compile and capture run before the first step) and the
steady img/s; and the table of the runs' medians per method.

    python3 benchmarks/timing_split.py split RUN/metrics.jsonl BATCH       # one JSON object's fields, no braces
    python3 benchmarks/timing_split.py table timing.jsonl DATASET EPOCHS BATCH DEVICE
"""
import json
import math
import statistics
import sys


def split(rows: list[dict], batch: int) -> dict:
    """steps: the last step any line records (the run's own count, not a log line's wording); train_s: the steps'
    time, each window's steps x batch / its img/s; first_s: the first window's; img_s: the median of the later
    windows' img/s (the first holds the views' capture and warm-up). Rows without img_s (pretrain writes none, but
    such a line would carry no time) are left out of the time."""
    steps = max((r["step"] for r in rows if "step" in r), default=0)
    rows = [r for r in rows if "img_s" in r]
    last, secs = 0, []
    for row in rows:
        secs.append((row["step"] - last) * batch / row["img_s"])
        last = row["step"]
    later = [r["img_s"] for r in rows[1:]] or [0.0]
    return {"steps": steps, "train_s": round(sum(secs), 3), "first_s": round(secs[0] if secs else 0.0, 3),
            "img_s": round(statistics.median(later), 1)}


def table(rows: list[dict], dataset: str, epochs: str, batch: str, device: str) -> str:
    """The medians per method, in the order the methods first ran; other s is wall - train (start-up, data
    loading, the model's compile and graph capture, which run before the first step, and the last checkpoint).
    A run whose split failed (train_s null) makes its method's split columns nan."""
    def med(rs, key):
        return statistics.median(r[key] for r in rs) if all(r.get(key) is not None for r in rs) else math.nan

    out = [f"wall time of the whole command, {dataset}, {epochs} epochs, batch {batch}, {device}",
           f"{'method':8} {'runs':>4} {'steps':>6} {'median s':>9} {'min s':>7} {'max s':>7} {'train s':>8} "
           f"{'first s':>8} {'img/s':>8} {'other s':>8}"]
    for m in dict.fromkeys(r["method"] for r in rows):
        rs = [r for r in rows if r["method"] == m]
        t = [r["wall_s"] for r in rs]
        steps = "/".join(map(str, sorted({r["steps"] for r in rs})))
        other = [r["wall_s"] - r["train_s"] for r in rs if r.get("train_s") is not None] or [math.nan]
        out.append(f"{m:8} {len(t):>4} {steps:>6} {statistics.median(t):>9.1f} {min(t):>7.1f} {max(t):>7.1f} "
                   f"{med(rs, 'train_s'):>8.1f} {med(rs, 'first_s'):>8.1f} {med(rs, 'img_s'):>8,.0f} "
                   f"{statistics.median(other):>8.1f}")
    out.append("train s: the steps' time from metrics.jsonl (first s of it: the first window, the views' capture and "
               "warm-up); img/s: median of the later windows; other s: wall - train (start-up, data loading, the "
               "model's compile and graph capture, checkpoint); all medians")
    return "\n".join(out)


def _rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


if __name__ == "__main__":
    verb, path, *rest = sys.argv[1:]
    if verb == "split":
        print(json.dumps(split(_rows(path), int(rest[0])))[1:-1])
    elif verb == "table":
        print(table(_rows(path), *rest))
    else:
        sys.exit(f"timing_split: unknown verb {verb!r}: split or table")
