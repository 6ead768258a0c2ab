"""A method, a backbone and a format each added as a contributor would add them, written into a folder of the test's
own, and the whole chain picks them up with no other edit: the CLI's choices, the config checks, pretrain, strip,
trace, export, validate, the report and the job service's downloads. A multi-crop method (views of two sizes) trains
the same way, on either augmentation path.

Each is registered through its registry's own mechanism, in a child process that then runs the CLI: the method is
a file in a folder on train.methods' path (the registry is that folder), the backbone a row of
train.backbones.BACKBONES, the format a row of export.formats.FORMATS. One child runs every command in turn (torch
is imported once)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

METHOD = '''"""Flat: one projector, the two views' embeddings pulled together (a throwaway method)."""

import torch
import torch.nn.functional as F
from torch import nn

from core.views import ViewRecipe
from train.heads import head_input, mlp
from train.method_spec import MethodSpec, Recipe


class Flat(nn.Module):
    def __init__(self, backbone, feat_dim, cfg):
        super().__init__()
        self.backbone = backbone
        self.projector = mlp(feat_dim, cfg.proj_hidden_dim, cfg.proj_dim)

    def forward(self, views, precision):
        with precision.backbone():
            h = self.backbone(torch.cat(views))
        with precision.heads():
            z = self.projector(head_input(h, precision))
        z1, z2 = F.normalize(z.float(), dim=1).chunk(2)
        return (2 - 2 * (z1 * z2).sum(1)).mean()

    def after_step(self, progress):
        pass


VALUES = dict(optimizer="sgd", lr=0.05, weight_decay=0.0, proj_dim=16, proj_hidden_dim=32)
SPEC = MethodSpec(name="flat", title="Flat-Test", build=Flat, paper=Recipe(dict(VALUES)), small=Recipe(dict(VALUES)),
                  views=(ViewRecipe(), ViewRecipe(solarize_p=0.1)),
                  summary=lambda c: [f"flat projector {c.get('proj_hidden_dim')} -> {c.get('proj_dim')}"],
                  fixed_on_resume=("proj_dim", "proj_hidden_dim"))
'''

BACKBONE = '''"""Tiny-Net: one conv block and a global pool (a throwaway backbone), as a row of the backbone table."""

from functools import partial

from train.backbones import BACKBONES, Backbone


def _tiny(small_stem: bool):
    from torch import nn

    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=1 if small_stem else 2, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())


BACKBONES["tiny"] = Backbone(_tiny, 8, "tinynet", "Tiny-Net", "the conv at stride 1", (2, 1),
                             ("conv", "batch_norm", "relu", "reduce_mean", "reshape"))
'''

FORMAT = '''"""ptx: the torch.export program itself, saved and reloaded (a throwaway format), as a row of the format table."""

from core.errors import PipelineError
from export.formats import FORMATS, Format


def write_ptx(program, path, meta, precision, options):
    import torch

    if not isinstance(program, torch.export.ExportedProgram):
        raise PipelineError("ptx needs a torch.export trace")
    torch.export.save(program, path)
    return {"precision": precision}


def check_ptx(path, images):
    import torch

    module = torch.export.load(path).module()
    with torch.no_grad():
        return "torch.export (CPU)", module(images.float()).numpy(), "fp32"


FORMATS["ptx"] = Format("ptx", "torch", "encoder.ptx", "torch.export program, reloaded", ("fp32",), {}, write_ptx,
                        check_ptx, ("torch",))
'''

RUNNER = '''import json
import sys
from pathlib import Path

here = Path(__file__).parent
sys.path.insert(0, str(here))
import train.methods  # noqa: E402

train.methods.__path__.append(str(here / "methods"))  # the method registry is its folders
steps, rows = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for row in rows:  # a backbone's or a format's module adds its row to its table when imported
    __import__(row)

from pipeline.cli import main  # noqa: E402

for i, args in enumerate(steps):
    try:
        rc = main.main(args, prog_name="pipeline", standalone_mode=False) or 0
    except SystemExit as e:
        rc = e.code or 0
    print(f"== step {i} rc={rc}", flush=True)
