"""Which of: a stream race in the test, the shared memory pool, or numerics, makes the graphed side_views differ from
the eager ones (README.md). On a CUDA machine, in the patched tree: PYTHONPATH=. python3 <this file>."""
import numpy as np
import torch
from train import augment, device_augment

dev = torch.device("cuda")
torch.manual_seed(0)
images = torch.randint(0, 256, (100, 3, 72, 72), dtype=torch.uint8, device=dev)
idx = torch.arange(80).repeat(2)
for share in (True, False):
    device_augment._graphs.clear()
    device_augment._pools.clear()
    rng = np.random.default_rng(0)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    for method in ("simclr", "byol"):
        recipes = augment.recipes_for(method, 96)
        for batch, count in enumerate((10, 70, 150, 70)):
            p = device_augment.rows_of(device_augment.draw_params(80, recipes, 72, 0, 0, batch), [0, 1], slice(0, 80))
            p["blur"] = np.isin(np.arange(160), rng.choice(160, count, replace=False))
            if not share:
                device_augment._pools.clear()
            with torch.cuda.stream(stream):
                made = [device_augment.side_views(images, idx, p, 96, True, torch.float16, True, dev, graphs=g)
                        for g in (False, True)]
                on_stream = torch.equal(*made)
            racy = torch.equal(*made)
            torch.cuda.synchronize()
            d = (made[0] - made[1]).abs()
            bad = (d.flatten(1).amax(1) > 0).nonzero().flatten().tolist()
            print(f"share {share} {method} count {count}: on stream {on_stream}, default stream unsynced {racy}, "
                  f"synced {torch.equal(*made)}, max diff {d.max().item():.3g}, images differing {len(bad)} {bad[:12]}")
