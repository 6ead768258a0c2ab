"""kNN top-1 of an encoder on a `folder:` dataset's held-out eval images against its train images (the recipe
grid's measure): features of `export/encoder.pt` (what `pipeline strip` ships: normalisation inside, L2-normalised
output), weighted vote of the k = 200 most cosine-similar train images, exp(sim / 0.1) each (train/knn.py).

    python benchmarks/recipe_knn.py --train DIR --eval DIR (--encoder RUN/export/encoder.pt | --random-init --seed S ...)
        [--device cuda] [--results FILE.jsonl] [--tag key=value ...]

--random-init measures the same architecture at the initial weights of pretraining seed S, for each S given (the
backbone is the first thing `pipeline pretrain` draws after seeding torch). With --results, one JSON line per
encoder is appended to FILE (the tags, the accuracy, the image counts); each is also printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: the repository's packages

import torch  # noqa: E402

from export.encoder import Encoder, load_encoder  # noqa: E402
from train import augment, runspec  # noqa: E402
from train.backbones import build_from_args  # noqa: E402
from train.configs import PretrainConfig  # noqa: E402
from train.data import load_data  # noqa: E402
from train.knn import TEMPERATURE, WEIGHTED_K, weighted_knn_top1  # noqa: E402


@torch.no_grad()
def features(encoder: torch.nn.Module, images: torch.Tensor, device: torch.device, batch: int = 1024) -> torch.Tensor:
    """uint8 N x 3 x S x S -> the encoder's N x D features (fp32, eval mode), on the CPU."""
    return torch.cat([encoder(images[i : i + batch].to(device)).float().cpu() for i in range(0, len(images), batch)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--train", type=Path, required=True)
    ap.add_argument("--eval", type=Path, required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--encoder", type=Path)
    src.add_argument("--random-init", action="store_true")
    ap.add_argument("--seed", type=int, nargs="+", default=[0], help="with --random-init: the pretraining seeds whose init to use")
    ap.add_argument("--backbone", default="resnet18")
    ap.add_argument("--image-size", type=int, default=32, help="with --random-init (an encoder.pt records its own)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--k", type=int, default=WEIGHTED_K)
    ap.add_argument("--temperature", type=float, default=TEMPERATURE)
    ap.add_argument("--results", type=Path)
    ap.add_argument("--tag", action="append", default=[], help="key=value written into the result line")
    args = ap.parse_args()

    device = torch.device(args.device)
    if args.encoder:
        encoder, state = load_encoder(args.encoder)
        size, encoders = state["image_size"], [({}, str(args.encoder), encoder)]
    else:
        size, encoders = args.image_size, []
        run = PretrainConfig(backbone=args.backbone, image_size=size)  # the stem pretraining's defaults give it
        for seed in args.seed:
            torch.manual_seed(seed)
            backbone, _ = build_from_args(run.backbone, runspec.backbone_args(run))
            encoders.append(({"seed": str(seed)}, f"random-init seed {seed}",
                             Encoder(backbone, augment.MEAN, augment.STD, l2_normalize=True).eval()))
    # Decoded at the training size: a 32 px set is used as it is (pretraining stores folders at 8/7 x and crops;
    # the shipped encoder is handed whole images, as an app would).
    train = load_data(f"folder:{args.train}", size)
    held = load_data(f"folder:{args.eval}", size)
    if train.classes != held.classes:
        raise SystemExit(f"error: class folders differ between {args.train} and {args.eval}")
    for tags, name, encoder in encoders:
        t0 = time.perf_counter()
        encoder.to(device)
        bank, queries = features(encoder, train.images, device), features(encoder, held.images, device)
        top1 = weighted_knn_top1(bank, train.labels, queries, held.labels, len(train.classes), args.k, args.temperature)
        rec = {**dict(t.split("=", 1) for t in args.tag), **tags, "knn_top1": 100.0 * top1, "k": args.k,
               "temperature": args.temperature, "train_images": len(train), "eval_images": len(held),
               "encoder": name, "knn_seconds": round(time.perf_counter() - t0, 2)}
        line = json.dumps(rec)
        if args.results:
            with open(args.results, "a") as f:  # one short line per append: concurrent writers do not interleave
                f.write(line + "\n")
        print(line)


if __name__ == "__main__":
    main()
