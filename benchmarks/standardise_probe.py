"""The views' last pass alone on a CUDA GPU, in the variants it could run as (from the repository root:
`PYTHONPATH=. python3 benchmarks/standardise_probe.py`): SimCLR's 512 views of a batch of 256 at 224 px (fp16, the
resize's layout, a fifth solarized) to fp32 channels last, as train/standardise_kernel.py's kernel at several
PIXELS (how many pixels a program takes, in whole rows) and as the pass torch.compile writes (what the views ran
before the kernel, and with Inductor's tuning options). Each: CUDA events, median and range of 7 rounds of 50
calls, the bandwidth that makes (0.46 GB read and written a call), and the largest difference from the first."""

import statistics

import torch

from train import device_augment, standardise_kernel

dev = torch.device("cuda")
print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
M, S = 512, 224
g = torch.Generator(device=dev).manual_seed(0)
x = device_augment.rows_layout((torch.rand(M, 3, S, S, device=dev, generator=g) * 1.1 - 0.05).half())
sol = (torch.rand(M, 1, device=dev, generator=g) < 0.2).float()
scale, shift = device_augment._standardisation(dev)


def timed(fn, rounds: int = 7, n: int = 50):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b) / n)
    return statistics.median(ms), min(ms), max(ms)


def kernel_at(pixels: int):
    def run():
        standardise_kernel.PIXELS = pixels
        return standardise_kernel.standardise(x, sol, scale, shift, True)
    return run


variants = {f"kernel, PIXELS {p}": kernel_at(p) for p in (256, 512, 1024, 2048, 4096)}
for name, opts in (("compiled", {}), ("compiled, coordinate_descent_tuning", {"coordinate_descent_tuning": True}),
                   ("compiled, max_autotune_pointwise", {"max_autotune_pointwise": True})):
    f = torch.compile(device_augment.standardise, dynamic=False, fullgraph=True, options=opts)
    variants[name] = lambda f=f: f(x, sol, scale, shift, True)
first = None
for name, fn in variants.items():
    out = fn()
    first = out if first is None else first
    med, lo, hi = timed(fn)
    gb = x.numel() * (2 + 4) / 1e9
    print(f"{name:40s} {med:.4f} ms ({lo:.4f}-{hi:.4f}), {gb / med:.2f} TB/s, "
          f"max |diff| {(out - first).abs().max().item():.1e}")
