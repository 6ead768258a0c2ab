"""Device selection with availability mocked: MPS code paths cannot run here, so their branches are checked
through the availability functions alone."""

from unittest import mock

import pytest
import torch

from core import device
from core.errors import PipelineError


def _mps(built, available):
    return mock.patch.multiple(torch.backends.mps, is_built=mock.Mock(return_value=built), is_available=mock.Mock(return_value=available))


def _cuda(available):
    return mock.patch.object(torch.cuda, "is_available", return_value=available)


def test_auto_prefers_mps_then_cuda_then_cpu():
    with _mps(True, True), _cuda(True):
        assert device.select_device("auto").type == "mps"
    with _mps(True, False), _cuda(True), mock.patch.object(torch.backends.cuda, "is_built", return_value=True):
        assert device.select_device("auto").type == "cuda"
    with _mps(False, False), _cuda(False):
        assert device.select_device("auto").type == "cpu"


def test_mps_error_names_which_check_failed():
    with _mps(False, False), pytest.raises(PipelineError, match="no MPS support"):
        device.select_device("mps")
    with _mps(True, False), pytest.raises(PipelineError, match="offers none"):
        device.select_device("mps")


def test_mps_sets_fallback_env(monkeypatch):
    monkeypatch.delenv("PYTORCH_ENABLE_MPS_FALLBACK", raising=False)
    with _mps(True, True):
        device.select_device("mps")
    import os

    assert os.environ["PYTORCH_ENABLE_MPS_FALLBACK"] == "1"


def test_cuda_unavailable_is_one_line_error():
    with _cuda(False), pytest.raises(PipelineError, match="--device cuda is not usable"):
        device.select_device("cuda")


def test_precision_policy():
    cpu = device.precision_for(torch.device("cpu"))
    assert cpu.backbone_dtype is None and not cpu.needs_grad_scaler
    cuda = device.precision_for(torch.device("cuda"))
    assert cuda.backbone_dtype == torch.bfloat16 and not cuda.needs_grad_scaler
    mps = device.precision_for(torch.device("mps"))
    assert mps.backbone_dtype == torch.float16 and mps.head_dtype is None and mps.needs_grad_scaler
    assert device.precision_for(torch.device("cuda"), "fp32").backbone_dtype is None


def test_mps_heads_run_in_fp32_inside_backbone_autocast():
    """The MPS policy's shape, exercised on the CPU's autocast: heads() must switch autocast off."""
    p = device.Precision("cpu", torch.bfloat16, None)
    lin = torch.nn.Linear(4, 4)
    with p.backbone():
        assert lin(torch.randn(2, 4)).dtype == torch.bfloat16
        with p.heads():
            assert lin(torch.randn(2, 4)).dtype == torch.float32
