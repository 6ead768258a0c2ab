"""What a job may ask for: PretrainConfig's own fields (a submission is checked by core/config.py against the very
class `pipeline pretrain` loads), the export groups of the format table, the configs/*.yaml a job may start from,
and the device `auto` picks. All of it is read in the server's process, torch-free, but the device: finding it needs
torch, which only a short-lived child imports (`describe`), so the server stays small and starts fast.
"""

from __future__ import annotations

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
AUTO_DEVICE = "from core.device import select_device; print(str(select_device('auto')).split(':')[0])"


def child_env() -> dict[str, str]:
    """The environment of every child: this checkout's code first, unbuffered output for live logs."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def describe(timeout: float = 300) -> dict:
    """PretrainConfig's fields (name, type, default, choices, why), the export groups, and the device `auto` picks,
    asked of a child; RuntimeError with the child's last line if it fails."""
    fields = []
    for name, f in _fields(PretrainConfig).items():
        tp = _base_type(f.type)
        fields.append({"name": name, "type": tp.__name__, "optional": tp is not f.type, "default": f.default,
                       "why": f.metadata.get("why", ""), "choices": list(f.metadata.get("choices") or []) or None})
    done = subprocess.run([sys.executable, "-c", AUTO_DEVICE], capture_output=True, text=True, env=child_env(),
                          cwd=PROJECT, timeout=timeout)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"could not find the device `auto` picks: {lines[-1]}")
    return {"fields": fields, "formats": list(to_choices()), "auto_device": done.stdout.strip().splitlines()[-1]}


def config_names() -> list[str]:
    """The configs a job may start from (its `recipe`): configs/<name>.yaml."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))
