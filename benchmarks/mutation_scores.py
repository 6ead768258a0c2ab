"""Mutation score per module from mutmut's results (run `make mutation` first): killed / (checked mutants), where a
timeout or a crash counts as killed (the mutant did not pass the tests) and a mutant no selected test reaches
counts as surviving. Not-checked mutants (outside the patterns of that run) are left out.

    python benchmarks/mutation_scores.py [--survivors]    # from the repository root, after `make mutation`
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

KILLED = {"killed", "timeout", "segfault", "caught by type check"}


def results(mutmut: str) -> list[tuple[str, str]]:
    out = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            rows.append((name, status))
    return rows


def module_of(mutant: str) -> str:
    """train.knn.x_knn_scores__mutmut_3 -> train.knn; methods of classes look like module.xǁClassǁmethod__..."""
    return mutant.split(".x_")[0].split(".xǁ")[0]


def main() -> None:
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    by_module: dict[str, Counter] = defaultdict(Counter)
    survivors = []
    for name, status in results(mutmut):
        if status == "not checked":
            continue
        by_module[module_of(name)][status] += 1
        if status not in KILLED:
            survivors.append(f"{name}: {status}")
    print(f"{'module':28s} {'mutants':>8s} {'killed':>7s} {'survived':>9s} {'no tests':>9s} {'score':>6s}")
    for module in sorted(by_module):
        c = by_module[module]
        total, killed = sum(c.values()), sum(c[s] for s in KILLED)
        print(f"{module:28s} {total:8d} {killed:7d} {c['survived']:9d} {c['no tests']:9d} {100 * killed / total:5.1f}%")
    if "--survivors" in sys.argv:
        print("\n".join(["", "not killed (see one with `mutmut show NAME`):", *survivors]))


if __name__ == "__main__":
    main()
