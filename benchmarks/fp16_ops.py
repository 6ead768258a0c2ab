"""Which ops of an fp16 ML Program make its features' error: the run's .mlpackage through the Core ML reference
evaluator (export/mil_eval.py) against the fp32 encoder on the run's val images (as `pipeline validate` takes
them), first as Core ML stores it (every fp16 op's output rounded), then with one op type's outputs left unrounded
at a time, then with none rounded (the fp16 weights alone).

    PYTHONPATH=$PWD python benchmarks/fp16_ops.py RUN [--images 64]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export import mil_eval  # noqa: E402
from export.encoder import load_encoder  # noqa: E402
from stages.validate import encode, val_images  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--images", type=int, default=64)
    args = ap.parse_args()
    enc, state = load_encoder(args.run / "export" / "encoder.pt")
    images, _ = val_images(args.run, state["image_size"], args.images)
    ref = encode(enc, images)
    model = mil_eval.load_mlpackage(args.run / "export" / "encoder.mlpackage")
    as_declared, unrounded = mil_eval._as_declared, set()

    def declared_unless_chosen(value, var, where: str):
        if any(f"op `{t}`" in where for t in unrounded):
            return torch.as_tensor(value).float()
        return as_declared(value, var, where)

    def error() -> str:
        out = mil_eval.predict_images(model, images)
        e = np.linalg.norm(out - ref, axis=1) / np.linalg.norm(ref, axis=1)
        return f"worst {e.max():.4f}, median {np.median(e):.5f}"

    mil_eval._as_declared = declared_unless_chosen  # this script's own process only
    kinds = collections.Counter(op.op_type for op in model.function.operations if op.op_type != "const")
    print(f"{args.run}: {len(images)} val images, relative L2 of the features against the fp32 encoder")
    print(f"  as Core ML stores it: {error()}")
    for kind, n in kinds.most_common():
        unrounded = {kind}
        print(f"  {kind:<12} x{n:<3} left unrounded: {error()}")
    unrounded = set(kinds)
    print(f"  nothing rounded (the fp16 weights alone): {error()}")


if __name__ == "__main__":
    main()