'''


def run_extended(tmp_path: Path, files: dict[str, str], steps: list[list[str]], after: str) -> str:
    """What one child printed: it registers the extension `files` (a method in methods/, each other file a module
    with a table row), runs the CLI `steps` in turn, then `after`, code that prints what the test reads."""
    ext = tmp_path / "ext"
    for name, text in files.items():
        (ext / name).parent.mkdir(parents=True, exist_ok=True)
        (ext / name).write_text(text)
    (ext / "run.py").write_text(RUNNER + after)
    rows = [Path(name).stem for name in files if "/" not in name]
    done = subprocess.run([sys.executable, str(ext / "run.py"), json.dumps(steps), json.dumps(rows)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout
    return done.stdout


KNOWN = '''
from export.formats import to_choices  # noqa: E402
from pipeline.serve.app import artifacts  # noqa: E402
from train.backbones import BACKBONES  # noqa: E402
from train.methods import METHODS  # noqa: E402

print("== known " + json.dumps({"methods": list(METHODS), "backbones": list(BACKBONES), "to": list(to_choices()),
                                "downloads": list(artifacts())}))
'''


@pytest.mark.slow
def test_a_new_method_backbone_and_format_need_no_other_edit(tmp_path):
    run = str(tmp_path / "run")
    tiny = ["--method", "flat", "--backbone", "tiny", "--data", "synthetic:48", "--batch-size", "8", "--epochs", "1",
            "--max-steps", "2", "--device", "cpu", "--num-workers", "0"]
    steps = [
        ["pretrain", "--help"],
        ["export", "--help"],
        ["pretrain", *tiny, "--image-size", "1", "--small-stem", "off", "--out", run],  # the row's smallest side: 2
        ["pretrain", *tiny, "--image-size", "16", "--out", run],
        ["export", "--to", "torch", "--opset", "18", "--run", run],  # an option of a format this export does not write
        ["export", "--to", "torch", "--run", run],  # strip and trace run first
        ["validate", "--run", run],
        ["report", "--run", run],
    ]
    out = run_extended(tmp_path, {"methods/flat.py": METHOD, "tiny_backbone.py": BACKBONE, "ptx_format.py": FORMAT},
                       steps, KNOWN)
    parts = out.split("== step ")
    rc = {int(p.split()[0]): int(p.split()[1].split("=")[1]) for p in parts[1:]}
    said = {int(p.split()[0]): parts[i] for i, p in enumerate(parts[1:])}  # what each step printed before its rc
    assert rc == {0: 0, 1: 0, 2: 2, 3: 0, 4: 2, 5: 0, 6: 0, 7: 0}, out

    assert "flat" in said[0] and "tiny" in said[0]  # --method and --backbone choices
    assert "[coreml|onnx|torch|all]" in said[1] and "encoder.ptx" in said[1]  # --to choices, the table in the help
    assert "image size 1 is impossible for tiny with the ImageNet stem: use 2..1024" in said[2]
    assert "--opset applies to onnx" in said[4]
    known = json.loads(out.split("== known ")[1].splitlines()[0])
    assert "flat" in known["methods"] and "tiny" in known["backbones"] and "torch" in known["to"]
    assert "encoder.ptx" in known["downloads"]  # the job service offers it

    run = Path(run)
    sidecar = json.loads((run / "export" / "encoder.json").read_text())
    assert [a["file"] for a in sidecar["artifacts"]] == ["encoder.ptx"]
    assert sidecar["description"].startswith("Flat-Test Tiny-Net image encoder")  # the spec's and the row's titles
    assert sidecar["backbone"] == "tiny" and sidecar["embedding_dim"] == 8
    parity = json.loads((run / "validate" / "parity.json").read_text())
    assert [(r["artifact"], r["runtime"], r["passed"]) for r in parity["rows"]] == [("encoder.ptx", "torch.export (CPU)", True)]
    page = (run / "report.html").read_text()
    assert "flat projector 32 -&gt; 16" in page or "flat projector 32 -> 16" in page  # the spec's run-card line
    assert "encoder.ptx" in page and "torch.export (CPU)" in page


CROPS = '''"""Crops: two global views at the run's size and two local ones at half of it, every view's embedding pulled
towards the mean of the image's global ones (a throwaway multi-crop method)."""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from core.views import ViewRecipe
from train.heads import head_input, mlp
from train.method_spec import MethodSpec, Recipe

SIDES = []  # the shape of each view forward received, per step


class Crops(nn.Module):
    def __init__(self, backbone, feat_dim, cfg):
        super().__init__()
        self.backbone = backbone
        self.projector = mlp(feat_dim, cfg.proj_hidden_dim, cfg.proj_dim)

    def forward(self, views, precision):
        SIDES.append([list(v.shape) for v in views])
        with precision.backbone():  # one call per side: the global views' is the one CUDA graphs capture
            h = torch.cat([self.backbone(torch.cat(views[:2])), self.backbone(torch.cat(views[2:]))])
        with precision.heads():
            z = self.projector(head_input(h, precision))
        z = F.normalize(z.float(), dim=1).unflatten(0, (len(views), -1))  # (view, image, dim)
        target = z[:2].mean(0).detach()
        return (2 - 2 * (z * target).sum(-1)).mean()

    def after_step(self, progress):
        pass


