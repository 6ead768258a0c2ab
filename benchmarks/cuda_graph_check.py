"""CUDA graphs change how the step is launched, not what it computes: each method trained for a few steps from
the same init on the same batches eager (--cuda-graphs off), graphed (on: the whole loss captured,
training.LossGraph; MoCo v3 with a key queue, which a capture cannot hold, its backbone alone) and, with
--compile, compiled inside the graphs (--compile --cuda-graphs on) and compiled alone (--compile --cuda-graphs
off); prints per method the largest loss difference and the largest relative weight difference at the end of each
against eager, and of compiled in graphs against compiled alone: the graphs' own share, apart from the compiler's
other rounding (bf16 autocast).
Then a multi-crop method's case, whose backbone alone is captured (training.graph_backbone, called here as
build_training calls it for such a method): a batch of local views (half the side) through the graphed backbone
takes its plain forward (training.by_shape), beside the captured batch of global views in the same step: prints
the gradients' largest relative difference from graphs off. Not for a ViT, which takes one side only.
Stochastic depth (EfficientNet-B0's and ConvNeXt-T's, torchvision's default) draws its masks from the CUDA
generator, whose offset a graph replay advances by the capture's whole total and an eager step op by op, so a
graphed run draws other masks than an eager one: for such a backbone the comparisons above run with it off, and a
last line shows that with it on each replay draws fresh masks: the graphed loss of the same views twice, apart.
Usage (a CUDA machine): python3 benchmarks/cuda_graph_check.py [--compile] [--backbone NAME (default resnet18)]"""

import statistics
import sys

import torch

from torchvision.ops import StochasticDepth

from train.backbones import BACKBONES, build_backbone
from train.configs import PretrainConfig
from train.training import build_training, graph_backbone, train_step
from train.runspec import resolve, seed_everything

device = torch.device("cuda")
VARIANTS = ("off", "on", "off+compile", "on+compile") if "--compile" in sys.argv else ("off", "on")
PAIRS = [("off", v) for v in VARIANTS[1:]] + ([("off+compile", "on+compile")] if "--compile" in sys.argv else [])
STEPS, BATCH, SIZE = 20, 128, 32
BACKBONE = sys.argv[sys.argv.index("--backbone") + 1] if "--backbone" in sys.argv else "resnet18"
# Off (the identity, what p = 0 computes) for the comparisons; put back for the last line.
drop_path = StochasticDepth.forward
STOCHASTIC = any(isinstance(m, StochasticDepth) for m in build_backbone(BACKBONE, small_stem=True, image_size=SIZE)[0].modules())
StochasticDepth.forward = lambda self, x: x
batches = [[torch.rand(BATCH, 3, SIZE, SIZE, device=device, generator=torch.Generator(device).manual_seed(2 * i + v))
            .contiguous(memory_format=torch.channels_last) for v in (0, 1)] for i in range(STEPS)]
for method, queue in (("simclr", None), ("byol", None), ("mocov3", None), ("mocov3", 1024)):
    runs = {}
    for variant in VARIANTS:
        graphs, compiled = variant.removesuffix("+compile"), variant.endswith("+compile")
        cfg = resolve(PretrainConfig(method=method, backbone=BACKBONE, image_size=SIZE, batch_size=BATCH, epochs=1,
                                     device="cuda", cuda_graphs=graphs, compile=compiled, warmup_epochs=0.1,
                                     queue_size=queue))
        seed_everything(0)
        t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
        assert t.cuda_graphs == (graphs == "on")
        t.model.train()
        losses = [float(train_step(t, views, i)) for i, views in enumerate(batches)]
        runs[variant] = (losses, {n: p.detach().float().clone() for n, p in t.model.backbone.named_parameters()})
    for ref, variant in PAIRS:
        dl = max(abs(a - b) for a, b in zip(runs[ref][0], runs[variant][0]))
        rel = {n: ((a - runs[variant][1][n]).norm() / a.norm()).item() for n, a in runs[ref][1].items()}
        worst = max(rel, key=rel.get)
        print(f"{method}{f' (queue {queue})' if queue else ''}: losses {ref} {runs[ref][0][0]:.4f} -> {runs[ref][0][-1]:.4f}, {variant} "
              f"{runs[variant][0][0]:.4f} -> {runs[variant][0][-1]:.4f}; max |loss diff| over {STEPS} steps {dl:.2e}; "
              f"max relative weight diff {rel[worst]:.2e} ({worst}; median over parameters {statistics.median(rel.values()):.2e})")


def fresh_masks() -> None:
    """With stochastic depth on: the graphed SimCLR loss of the same views, weights unchanged, twice."""
    StochasticDepth.forward = drop_path
    cfg = resolve(PretrainConfig(method="simclr", backbone=BACKBONE, image_size=SIZE, batch_size=BATCH, epochs=1,
                                 device="cuda", cuda_graphs="on", compile=False, warmup_epochs=0.1))
    seed_everything(0)
    t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
    t.model.train()
    step = t.loss_graph or (lambda views: t.forward(views, t.precision))  # the whole loss's graph, or the backbone's
    a, b = (step(batches[0]).item() for _ in range(2))
    print(f"stochastic depth on, graphed ({t.captured}): the same views twice give losses {a:.6f} and {b:.6f}, "
          f"{'fresh masks each replay' if a != b else 'THE SAME MASKS TWICE'}")


grads = {}
if BACKBONES[BACKBONE].family == "vit":  # torchvision's VisionTransformer takes the one side it was built for
    print(f"global + local views in one step: not run ({BACKBONE} takes {SIZE} px views only)")
    sys.exit(0)
for graphs in ("off", "on"):
    cfg = resolve(PretrainConfig(method="simclr", backbone=BACKBONE, image_size=SIZE, batch_size=BATCH, epochs=1,
                                 device="cuda", cuda_graphs="off", compile=False, warmup_epochs=0.1))
    seed_everything(0)
    t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
    t.model.train()
    backbone = t.model.backbone
    if graphs == "on":  # what a multi-crop method gets: the backbone alone captured, for the global views
        graph_backbone(backbone, 2 * BATCH, SIZE, t.channels_last, t.precision)
    local = [torch.nn.functional.interpolate(x, scale_factor=0.5, mode="bilinear").contiguous(memory_format=torch.channels_last)
             for x in batches[0]]
    with t.precision.backbone():  # the globals' call is the captured one (2 x BATCH at SIZE), the locals' is not
        h = torch.cat([backbone(torch.cat(batches[0])), backbone(torch.cat(local))])
    h.float().square().mean().backward()
    grads[graphs] = [p.grad.float().clone() for p in backbone.parameters() if p.grad is not None]
dg = max(((a - b).norm() / a.norm()).item() for a, b in zip(grads["off"], grads["on"]))
print(f"global + local views in one step: {len(grads['on'])} of {len(grads['off'])} gradients, max relative diff {dg:.2e}")
if STOCHASTIC:
    fresh_masks()
