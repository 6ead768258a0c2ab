"""The markdown table of docs/export.md's compression measurement, from benchmarks/results/compression/:

    python benchmarks/compression_summary.py [benchmarks/results/compression]

one row per run and artifact, on the run's val split: size, top-10 agreement, worst cosine, kNN top-1 drop and the
drop of each model's own linear probe, from `pipeline validate`'s parity.json (with its gates) and, for ONNX with
8-bit weights, from compression_measure.py --only onnx-int8 (the same images and probe; no gate of the pipeline's).
The fp32 encoder's own kNN and probe top-1 head each run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _f(v, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/compression")
    print("| run | artifact | MB | top-10 | worst cos | kNN drop | probe drop | gates |")
    print("|---|---|---|---|---|---|---|---|")
    for parity_file in sorted(root.glob("*.parity.json")):
        name = parity_file.name.removesuffix(".parity.json")
        parity = json.loads(parity_file.read_text())
        rows = [{**r, "gate": "pass" if r["passed"] else "FAIL: " + "; ".join(r["failures"])} for r in parity["rows"]]
        onnx = root / f"{name}.onnx-int8.json"
        rows += [{**r, "gate": "–"} for r in json.loads(onnx.read_text())["rows"]] if onnx.exists() else []
        probe, knn = parity.get("probe", {}), next((r for r in rows if r.get("knn_top1_ref") is not None), {})
        print(f"| **{name}** | fp32 encoder: kNN top-1 {_f(knn.get('knn_top1_ref'), '.3f')}, own probe top-1 "
              f"{_f(probe.get('top1'), '.3f')} (C {_f(probe.get('c'), 'g')}, {probe.get('train_images', 0)} train "
              f"images) | | | | | | |")
        for r in rows:
            size = r.get("size_bytes")
            print(f"| {name} | {r['artifact']} | {_f(size and size / 1e6, '.2f')} | {_f(r.get('topk_agreement'), '.3f')} | "
                  f"{_f(r.get('worst_cosine'), '.4f')} | {_f(r.get('knn_drop'), '+.3f')} | {_f(r.get('probe_drop'), '+.3f')} | "
                  f"{r['gate']} |")


if __name__ == "__main__":
    main()
