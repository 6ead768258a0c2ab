"""Host time of a step's view parameters on the device path: the draws (device_augment.draw_params), the rows of
one side (rows_of) and the table the device reads (_plan), for both views of a batch, the work the views' thread
does on the host every step before any kernel is launched (at small image sizes it shares the host, and Python's
GIL, with the training step's launches: docs/benchmarks.md). No GPU needed.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/views_host.py [--repeats 7] [--steps 100]

Run it in another source tree (PYTHONPATH=that tree) to compare two commits on one machine; prints one line per
case: the median over `repeats` timings of `steps` steps, and the range (on a shared virtual machine the
minimum is the steadier figure: interleave the two trees' runs several times).
"""

import argparse
import statistics
import time

from train import augment, device_augment

CASES = (("simclr", 32, 32, 512), ("byol", 32, 32, 512), ("simclr", 224, 256, 256))  # method, px, source px, batch


def one_step(recipes, size: int, src: int, batch: int, b: int):
    drawn = device_augment.draw_params(batch, recipes, src, 0, 0, b)
    if isinstance(drawn, dict):
        p = device_augment.rows_of(drawn, list(range(len(recipes))), slice(0, batch))
    else:  # the per-view dicts this path had before draw_views
        p = device_augment.rows_of(list(drawn), slice(0, batch))
    return device_augment._plan(p, size)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    for method, size, src, batch in CASES:
        recipes = augment.recipes_for(method, size)  # once, as a training run asks for them: not a step's work
        for b in range(20):
            one_step(recipes, size, src, batch, b)  # warm: numpy's and the caches' first calls
        ms = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for b in range(args.steps):
                one_step(recipes, size, src, batch, b)
            ms.append((time.perf_counter() - t0) / args.steps * 1e3)
        print(f"{method} {size} px, batch {batch}: {statistics.median(ms):.3f} ms a step "
              f"(median of {args.repeats} x {args.steps} steps; {min(ms):.3f}-{max(ms):.3f})")


if __name__ == "__main__":
    main()
