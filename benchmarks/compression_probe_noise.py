"""How much of a probe drop is noise: each model's own probe (the probe gate of `pipeline validate`) for every
artifact of a run, the uncompressed fp16 files included, at validate's caps and on the whole split.

    python benchmarks/compression_probe_noise.py RUN [--cache FILE.npz] [--out FILE.txt]

For each artifact: the drop in val top-1 of its own probe against the fp32 encoder's own (one C, chosen on the
fp32 train rows), the share of val images the two probes answer differently, and sqrt(share / val images), the
standard deviation of the drop when neither is better (a paired difference of two classifiers). An fp16 file
changes no answer an app sees, so its drop is the noise a gate's bound must stand above.
--cache keeps every artifact's features of the whole split (the reference evaluators take minutes a file).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from core import rundir
from export import parity
from export.encoder import load_encoder
from stages import validate
from train.configs import EvalConfig
from train.probe import fit_probe
from train.runspec import read_run

CAPS = ((256, 1024), (None, 1024), (None, None))  # (val, train) images: validate's defaults, then more of the split


def features(run: Path, both: torch.Tensor, cache: Path | None) -> dict[str, np.ndarray]:
    encoder, _ = load_encoder(run / rundir.EXPORT / "encoder.pt")
    feats = dict(np.load(cache)) if cache and cache.exists() else {}
    feats.setdefault("fp32", validate.encode(encoder, both))
    for a in json.loads((run / rundir.EXPORT / rundir.SIDECAR).read_text())["artifacts"]:
        if a["file"] not in feats:
            results, _ = validate.outputs(a["format"], run / rundir.EXPORT / a["file"], both, False)
            feats[a["file"]] = np.asarray(results[0][1])
            if cache:
                np.savez(cache, **feats)
    return feats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--cache", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    size = int(load_encoder(a.run / rundir.EXPORT / "encoder.pt")[1]["image_size"])
    val, _, vy = validate.labelled_val_images(a.run, size, 10 ** 9)
    train, _, ty = validate.train_images(a.run, size, 10 ** 9)
    n = len(val)
    feats = features(a.run, torch.cat([val, train]), a.cache)
    seed, lines = read_run(a.run).seed, []
    for vcap, tcap in CAPS:
        vi = np.array(validate.spread(list(range(n)), vcap or n))
        ti = n + np.array(validate.spread(list(range(len(train))), tcap or len(train)))
        x = {f: (v[ti].astype(np.float64), v[vi].astype(np.float64)) for f, v in feats.items()}
        (fp32_train, fp32_val), labels = x["fp32"], ty[ti - n]
        ref = parity.reference_probe(fp32_train, labels, fp32_val, vy[vi], EvalConfig().holdout_fraction, seed)
        answers = {f: fit_probe(tr, labels, ref["c"]).predict(va) for f, (tr, va) in x.items()}
        lines.append(f"val {len(vi)}, train {len(ti)}: C {ref['c']:g}, fp32 own probe top-1 {ref['top1']:.3f}")
        for f, p in answers.items():
            if f != "fp32":
                differ = float((p != answers["fp32"]).mean())
                lines.append(f"  {f:32s} drop {ref['top1'] - (p == vy[vi]).mean():+.3f}  answers differ {differ:.3f}  "
                             f"sd {np.sqrt(differ / len(vi)):.3f}")
    print("\n".join(lines))
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
