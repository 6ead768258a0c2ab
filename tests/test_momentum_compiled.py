"""benchmarks/momentum_compiled.py: the experiment that compiles BYOL's and MoCo v3's momentum branch beside the
online one. Its patch must compile the copy's own forward (not a second handle on the online network's, which
would make the momentum branch the online one), touch nothing for a method without a copy, and pass every other
command the grid runs through unchanged."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.benchmark_scripts import load
from tests.train.test_methods import _tiny_method
from train.methods import byol, mocov3

ROOT = Path(__file__).resolve().parents[1]
momentum_compiled = load("momentum_compiled")


@pytest.fixture
def patched(monkeypatch):
    for owner, name in ((torch, "compile"), (byol, "frozen_copy"), (mocov3, "frozen_copy")):
        monkeypatch.setattr(owner, name, getattr(owner, name))  # put back after the test
    monkeypatch.setattr(momentum_compiled, "COPIES", {})
    momentum_compiled.patch()


def _tiny(method):
    return _tiny_method(method)[0].eval()


@pytest.mark.parametrize("method, copy", [("mocov3", "momentum_backbone"), ("byol", "target_backbone")])
def test_compiling_the_online_forward_compiles_the_copys_own(patched, method, copy):
    model = _tiny(method)
    target = getattr(model, copy)
    with torch.no_grad():  # the branches apart, as after training steps: each must keep computing its own
        for p in model.backbone.parameters():
            p.add_(0.1)
    x = torch.randn(2, 3, 16, 16)
    model.backbone.forward = torch.compile(model.backbone.forward, backend="eager")
    assert "forward" in vars(target)  # compiled: an instance attribute over the class's forward
    with torch.no_grad():
        own = type(target).forward(target, x)
        torch.testing.assert_close(target.forward(x), own, rtol=0, atol=0)
        assert not torch.allclose(model.backbone(x), own)  # so the check above tells the copy from the online


def test_a_method_without_a_copy_compiles_only_what_it_is_given(patched):
    model = _tiny("simclr")
    model.backbone.forward = torch.compile(model.backbone.forward, backend="eager")
    compiled = [name for name, m in model.named_modules() if "forward" in vars(m)]
    assert compiled == ["backbone"] and not momentum_compiled.COPIES


def test_other_commands_pass_through():
    """`-m MODULE` and `SCRIPT` run as python runs them: their output and exit status are theirs."""
    wrapper = [sys.executable, momentum_compiled.__file__]
    help_ = subprocess.run([*wrapper, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert help_.returncode == 0 and "pretrain" in help_.stdout
    missing = subprocess.run([*wrapper, "benchmarks/recipe_summary.py", "--pairs", "a", "b", "/nonexistent.jsonl"],
                             cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 1 and "nonexistent" in missing.stderr and "Traceback" not in missing.stderr
