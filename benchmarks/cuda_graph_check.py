"""CUDA graphs change how the step is launched, not what it computes: each method trained for a few steps from
the same init on the same batches with --cuda-graphs on and off; prints the largest loss difference per method
and the largest relative weight difference at the end (bf16 autocast: expect ~1e-3, not 0, as cuDNN may time
and pick other conv algorithms in each process state). Then a multi-crop method's case: a batch of local views
(half the side) through the graphed backbone takes its plain forward (training.by_shape), beside the captured
batch of global views in the same step: prints the gradients' largest relative difference from graphs off. Usage (a CUDA machine): python3 benchmarks/cuda_graph_check.py"""

import torch

from train.configs import PretrainConfig
from train.training import build_training, train_step
from train.runspec import resolve, seed_everything

device = torch.device("cuda")
STEPS, BATCH, SIZE = 20, 128, 32
batches = [[torch.rand(BATCH, 3, SIZE, SIZE, device=device, generator=torch.Generator(device).manual_seed(2 * i + v))
            .contiguous(memory_format=torch.channels_last) for v in (0, 1)] for i in range(STEPS)]
for method in ("simclr", "byol", "mocov3"):
    runs = {}
    for graphs in ("off", "on"):
        cfg = resolve(PretrainConfig(method=method, image_size=SIZE, batch_size=BATCH, epochs=1, device="cuda",
                                     cuda_graphs=graphs, warmup_epochs=0.1))
        seed_everything(0)
        t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
        assert t.cuda_graphs == (graphs == "on")
        t.model.train()
        losses = [float(train_step(t, views, i)) for i, views in enumerate(batches)]
        runs[graphs] = (losses, [p.detach().float().clone() for p in t.model.backbone.parameters()])
    dl = max(abs(a - b) for a, b in zip(runs["off"][0], runs["on"][0]))
    dw = max(((a - b).norm() / a.norm()).item() for a, b in zip(runs["off"][1], runs["on"][1]))
    print(f"{method}: losses eager {runs['off'][0][0]:.4f} -> {runs['off'][0][-1]:.4f}, graphs {runs['on'][0][0]:.4f} -> "
          f"{runs['on'][0][-1]:.4f}; max |loss diff| over {STEPS} steps {dl:.2e}; max relative weight diff {dw:.2e}")

grads = {}
for graphs in ("off", "on"):
    cfg = resolve(PretrainConfig(method="simclr", image_size=SIZE, batch_size=BATCH, epochs=1, device="cuda",
                                 cuda_graphs=graphs, warmup_epochs=0.1))
    seed_everything(0)
    t, _ = build_training(cfg, device, steps_per_epoch=STEPS)
    t.model.train()
    backbone = t.model.backbone
    local = [torch.nn.functional.interpolate(x, scale_factor=0.5, mode="bilinear").contiguous(memory_format=torch.channels_last)
             for x in batches[0]]
    with t.precision.backbone():  # the globals' call is the captured one (2 x BATCH at SIZE), the locals' is not
        h = torch.cat([backbone(torch.cat(batches[0])), backbone(torch.cat(local))])
    h.float().square().mean().backward()
    grads[graphs] = [p.grad.float().clone() for p in backbone.parameters() if p.grad is not None]
dg = max(((a - b).norm() / a.norm()).item() for a, b in zip(grads["off"], grads["on"]))
print(f"global + local views in one step: {len(grads['on'])} of {len(grads['off'])} gradients, max relative diff {dg:.2e}")
