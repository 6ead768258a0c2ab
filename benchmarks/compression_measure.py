"""Every exported artifact of a run against its fp32 encoder, plus ONNX with 8-bit weights by onnxruntime's dynamic
quantization (not a format the pipeline writes: measured here).

    python benchmarks/compression_measure.py RUN [--set DIR] [--only onnx-int8] [--max-images N]
                                             [--max-train-images N] [--out FILE.json]

Images: the run's own split (val images measured, train images for each model's own probe: what `pipeline
validate` measures), or with --set a labelled set laid out as benchmarks/recipe_datasets.py writes it (DIR/eval and
DIR/train, one folder per class; a seeded sample of each). They go through the same checkers as `pipeline validate`
(export/formats.py) and the same metrics (export/parity.py: top-10 agreement, worst cosine, leave-one-out kNN
top-1 drop, and the drop in val top-1 of each model's own linear probe, with one C chosen on the fp32 train rows).
--only onnx-int8: the quantized ONNX alone (validate's parity.json holds the rest).
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
from train.configs import EvalConfig
from train.runspec import read_run


def folder_with_labels(folder: Path, size: int, cap: int, classes: list[str] | None = None):
    """(images, labels, class names): a seeded sample of `cap` images over all classes of a class-folder tree."""
    images, sources = validate.folder_images(folder, size, 10 ** 9, say=lambda *_: None)
    classes = classes or sorted({Path(s).parent.name for s in sources})
    labels = np.array([classes.index(Path(s).parent.name) for s in sources])
    pick = np.random.default_rng(0).permutation(len(sources))[:cap]
    return images[torch.as_tensor(pick)], labels[pick], classes


def onnx_int8(src: Path, dst: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
    return dst


def measure(ref, out, labels, reference, train_labels, n: int, k: int = 10) -> dict:
    """Metrics of `out` (n measured rows, then the train rows) against `ref` (the same layout)."""
    out = np.asarray(out)
    m = parity.compare(ref[:n], out[:n], k)
    m.pop("per_image", None)
    m.update(parity.use_metrics(ref[:n], out[:n], labels, k))
    if reference is not None:
        m.update(parity.probe_metrics(reference, out[n:], train_labels, out[:n], labels))
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--set", type=Path, help="a labelled set with eval/ and train/ class folders")
    ap.add_argument("--only", choices=("onnx-int8",))
    ap.add_argument("--max-images", type=int, default=256)
    ap.add_argument("--max-train-images", type=int, default=1024)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    encoder, state = load_encoder(encoder_path(a.run))
    size = int(state["image_size"])
    if a.set:
        images, labels, classes = folder_with_labels(a.set / "eval", size, a.max_images)
        train, train_labels, _ = folder_with_labels(a.set / "train", size, a.max_train_images, classes)
    else:
        images, _, labels = validate.labelled_val_images(a.run, size, a.max_images)
        train, _, train_labels = validate.train_images(a.run, size, a.max_train_images)
    both, n = torch.cat([images, train]), len(images)
    ref = validate.encode(encoder, both)
    reference = None if labels is None or train_labels is None else parity.reference_probe(
        ref[n:], train_labels, ref[:n], labels, EvalConfig().holdout_fraction, read_run(a.run).seed)
    export_dir = a.run / rundir.EXPORT
    rows = []
    for entry in [] if a.only else json.loads((export_dir / SIDECAR).read_text())["artifacts"]:
        results, _ = validate.outputs(entry["format"], export_dir / entry["file"], both, False)
        runtime, out = results[0]
        rows.append({"artifact": entry["file"], "compression": entry.get("compression", "fp16"), "runtime": runtime,
                     "size_bytes": entry["size_bytes"], **measure(ref, out, labels, reference, train_labels, n)})
    onnx = export_dir / "encoder.onnx"
    if onnx.exists():
        from export.onnx_format import check_onnx

        with tempfile.TemporaryDirectory() as tmp:
            q = onnx_int8(onnx, Path(tmp) / "encoder.int8.onnx")
            runtime, out, _ = check_onnx(q, both)
            rows.append({"artifact": "encoder.int8.onnx (onnxruntime quantize_dynamic, QInt8 weights)",
                         "compression": "int8", "runtime": runtime, "size_bytes": q.stat().st_size,
                         **measure(ref, out, labels, reference, train_labels, n)})
    result = {"run": str(a.run), "images": n, "train_images": len(train), "set": str(a.set) if a.set else None,
              "image_size": size, "probe_c": reference and reference["c"],
              "probe_top1_ref": reference and reference["top1"], "rows": rows}
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
