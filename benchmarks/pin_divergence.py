"""How far the pinned tiny-run losses move across CPU kernel paths, and how far a real regression moves them.

The pins (tests/stages/test_pretrain.py) must hold on every CPU torch runs on, yet catch a 1 % change of the loss's
temperature or of one augmentation parameter. This script measures both sides, so the tolerance is set from data:

- divergence: the tiny seeded run of each method under every kernel path this CPU offers — oneDNN capped at each
  instruction set (ONEDNN_MAX_CPU_ISA, read when torch loads oneDNN, hence one subprocess each), ATen's own vector
  kernels (ATEN_CPU_CAPABILITY), oneDNN switched off, 1 and 2 threads — as the largest relative difference from the
  pinned values;
- regression: the same run with the temperature or the colour-jitter brightness scaled by 1.01.

    .venv/bin/python benchmarks/pin_divergence.py            # prints one table; ~1 min on 2 cores
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

# (label, environment, threads, oneDNN on). An ISA above what the CPU has falls back to the best it has.
VARIANTS = [
    ("default, 1 thread", {}, 1, True),
    ("default, 2 threads", {}, 2, True),
    ("oneDNN off (ATen kernels)", {}, 1, False),
    ("ONEDNN_MAX_CPU_ISA=AVX512_CORE", {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, 1, True),
    ("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}, 1, True),
    ("ONEDNN_MAX_CPU_ISA=SSE41", {"ONEDNN_MAX_CPU_ISA": "SSE41"}, 1, True),
    ("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}, 1, True),
    ("ATEN_CPU_CAPABILITY=avx2", {"ATEN_CPU_CAPABILITY": "avx2"}, 1, True),
]


def tiny_losses(method: str, **overrides) -> list[float]:
    """The pinned run (tests/stages/test_pretrain.py::test_pinned_losses), three logged losses."""
    from tests.stages.test_pretrain import PIN_EXTRA
    from tests.tiny_run import pretrain_tiny

    with tempfile.TemporaryDirectory() as tmp:  # each run leaves a 128 MB checkpoint: gone with the folder
        out = Path(tmp) / "run"
        pretrain_tiny(out, **{"method": method, "max_steps": 3, **PIN_EXTRA[method], **overrides})
        return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def child(threads: int, onednn: bool) -> None:
    import torch

    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = onednn
    print(json.dumps({m: tiny_losses(m) for m in ("simclr", "byol", "mocov3")}))


def rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def regressions() -> dict[str, dict[str, float]]:
    import torch

    from stages import augment
    from tests.stages.test_pretrain import PINNED

    torch.set_num_threads(1)
    out = {}
    for method, pinned in PINNED.items():
        row = {}
        if method != "byol":  # BYOL's loss has no temperature
            from stages import recipes

            row["temperature x 1.01"] = rel(tiny_losses(method, temperature=recipes.values("paper", method)
                                                        ["temperature"] * 1.01), pinned)
        original = augment.RECIPES[method]
        augment.RECIPES[method] = tuple(dataclasses.replace(v, brightness=v.brightness * 1.01) for v in original)
        try:
            row["brightness x 1.01"] = rel(tiny_losses(method), pinned)
        finally:
            augment.RECIPES[method] = original
        out[method] = row
    return out


def main() -> None:
    from tests.stages.test_pretrain import PIN_RTOL, PINNED

    worst = {m: 0.0 for m in PINNED}
    print(f"{'kernel path':34s}" + "".join(f"{m:>12s}" for m in PINNED))
    for label, env, threads, onednn in VARIANTS:
        res = subprocess.run([sys.executable, __file__, "--child", str(threads), str(int(onednn))], cwd=ROOT,
                             env={**os.environ, "TQDM_DISABLE": "1", **env}, capture_output=True, text=True,
                             check=True)
        losses = json.loads(res.stdout.strip().splitlines()[-1])
        diffs = {m: rel(losses[m], PINNED[m]) for m in PINNED}
        worst = {m: max(worst[m], diffs[m]) for m in PINNED}
        print(f"{label:34s}" + "".join(f"{diffs[m]:12.2e}" for m in PINNED))
    print(f"{'largest divergence':34s}" + "".join(f"{worst[m]:12.2e}" for m in PINNED))
    print(f"{'tolerance in the test (PIN_RTOL)':34s}" + "".join(f"{PIN_RTOL[m]:12.2e}" for m in PINNED))
    for m, row in regressions().items():
        for what, d in row.items():
            print(f"regression {m} {what}: moves the pins by {d:.2e} ({d / PIN_RTOL[m]:.1f} x tolerance)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), bool(int(sys.argv[3])))
    else:
        main()
