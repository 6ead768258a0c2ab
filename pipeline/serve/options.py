"""What a job may ask for, read from the pipeline itself in a child process (`python -m pipeline.serve.describe`).

The server validates a submission with core/config.py against a dataclass rebuilt from PretrainConfig's fields,
so an option is checked by the very code `pipeline pretrain` uses, while what the pipeline's CLI loads is loaded
only by this short-lived child and never by the server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

from core.config import opt

PROJECT = Path(__file__).resolve().parents[2]  # the folder holding pipeline/ and stages/: the children's import root
RECIPES = PROJECT / "configs"
SERVER_SET = ("data",)  # the server fills these: the data is the upload or an allowed SPEC, never a path typed in
TYPES = {"int": int, "float": float, "str": str, "bool": bool}


def child_env() -> dict[str, str]:
    """The environment of every child: this checkout's code first, unbuffered output for live logs."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", TQDM_DISABLE="1")
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def probe(timeout: float = 300) -> dict:
    """Ask a child for describe(); raise RuntimeError with its last line if it fails."""
    done = subprocess.run([sys.executable, "-m", "pipeline.serve.describe"], capture_output=True, text=True,
                          env=child_env(), cwd=PROJECT, timeout=timeout)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["no output"]
        raise RuntimeError(f"could not read the pretraining options: {lines[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def options_class(described: dict):
    """A dataclass with PretrainConfig's fields (types, choices, defaults), for core.config.load_config.
    It keeps `data` so a recipe file that names its data still loads; the form's `data` is the server's."""
    spec = []
    for f in described["fields"]:
        tp = TYPES[f["type"]]
        spec.append((f["name"], typing.Optional[tp] if f["optional"] else tp,
                     opt(f["default"], f["why"], tuple(f["choices"]) if f["choices"] else None)))
    return dataclasses.make_dataclass("JobOptions", spec)


def recipes() -> list[str]:
    """The recipe names a job may start from: configs/<name>.yaml."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))
