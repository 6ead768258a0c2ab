"""Every exported artifact of a run against its fp32 encoder, on a labelled image folder (class sub-folders), plus
ONNX with 8-bit weights by onnxruntime's dynamic quantization (not a format the pipeline writes: measured here).

    python benchmarks/compression_measure.py RUN [--folder DIR] [--max-images N] [--out FILE.json]

Without --folder, the run's own val split (what `pipeline validate` measures). The images go through the same
checkers as `pipeline validate` (export/formats.py) and the same metrics (export/parity.py: top-10 agreement,
worst cosine, leave-one-out kNN and linear-probe top-1 drops).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from core import rundir
from core.rundir import SIDECAR, encoder_path
from export import parity
from export.encoder import load_encoder
from stages import validate


def folder_with_labels(folder: Path, size: int, cap: int) -> tuple[torch.Tensor, np.ndarray]:
    images, sources = validate.folder_images(folder, size, 10 ** 9, say=lambda *_: None)
    classes = sorted({Path(s).parent.name for s in sources})
    labels = np.array([classes.index(Path(s).parent.name) for s in sources])
    pick = np.random.default_rng(0).permutation(len(sources))[:cap]  # a seeded sample over all classes
    return images[torch.as_tensor(pick)], labels[pick]


def onnx_int8(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst


def measure(ref, out, labels, k: int = 10) -> dict:
    m = parity.compare(ref, out, k)
    m.pop("per_image", None)
    return {**m, **parity.use_metrics(ref, out, labels, k)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--folder", type=Path)
    ap.add_argument("--max-images", type=int, default=256)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    encoder, state = load_encoder(encoder_path(a.run))
    size = int(state["image_size"])
    if a.folder:
        images, labels = folder_with_labels(a.folder, size, a.max_images)
    else:
        images, _, labels = validate.labelled_val_images(a.run, size, a.max_images)
    with torch.no_grad():
        ref = torch.cat([encoder(images[i: i + 64].float()) for i in range(0, len(images), 64)]).numpy()
    export_dir = a.run / rundir.EXPORT
    artifacts = json.loads((export_dir / SIDECAR).read_text())["artifacts"]
    rows = []
    for entry in artifacts:
        results, _ = validate.outputs(entry["format"], export_dir / entry["file"], images, False)
        runtime, out = results[0]
        rows.append({"artifact": entry["file"], "compression": entry.get("compression", "fp16"), "runtime": runtime,
                     "size_bytes": entry["size_bytes"], **measure(ref, out, labels)})
    onnx = export_dir / "encoder.onnx"
    if onnx.exists():
        from export.onnx_format import check_onnx

        with tempfile.TemporaryDirectory() as tmp:
            q = onnx_int8(onnx, Path(tmp) / "encoder.int8.onnx")
            runtime, out, _ = check_onnx(q, images)
            rows.append({"artifact": "encoder.int8.onnx (onnxruntime quantize_dynamic, QInt8 weights)",
                         "compression": "int8", "runtime": runtime, "size_bytes": q.stat().st_size,
                         **measure(ref, out, labels)})
    result = {"run": str(a.run), "images": len(images), "folder": str(a.folder) if a.folder else None,
              "image_size": size, "rows": rows}
    print(f"{'artifact':62s} {'MB':>6s} {'top10':>6s} {'worstcos':>8s} {'kNN':>6s} {'kNNdrop':>7s} {'probe':>6s} {'pdrop':>6s}")
    for r in rows:
        f = lambda v, s: "n/a" if v is None else format(v, s)  # noqa: E731
        print(f"{r['artifact'][:62]:62s} {r['size_bytes'] / 1e6:6.2f} {f(r.get('topk_agreement'), '6.3f')} "
              f"{f(r.get('worst_cosine'), '8.4f')} {f(r.get('knn_top1'), '6.3f')} {f(r.get('knn_drop'), '+7.3f')} "
              f"{f(r.get('probe_top1'), '6.3f')} {f(r.get('probe_drop'), '+6.3f')}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
