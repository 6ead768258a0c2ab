"""How long a bad input takes to say so: the median wall time of `pipeline ...` from start to its one `error:` line,
per case, against the 1 s target (tests/pipeline/test_fast_errors.py checks the same cases with generous slack and
that torch was never imported).

Each run is a fresh interpreter, as a user's command is; the cases are made on disk in a temporary folder: every
data error of `pipeline pretrain` (the data SPEC is checked before torch loads), a run folder that already holds a
run and an image side the backbone cannot take, each stage's missing input, and click's own usage errors.

    .venv/bin/python benchmarks/error_latency.py          # 5 runs a case; ~1 min on 2 cores
    .venv/bin/python benchmarks/error_latency.py --runs 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.pipeline.test_fast_errors import data_cases, run_and_side_cases  # noqa: E402  the test's own cases

TARGET_S = 1.0


def cases(tmp: Path) -> list[tuple[str, list[str]]]:
    run = tmp / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    (tmp / "empty_run").mkdir()
    out = [(f"pretrain: {name}", ["pretrain", "--data", spec, "--out", str(tmp / "new")])
           for name, (spec, _) in data_cases(tmp).items()]
    out += [(name, args) for name, (args, _) in run_and_side_cases(tmp).items()]
    out += [(f"{stage}: nothing pretrained", [stage, "--run", str(tmp / "empty_run")])
            for stage in ("linear-eval", "strip", "trace", "export", "validate", "show")]
    out += [("validate: nothing exported", ["validate", "--run", str(run)]),
            ("usage: unknown option", ["pretrain", "--no-such-flag"]),
            ("usage: bad choice", ["pretrain", "--method", "dino"]),
            ("usage: missing value", ["pretrain", "--epochs"])]
    return out


def seconds(args: list[str], cwd: Path) -> tuple[float, str]:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, cwd=cwd,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    took = time.perf_counter() - start
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    if res.returncode != 2 or not lines[-1].startswith("error: "):
        raise SystemExit(f"{args}: expected one error line and exit 2, got {res.returncode}: {lines}")
    return took, lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per case; the median is reported")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = []
        for name, argv in cases(tmp):
            times = [seconds(argv, tmp)[0] for _ in range(args.runs)]
            rows.append((name, statistics.median(times), max(times)))
            if (tmp / "new").exists():
                raise SystemExit(f"{name}: left a run folder behind")
    width = max(len(n) for n, _, _ in rows)
    print(f"{'case':{width}s}  median s  max s  (target {TARGET_S:g} s, {args.runs} runs each, python {sys.version.split()[0]})")
    for name, median, worst in rows:
        print(f"{name:{width}s}  {median:8.2f}  {worst:5.2f}  {'ok' if median < TARGET_S else 'SLOW'}")
    slow = [n for n, m, _ in rows if m >= TARGET_S]
    print(f"{len(rows) - len(slow)} of {len(rows)} cases under {TARGET_S:g} s" + (f"; slow: {', '.join(slow)}" if slow else ""))
    sys.exit(1 if slow else 0)


if __name__ == "__main__":
    main()
