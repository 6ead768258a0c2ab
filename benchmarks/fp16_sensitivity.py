"""How sensitive an encoder's features are to fp16, and where: the relative L2 error of its L2-normalised features
(what `pipeline validate` gates at 1e-2 for an fp16 artifact) when PyTorch rounds to fp16 (a) the outputs of one
kind of layer, (b) every weight, (c) one weight tensor at a time (the worst few). Runs in fp32 on the CPU, rounding
where told, so each cause is seen alone; Core ML's fp16 program does all of them at once.

    PYTHONPATH=$PWD python benchmarks/fp16_sensitivity.py RUN/export/encoder.pt [--images 64]

The images are the synthetic SPEC's at the encoder's size (shapes on noise): the question is the network's
conditioning, not its accuracy.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.encoder import load_encoder  # noqa: E402
from train.data import make_synthetic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("encoder", type=Path)
    ap.add_argument("--images", type=int, default=64)
    args = ap.parse_args()
    enc, state = load_encoder(args.encoder)
    images = make_synthetic(args.images, state["image_size"], seed=1).images.float()
    leaves = [m for m in enc.modules() if not list(m.children())]

    def features(rounded: tuple = ()) -> torch.Tensor:
        hooks = [m.register_forward_hook(lambda m, i, o: o.half().float()) for m in leaves if isinstance(m, rounded)]
        with torch.no_grad():
            out = enc(images)
        for h in hooks:
            h.remove()
        return out

    ref = features()

    def relative(f: torch.Tensor) -> np.ndarray:
        return ((f - ref).norm(dim=1) / ref.norm(dim=1)).numpy()

    def error(f: torch.Tensor) -> str:
        e = relative(f)
        return f"worst {e.max():.4f}, median {np.median(e):.5f}"

    kinds = tuple(sorted({type(m) for m in leaves}, key=lambda t: t.__name__))
    print(f"{args.encoder}: {len(images)} images at {state['image_size']} px, relative L2 of the features")
    print(f"  every layer's output in fp16: {error(features(kinds))}")
    for kind in kinds:
        print(f"  {kind.__name__:<20} outputs in fp16: {error(features((kind,)))}")
    worst = []
    with torch.no_grad():
        params = list(enc.named_parameters())
        kept = [p.clone() for _, p in params]
        for (name, p), keep in zip(params, kept):
            p.copy_(p.half().float())
            worst.append((float(relative(features()).max()), name, tuple(p.shape)))
            p.copy_(keep)
        for _, p in params:
            p.copy_(p.half().float())
        print(f"  every weight in fp16: {error(features())}")
        for (_, p), keep in zip(params, kept):
            p.copy_(keep)
    print("  one weight tensor in fp16, the worst five:")
    for e, name, shape in sorted(worst, reverse=True)[:5]:
        print(f"    worst {e:.4f}  {name} {shape}")


if __name__ == "__main__":
    main()
