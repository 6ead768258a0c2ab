"""How far the pinned tiny-run losses move across CPU kernel paths, and how far a real regression moves them.

The pins (tests/stages/test_pretrain.py) must hold on every CPU torch runs on, yet catch a 0.1 % change of the loss's
temperature or of one augmentation parameter. This script measures both sides, so the tolerance is set from data:

- divergence: every pinned run (paper and small recipe, three methods; float64, as the tests run them) under each
  kernel path ATen has for this CPU (ATEN_CPU_CAPABILITY=default, avx2, avx512: read when torch loads, hence one
  subprocess each) and with 1 and 2 threads, as the largest relative difference from the pins; beside it the same
  runs in float32, as the largest relative spread between those paths (why the pins are float64);
- regression: the paper-recipe runs with the temperature or the colour-jitter brightness scaled by 1.01 and 1.001.

    .venv/bin/python benchmarks/pin_divergence.py            # one table; ~4 CPU-minutes (30 min on 2 cores shared with other work)

What it printed on an AMD EPYC (AVX-512): benchmarks/results/cpu-pin-divergence/amd-epyc-avx512.txt.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAPABILITIES = ("default", "avx2", "avx512")  # ATen's x86 kernel builds, lowest first
# (label, ATEN_CPU_CAPABILITY or None for the CPU's best, threads)
VARIANTS = [(f"ATEN_CPU_CAPABILITY={c}", c, 1) for c in CAPABILITIES] + [("best path, 2 threads", None, 2)]


def runs(precision: str) -> dict[str, list[float]]:
    """Every pinned run in `precision`: {"recipe/method": its three losses}."""
    from tests.stages.test_pretrain import PINS, pinned_losses

    out = {}
    with tempfile.TemporaryDirectory() as tmp:  # each run leaves a checkpoint of 100-300 MB: gone with the folder
        for recipe, pins in PINS.items():
            for method in pins:
                out[f"{recipe}/{method}"] = pinned_losses(Path(tmp) / f"{recipe}-{method}", method, recipe,
                                                          precision=precision)
    return out


def child(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability().lower(),
                      "fp64": runs("fp64"), "fp32": runs("fp32")}))


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def pinned(run: str) -> list[float]:
    from tests.stages.test_pretrain import PINS

    recipe, method = run.split("/")
    return PINS[recipe][method]


def best_capability() -> str:
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip().lower()


def regressions() -> dict[str, float]:
    """{what changed: how far it moves the paper pins}, in-process at 1 thread."""
    import torch

    import importlib

    from train import recipes
    from tests.stages.test_pretrain import PINNED, pinned_losses

    torch.set_num_threads(1)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for factor in (1.01, 1.001):
            for method in PINNED:
                if method != "byol":  # BYOL's loss has no temperature
                    t = recipes.values("paper", method)["temperature"] * factor
                    out[f"{method} temperature x {factor}"] = rel(pinned_losses(Path(tmp) / f"t{method}{factor}",
                                                                                method, temperature=t), PINNED[method])
                module = importlib.import_module(f"train.methods.{method}")  # the method's file with another SPEC
                original = module.SPEC
                module.SPEC = dataclasses.replace(original, views=tuple(
                    dataclasses.replace(v, brightness=v.brightness * factor) for v in original.views))
                try:
                    out[f"{method} brightness x {factor}"] = rel(pinned_losses(Path(tmp) / f"b{method}{factor}", method),
                                                                 PINNED[method])
                finally:
                    module.SPEC = original
    return out


def main() -> None:
    from tests.stages.test_pretrain import PIN_RTOL, PINS

    names = [f"{r}/{m}" for r, pins in PINS.items() for m in pins]
    best = best_capability()
    worst, fp32 = dict.fromkeys(names, 0.0), {}
    print(f"this CPU's best kernel path: {best}; float64 divergence from the pins:")
    print(f"{'kernel path':36s}" + "".join(f"{n:>14s}" for n in names))
    for label, capability, threads in VARIANTS:
        if capability and capability != "default" and (best not in CAPABILITIES
                                                        or CAPABILITIES.index(capability) > CAPABILITIES.index(best)):
            print(f"{label:36s}  (not offered by this CPU)")
            continue
        env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
        env.update({"TQDM_DISABLE": "1", **({"ATEN_CPU_CAPABILITY": capability} if capability else {})})
        res = subprocess.run([sys.executable, __file__, "--child", str(threads)], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
        out = json.loads(res.stdout.strip().splitlines()[-1])
        diffs = {n: rel(out["fp64"][n], pinned(n)) for n in names}
        worst = {n: max(worst[n], diffs[n]) for n in names}
        fp32[label] = out["fp32"]
        print(f"{label if capability else label + ' (' + out['capability'] + ')':36s}"
              + "".join(f"{diffs[n]:14.2e}" for n in names))
    print(f"{'largest float64 divergence':36s}" + "".join(f"{worst[n]:14.2e}" for n in names))
    spread = {n: max(rel(a[n], b[n]) for a in fp32.values() for b in fp32.values()) for n in names}
    print(f"{'float32 spread, same paths':36s}" + "".join(f"{spread[n]:14.2e}" for n in names))
    print(f"tolerance in the tests (PIN_RTOL): {PIN_RTOL:.1e}, {PIN_RTOL / max(worst.values()):.0f}x the largest "
          "float64 divergence")
    for what, d in regressions().items():
        print(f"regression {what}: moves the pins by {d:.2e} ({d / PIN_RTOL:.1e} x tolerance)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]))
    else:
        main()
