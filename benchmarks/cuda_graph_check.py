"""CUDA graphs change how the step is launched, not what it computes: each method trained for a few steps from
the same init on the same batches eager (--cuda-graphs off), graphed (on) and, with --compile, compiled inside the
graphs (--compile --cuda-graphs on) and compiled alone (--compile --cuda-graphs off); prints per method the largest
loss difference and the largest relative weight difference at the end of each against eager, and of compiled in
graphs against compiled alone: the graphs' own share, apart from the compiler's other rounding (bf16 autocast).
Usage (a CUDA machine): python3 benchmarks/cuda_graph_check.py [--compile]"""

import statistics
import sys

import torch

from train.configs import PretrainConfig
from train.training import build_training, train_step
from train.runspec import resolve, seed_everything

device = torch.device("cuda")
VARIANTS = ("off", "on", "off+compile", "on+compile") if "--compile" in sys.argv else ("off", "on")
PAIRS = [("off", v) for v in VARIANTS[1:]] + ([("off+compile", "on+compile")] if "--compile" in sys.argv else [])
STEPS, BATCH, SIZE = 20, 128, 32
batches = [[torch.rand(BATCH, 3, SIZE, SIZE, device=device, generator=torch.Generator(device).manual_seed(2 * i + v))
            .contiguous(memory_format=torch.channels_last) for v in (0, 1)] for i in range(STEPS)]
for method in ("simclr", "byol", "mocov3"):
    runs = {}
    for variant in VARIANTS:
        graphs, compiled = variant.removesuffix("+compile"), variant.endswith("+compile")
        cfg = resolve(PretrainConfig(method=method, image_size=SIZE, batch_size=BATCH, epochs=1, device="cuda",
                                     cuda_graphs=graphs, compile=compiled, warmup_epochs=0.1))
        seed_everything(0)
        t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
        assert t.cuda_graphs == (graphs == "on")
        t.model.train()
        losses = [float(train_step(t, x1, x2, i)) for i, (x1, x2) in enumerate(batches)]
        runs[variant] = (losses, {n: p.detach().float().clone() for n, p in t.model.backbone.named_parameters()})
    for ref, variant in PAIRS:
        dl = max(abs(a - b) for a, b in zip(runs[ref][0], runs[variant][0]))
        rel = {n: ((a - runs[variant][1][n]).norm() / a.norm()).item() for n, a in runs[ref][1].items()}
        worst = max(rel, key=rel.get)
        print(f"{method}: losses {ref} {runs[ref][0][0]:.4f} -> {runs[ref][0][-1]:.4f}, {variant} "
              f"{runs[variant][0][0]:.4f} -> {runs[variant][0][-1]:.4f}; max |loss diff| over {STEPS} steps {dl:.2e}; "
              f"max relative weight diff {rel[worst]:.2e} ({worst}; median over parameters {statistics.median(rel.values()):.2e})")
