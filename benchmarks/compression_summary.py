"""The markdown table of docs/export.md's compression measurement, from benchmarks/results/compression/:

    python benchmarks/compression_summary.py [benchmarks/results/compression]

one row per run and artifact: size, then on the run's val split (`pipeline validate`'s parity.json) and on the
digits-sizes eval folder (compression_measure.py): top-10 agreement, worst cosine, kNN and probe top-1 drop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/compression")
    print("| run | artifact | MB | val: top-10 | worst cos | kNN drop | probe drop | gates | digits-sizes: top-10 | worst cos | kNN drop | probe drop |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for parity_file in sorted(root.glob("*.parity.json")):
        name = parity_file.name.removesuffix(".parity.json")
        val = {r["artifact"]: r for r in json.loads(parity_file.read_text())["rows"]}
        photos_file = root / f"{name}.digits-sizes.json"
        photos = {r["artifact"]: r for r in json.loads(photos_file.read_text())["rows"]} if photos_file.exists() else {}
        for artifact in list(val) + [a for a in photos if a not in val]:
            v, p = val.get(artifact, {}), photos.get(artifact, {})
            size = (v or p).get("size_bytes")
            gate = "–" if not v else ("pass" if v["passed"] else "FAIL: " + "; ".join(v["failures"]))
            print(f"| {name} | {artifact} | {_f(size and size / 1e6, '.1f')} | {_f(v.get('topk_agreement'), '.3f')} | "
                  f"{_f(v.get('worst_cosine'), '.4f')} | {_f(v.get('knn_drop'), '+.3f')} | {_f(v.get('probe_drop'), '+.3f')} | "
                  f"{gate} | {_f(p.get('topk_agreement'), '.3f')} | {_f(p.get('worst_cosine'), '.4f')} | "
                  f"{_f(p.get('knn_drop'), '+.3f')} | {_f(p.get('probe_drop'), '+.3f')} |")


if __name__ == "__main__":
    main()
