"""Do the views' host calls wait for the GPU? With the GPU kept busy by a long queue of matrix products, time on the
host each piece of one step's views (SimCLR, 32 px, batch 512, graphed, as device_view_batches' make() runs them):
a piece that takes about the queue's length waits for the GPU. Also under torch.cuda.set_sync_debug_mode('warn')."""
import time, warnings
import numpy as np, torch
from train import augment, device_augment as da

dev = torch.device("cuda")
method, src, out, batch = "simclr", 32, 32, 512
images = torch.randint(0, 256, (batch * 8, 3, src, src), dtype=torch.uint8, device=dev)
recipes = augment.recipes_for(method, out)
cover = da.blur_cover([r.blur_p for r in recipes], batch)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

def busy(ms=150):
    torch.cuda.synchronize(); s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record(); a @ a; e.record(); torch.cuda.synchronize(); one = s.elapsed_time(e)
    for _ in range(int(ms / one)):
        a @ a

def pieces(b):
    t = {}
    c = time.perf_counter
    t0 = c(); drawn = da.draw_params(batch, recipes, src, 0, 0, b); t["draw_params"] = c() - t0
    p = da.rows_of(drawn, [0, 1], slice(0, batch))
    t0 = c(); table, at = da._plan(p, out); t["_plan"] = c() - t0
    idx = torch.from_numpy(np.tile(np.arange(batch), 2))
    t0 = c(); d = da.to_device(idx, dev); t["to_device(idx)"] = c() - t0
    t0 = c(); pin = torch.from_numpy(table).pin_memory(); t["pin table"] = c() - t0
    t0 = c(); x = da.side_views(images, idx, p, out, cover, torch.float16, True, dev, graphs=True); t["side_views"] = c() - t0
    return t

for b in range(5):
    pieces(b)
torch.cuda.synchronize()
for label, stream in (("current stream", torch.cuda.current_stream()), ("side stream", torch.cuda.Stream())):
    rows = []
    for b in range(6):
        busy()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            t = pieces(10 + b)
        t["queue left after"] = 0.0
        rows.append(t)
        torch.cuda.synchronize()
    print(f"{label}: host ms per piece with ~150 ms of GPU work queued (median of 6; max)")
    for k in rows[0]:
        v = [1000 * r[k] for r in rows]
        print(f"  {k:<18s} {np.median(v):8.3f}  {max(v):8.3f}")
torch.cuda.set_sync_debug_mode("warn")
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    pieces(50)
print("sync debug warnings:", len(w)); [print("  ", str(x.message)[:200]) for x in w[:8]]
torch.cuda.set_sync_debug_mode(0)
