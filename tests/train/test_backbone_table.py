"""The backbone table: torch-free, and each row's export ops are ops the ML Program reference evaluator runs, so a
backbone whose export would need an op it lacks fails here, not in a user's `pipeline validate`."""

import subprocess
import sys

import pytest

from core.errors import PipelineError
from export.encoder import ENCODER_OPS
from export.mil_eval import MIL_OPS
from train import backbones


@pytest.mark.parametrize("name", list(backbones.BACKBONES))
def test_every_export_op_is_one_the_evaluator_runs(name):
    assert set(backbones.BACKBONES[name].export_ops) <= set(MIL_OPS), name
    assert set(ENCODER_OPS) <= set(MIL_OPS)


def test_the_table_loads_no_torch():
    code = "import sys, train.backbones; print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_builder_arguments_are_the_rows_and_checked():
    net, dim = backbones.build_from_args("resnet18", backbones.backbone_args("resnet18", True, 16))
    assert dim == 512 and net.maxpool.__class__.__name__ == "Identity"
    with pytest.raises(PipelineError, match="do not fit resnet18"):
        backbones.build_from_args("resnet18", {"patch_size": 4})
    with pytest.raises(PipelineError, match="unknown backbone 'nope'"):
        backbones.row("nope")
