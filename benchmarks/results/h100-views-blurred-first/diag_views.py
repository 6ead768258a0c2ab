"""Which of: a stream race in the test, the shared memory pool, or numerics, makes the graphed side_views differ from
the eager ones (README.md). The steps of tests/train/test_device_augment.py's blurred-first CUDA test, with the
graphs sharing one pool and then with a pool each; per step, the views compared on the stream that made them, on the
default stream unsynced (what the test did), and after a device sync, with the largest difference and the views
that differ. On a CUDA machine, in the patched tree: PYTHONPATH=. python3 <this file>."""
import torch

from tests.train.test_device_augment import blurred_first_steps
from train import device_augment

dev = torch.device("cuda")
for share in (True, False):
    device_augment._graphs.clear()
    device_augment._pools.clear()
    torch.manual_seed(0)
    images, idx, steps = blurred_first_steps(dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    for method, count, p in steps:
        if not share:
            device_augment._pools.clear()
        with torch.cuda.stream(stream):
            made = [device_augment.side_views(images, idx, p, 96, True, torch.float16, True, dev, graphs=g)
                    for g in (False, True)]
            on_stream = torch.equal(*made)
        unsynced = torch.equal(*made)
        torch.cuda.synchronize()
        d = (made[0] - made[1]).abs()
        bad = (d.flatten(1).amax(1) > 0).nonzero().flatten().tolist()
        print(f"share {share} {method} count {count}: on stream {on_stream}, default stream unsynced {unsynced}, "
              f"synced {torch.equal(*made)}, max diff {d.max().item():.3g}, views differing {len(bad)} {bad[:12]}")