GLOBAL = ViewRecipe(crop_scale=(0.4, 1.0))
LOCAL = ViewRecipe(crop_scale=(0.05, 0.4), size=0.5)
VALUES = dict(optimizer="sgd", lr=0.05, weight_decay=0.0, proj_dim=16, proj_hidden_dim=32)
SPEC = MethodSpec(name="crops", title="Crops-Test", build=Crops, paper=Recipe(dict(VALUES)), small=Recipe(dict(VALUES)),
                  views=(GLOBAL, dataclasses.replace(GLOBAL, solarize_p=0.2), LOCAL, LOCAL),
                  summary=lambda c: ["two global and two local crops"], fixed_on_resume=("proj_dim", "proj_hidden_dim"))
'''

CROPS_VIEWS = '''
from train import recipes  # noqa: E402
from train.methods import crops  # noqa: E402  the module pretraining ran

print("== sides " + json.dumps(crops.SIDES))
print("== crops " + json.dumps([v.crop_scale for v in recipes.views_for("small", "crops", 16, 0.3)]))
'''


@pytest.mark.slow
def test_a_multi_crop_method_needs_no_other_edit(tmp_path):
    """Global and local views of two sizes reach the method's forward in its order, on the CPU path and on the
    device path (which runs on the CPU when asked), and a stopped device-path run resumes to the losses of an
    uninterrupted one: the views of a step are a pure function of (seed, epoch, batch) at every size."""
    tiny = ["--method", "crops", "--data", "synthetic:48", "--batch-size", "8", "--epochs", "1", "--image-size", "16",
            "--device", "cpu", "--num-workers", "0", "--log-every", "1"]
    runs = {name: str(tmp_path / name) for name in ("cpu", "device", "resumed")}
    steps = [
        ["pretrain", *tiny, "--augment", "cpu", "--max-steps", "2", "--out", runs["cpu"]],
        ["pretrain", *tiny, "--augment", "device", "--max-steps", "3", "--out", runs["device"]],
        ["pretrain", *tiny, "--augment", "device", "--max-steps", "2", "--out", runs["resumed"]],
        ["pretrain", "--resume", "--max-steps", "3", "--out", runs["resumed"]],
        # the local views must fit the backbone too: a ViT takes one side, a convnet down to its total stride
        ["pretrain", *tiny, "--backbone", "vit_t_16", "--out", str(tmp_path / "vit")],
        ["pretrain", *tiny, "--image-size", "32", "--small-stem", "off", "--out", str(tmp_path / "imagenet-stem")],
    ]
    out = run_extended(tmp_path, {"methods/crops.py": CROPS}, steps, CROPS_VIEWS)
    assert [line for line in out.splitlines() if line.startswith("== step")] == [
        *(f"== step {i} rc=0" for i in range(4)), "== step 4 rc=2", "== step 5 rc=2"], out
    assert "error: crops makes 8 px views beside its 16 px ones, and vit_t_16 is built for one image side" in out
    assert "error: crops's 16 px views: image size 16 is impossible for resnet18 with the ImageNet stem" in out
    assert not (tmp_path / "vit").exists() and not (tmp_path / "imagenet-stem").exists()
    sides = json.loads(out.split("== sides ")[1].splitlines()[0])
    assert sides == [[[8, 3, 16, 16]] * 2 + [[8, 3, 8, 8]] * 2] * 8  # 2 + 3 + 2 + 1 steps
    # --crop-min-scale (here the recipe's 0.4, or a flag's 0.3) crops the global views; the local ones stay local
    assert json.loads(out.split("== crops ")[1].splitlines()[0]) == [[0.3, 1.0]] * 2 + [[0.05, 0.4]] * 2

    def losses(run):
        return [json.loads(line)["loss"] for line in (Path(run) / "metrics.jsonl").read_text().splitlines()
                if "loss" in line]

    assert len(losses(runs["cpu"])) == 2 and all(math.isfinite(v) for v in losses(runs["cpu"]))
    assert losses(runs["resumed"]) == losses(runs["device"]) and len(losses(runs["device"])) == 3
