"""What `make all` trains and how it ends: the default config is the photo set on the mobile backbone, and the last
lines name the model file the export really writes and the iPad app package that exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml

from export.formats import FORMATS
from train.backbones import BACKBONES
from train.data_spec import parse_spec

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_trains_photos_on_a_mobile_backbone():
    cfg = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    assert parse_spec(cfg["data"]) == ("photos", "")
    assert BACKBONES[cfg["backbone"]].family == "mobilenet"
    assert cfg["image_size"] >= 64, "photos should still look like photos"


def test_make_all_ends_with_the_model_and_the_ipad_step():
    out = subprocess.run(["make", "-n", "-s", "all", "RUN=runs/x", "BIN=bin"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    last = out.strip().splitlines()[-3:]
    assert last[0].startswith("bin/pipeline show --run runs/x")
    model = re.search(r"(runs/x/export/\S+)", last[1]).group(1)
    assert Path(model).name == FORMATS["mlmodel"].file
    app = re.search(r"open (\S+)", last[2]).group(1)
    assert (ROOT / app / "Package.swift").is_file() and f"import {model}" in last[2]
