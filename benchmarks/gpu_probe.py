"""Checks and timings of the device augmentation on a CUDA GPU (from the repository root:
`PYTHONPATH=. python3 benchmarks/gpu_probe.py`).

1. parity: device_augment on CUDA (fp32, and the fp16 it trains with) vs the CPU reference (augment.apply_view),
   same parameter rows: max |diff| over all pixels;
2. time of one step's views (both views, whole batch, CUDA events) for docs/benchmarks.md's two configurations,
   eager and replayed as CUDA graphs; the two give the same views; each one's host time to launch a step, its GPU
   time and its top kernels by GPU time (torch.profiler).
"""

import functools
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from train import augment, device_augment

dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} GPU(s)")

for src, out, method in [(32, 32, "simclr"), (256, 224, "byol")]:
    imgs = torch.randint(0, 256, (48, 3, src, src), dtype=torch.uint8, generator=g)
    for v, recipe in enumerate(augment.recipes_for(method, out)):
        p = augment.sample_params(48, recipe, src, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
        ref = torch.stack([augment.apply_view(imgs[i], p, i, out) for i in range(48)])
        for dtype in (torch.float16,):
            got = device_augment.apply_views(imgs.to(dev), p, out, dtype).float().cpu()
            err = (ref - got).abs()
            print(f"parity {method} {src}->{out} view {v + 1} {str(dtype)[6:]}: max |diff| {err.max():.2e}, mean {err.mean():.2e}")

for method, src, out, batch in [("simclr", 256, 224, 256), ("simclr", 32, 32, 512)]:
    images = torch.randint(0, 256, (batch * 8, 3, src, src), dtype=torch.uint8, device=dev)
    recipes = augment.recipes_for(method, out)
    for graphs in (False, True):
        gen = device_augment.device_view_batches(images, recipes, out, batch, 0, 0, 0, dev, channels_last=True,
                                                 graphs=graphs)
        t0 = time.perf_counter()
        next(gen)
        torch.cuda.synchronize()
        how = "graphed" if graphs else "eager"
        print(f"\n{method} {src}->{out} batch {batch}, {how}: first step's views (compiles) {time.perf_counter() - t0:.1f} s")
        for _ in range(2):
            next(gen)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            next(gen)
        end.record()
        torch.cuda.synchronize()
        print(f"{method} {src}->{out} batch {batch}, {how}: one step's views {start.elapsed_time(end) / 5:.2f} ms (events, host included)")
        gen.close()
    # One step's views on this thread's stream (the generator makes them on a worker thread's side stream, which
    # the profiler misses): side_views, what device_view_batches' make() runs for both views of the batch.
    p = device_augment.rows_of(device_augment.draw_params(batch, recipes, src, 0, 0, 1), list(range(len(recipes))),
                               slice(0, batch))
    idx = torch.arange(batch).repeat(len(recipes))
    cover = device_augment.blur_cover([r.blur_p for r in recipes], batch)
    views = functools.partial(device_augment.side_views, images, idx, p, out, cover, torch.float16, True, dev)
    eager, graphed = functools.partial(views, graphs=False), functools.partial(views, graphs=True)
    same = torch.equal(eager(), graphed())
    print(f"  graphed views == eager views, same draws: {same}")
    for how, step in (("eager", eager), ("graphed", graphed)):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            step()
        host = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                step()
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)
        total = sum(e.self_device_time_total for e in rows) / 5
        print(f"  {how}: host {host * 1000:.2f} ms a step to launch; GPU time {total / 1000:.2f} ms a step (alone on the GPU); top kernels, ms a step:")
        for e in rows[:14]:
            print(f"  {e.self_device_time_total / 5000:7.3f} ms  x{e.count // 5:<3d} {e.key[:120]}")
