"""Where the training thread's host time goes in `pipeline bench` (MobileNetV3-Small, SimCLR, 32 px, batch 512): the
host seconds of each train_step call, ceiling and end to end apart (nothing waits for the GPU inside a step: the
loop reads the loss a step late), then the same run under cProfile (the training thread only)."""
import cProfile, pstats, statistics, sys, time
import torch
from stages import bench
from train.configs import BenchConfig

times, phase = {"ceiling": [], "e2e": []}, {"now": "ceiling"}
inner = bench.train_step
def timed(t, views, step):
    t0 = time.perf_counter(); out = inner(t, views, step); times[phase["now"]].append(time.perf_counter() - t0); return out
bench.train_step = timed
inner_phase = bench.phase
def phased(cfg, p, device, step, name, *a):
    phase["now"] = name; return inner_phase(cfg, p, device, step, name, *a)
bench.phase = phased
args = dict(method="simclr", backbone="mobilenet_v3_small", image_size=32, batch_size=512, augment="device", channels_last="on")
args.update(dict(a.split("=", 1) for a in sys.argv[1:]))
for k in ("image_size", "batch_size", "windows", "window_steps", "warmup"):
    if k in args: args[k] = int(args[k])
cfg = BenchConfig(**args)
r = bench.run(cfg, say=lambda *a: None)
print(f"ratio {r['ratio']:.3f} e2e {r['e2e_img_s']:.0f} ceiling {r['ceiling_img_s']:.0f}")
for k, v in times.items():
    v = v[10:] or v
    print(f"train_step host ms ({k}): median {1000 * statistics.median(v):.3f}, p10 {1000 * sorted(v)[len(v) // 10]:.3f}, p90 {1000 * sorted(v)[9 * len(v) // 10]:.3f}, n {len(v)}")
import dataclasses
cfg = dataclasses.replace(cfg, windows=2)
pr = cProfile.Profile(); pr.enable(); bench.run(cfg, say=lambda *a: None); pr.disable()
st = pstats.Stats(pr, stream=sys.stdout); st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumulative").print_callees("train_step")
st.sort_stats("cumulative").print_stats(45)
