"""The pinned losses hold under every CPU kernel path this machine offers, not only under the one it picks.

ATen builds its CPU kernels once per instruction set and picks the best the CPU has; ATEN_CPU_CAPABILITY caps that
choice, read once when torch loads, hence one subprocess per capability. Each runs every pinned run
(tests/stages/test_pretrain.py: paper and small recipe, three methods) and must land on the pins. The capability this
test process itself runs on is left out: test_pinned_losses and test_small_recipe_pins check it in-process (so
`make test-portable`, which runs the suite under each capability, covers each one once in-process as well).
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.stages.test_pretrain import PIN_RTOL, PINS

ROOT = Path(__file__).resolve().parents[2]
CAPABILITIES = ("default", "avx2", "avx512")  # ATen's x86 kernel builds, lowest first

CHILD = """
import json, tempfile
from pathlib import Path
import torch
torch.set_num_threads(1)
from tests.stages.test_pretrain import PINS, pinned_losses
losses = {}
with tempfile.TemporaryDirectory() as tmp:
    for recipe, pins in PINS.items():
        for method in pins:
            losses[f"{recipe}/{method}"] = pinned_losses(Path(tmp) / f"{recipe}-{method}", method, recipe)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability().lower(), "losses": losses}))
"""


@functools.cache
def best_capability() -> str:
    """The best kernel path this CPU has, as torch picks it when nothing caps it. (Asking for one above it is not
    safe: torch takes the name as given.)"""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        return torch.backends.cpu.get_cpu_capability().lower()
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip().lower()


@pytest.mark.parametrize("capability", CAPABILITIES)
def test_pins_hold_under_each_kernel_path(tmp_path, capability):
    if capability == torch.backends.cpu.get_cpu_capability().lower():
        pytest.skip(f"this process runs on {capability}: test_pinned_losses and test_small_recipe_pins check it")
    best = best_capability()
    if capability != "default" and (best not in CAPABILITIES or CAPABILITIES.index(capability) > CAPABILITIES.index(best)):
        pytest.skip(f"this CPU has no {capability} (its best: {best})")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability, "TQDM_DISABLE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # ~40 s of CPU; the limit is for a hang, with room for a machine that runs much else besides
    res = subprocess.run([sys.executable, "-c", CHILD], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["capability"] == capability  # the cap took effect: the child ran the kernels it was meant to
    rel = {run: max(abs(a - b) / abs(b) for a, b in zip(losses, PINS[run.split("/")[0]][run.split("/")[1]]))
           for run, losses in out["losses"].items()}
    assert len(rel) == 6 and max(rel.values()) <= PIN_RTOL, f"{capability}: relative divergence from the pins {rel}"
