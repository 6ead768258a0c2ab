"""What a job may ask for: PretrainConfig's own fields (a submission is checked by core/config.py against the very
class `pipeline pretrain` loads), the export groups of the format table, the configs/*.yaml a job may start from,
and the machine's facts: the devices `pipeline doctor` finds usable, the one `auto` picks, whether Core ML predicts,
and the options each method alone reads. All of it is read in the server's process, torch-free, but the machine's
facts: finding them needs torch, which only a short-lived child imports (`describe`), so the server stays small and
starts fast.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from core.config import _base_type, _fields
from export.formats import to_choices
from train.configs import PretrainConfig

PROJECT = Path(__file__).resolve().parents[2]  # the folder holding the packages: the children's import root
CONFIG_DIR = PROJECT / "configs"  # the YAML files a job may start from (its `recipe`)
SERVER_SET = ("data",)  # the server fills these: the data is the upload or an allowed SPEC, never a path typed in
MACHINE = "import json; from pipeline.serve.options import machine_facts; print(json.dumps(machine_facts()))"


def child_env() -> dict[str, str]:
    """The environment of every child: this checkout's code first, unbuffered output for live logs."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def machine_facts() -> dict:
    """Runs in the child (it imports torch): the devices `pipeline doctor` finds usable and the one `auto` picks,
    whether Core ML predicts here, and each method's own options with its title (from its spec)."""
    from core.coreml_runtime import coreml_can_predict
    from core.device import device_report, select_device
    from train.methods import METHODS

    return {"auto_device": str(select_device("auto")).split(":")[0],
            "devices": [dev for dev, ok, _ in device_report() if ok], "coreml_predicts": coreml_can_predict()[0],
            "own_options": {name: {"title": spec.title, "options": list(spec.own_options)} for name, spec in METHODS.items()}}


def _finite(bounds) -> list | None:
    """A Range as JSON holds it: an open-ended side is None (JSON has no infinity)."""
    return [None if isinstance(x, float) and math.isinf(x) else x for x in bounds] if bounds else None


def describe(timeout: float = 300) -> dict:
    """PretrainConfig's fields (name, type, default, choices, range, why), the export groups, and the machine's
    facts, asked of a child; RuntimeError with the child's last line if it fails."""
    fields = []
    for name, f in _fields(PretrainConfig).items():
        tp = _base_type(f.type)
        bounds = f.metadata.get("range")
        fields.append({"name": name, "type": tp.__name__, "optional": tp is not f.type, "default": f.default,
                       "why": f.metadata.get("why", ""), "choices": list(f.metadata.get("choices") or []) or None,
                       "range": _finite(bounds)})
    done = subprocess.run([sys.executable, "-c", MACHINE], capture_output=True, text=True, env=child_env(),
                          cwd=PROJECT, timeout=timeout)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"could not read this machine's devices: {lines[-1]}")
    return {"fields": fields, "formats": list(to_choices()), **json.loads(done.stdout.strip().splitlines()[-1])}


def config_names() -> list[str]:
    """The configs a job may start from (its `recipe`): configs/<name>.yaml."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
