"""Which accelerator to train on, and in which precision.

`auto` prefers mps > cuda > cpu. MPS needs both a torch built with it and a macOS/GPU that offers it; the error
says which of the two failed, because the fixes differ (reinstall torch vs. update macOS / use Apple Silicon).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from core.errors import PipelineError


def enable_mps_fallback() -> None:
    """Must run before torch initialises MPS: ops MPS lacks then run on the CPU instead of raising."""
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")


def mps_status() -> tuple[bool, str]:
    """(usable, reason if not). Kept tiny and separate so it can be tested with the checks mocked."""
    backend = getattr(torch.backends, "mps", None)
    if backend is None or not backend.is_built():
        return False, "this torch build has no MPS support (install the macOS arm64 wheel)"
    if not backend.is_available():
        return False, "torch has MPS but this machine offers none (needs macOS 12.3+ on Apple Silicon)"
    return True, ""


def cuda_status() -> tuple[bool, str]:
    if not torch.backends.cuda.is_built():
        return False, "this torch build has no CUDA support"
    if not torch.cuda.is_available():
        return False, "no NVIDIA GPU/driver visible to torch"
    return True, ""


def select_device(name: str = "auto") -> torch.device:
    """Resolve --device; asking for an accelerator that is not there is a one-line error naming why."""
    if name == "mps" or name == "auto":
        enable_mps_fallback()
    if name == "auto":
        if mps_status()[0]:
            return torch.device("mps")
        if cuda_status()[0]:
            return torch.device("cuda")
        return torch.device("cpu")
    if name == "mps":
        ok, why = mps_status()
        if not ok:
            raise PipelineError(f"--device mps is not usable: {why}")
        return torch.device("mps")
    if name.startswith("cuda"):
        ok, why = cuda_status()
        if not ok:
            raise PipelineError(f"--device {name} is not usable: {why}")
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise PipelineError(f"unknown device {name!r}: use auto, cpu, cuda or mps")


def device_report() -> list[tuple[str, bool, str]]:
    """For `pipeline doctor`: each device, whether usable, and why not."""
    mps_ok, mps_why = mps_status()
    cuda_ok, cuda_why = cuda_status()
    cuda_name = torch.cuda.get_device_name(0) if cuda_ok else ""
    return [("mps", mps_ok, mps_why), ("cuda", cuda_ok, cuda_why or cuda_name), ("cpu", True, "")]


@dataclass(frozen=True)
class Precision:
    """Autocast policy. CUDA: bf16 everywhere autocast reaches (no overflow risk, no scaler). MPS: fp16 for the
    backbone only, heads and loss in fp32 (fp16 logits/normalisations overflow), with a grad scaler. CPU: fp32,
    or fp64 (param_dtype: weights, views and every activation in float64) where a number must come out the same on
    every CPU."""

    device_type: str
    backbone_dtype: torch.dtype | None
    head_dtype: torch.dtype | None
    param_dtype: torch.dtype = torch.float32

    def backbone(self):
        if self.backbone_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.backbone_dtype)

    def heads(self):
        if self.head_dtype is None:
            # Explicitly off, so heads nested inside a backbone region still run in fp32.
            return torch.autocast(self.device_type, enabled=False) if self.backbone_dtype else nullcontext()
        return torch.autocast(self.device_type, dtype=self.head_dtype)

    @property
    def needs_grad_scaler(self) -> bool:
        return torch.float16 in (self.backbone_dtype, self.head_dtype)


def precision_for(device: torch.device, mode: str = "auto") -> Precision:
    """mode: auto (the policy above), fp32 (no autocast anywhere, e.g. to debug a NaN) or fp64 (CPU only)."""
    kind = device.type
    if mode == "fp64":
        # MPS has no float64; a GPU's float64 runs at a fraction of its float32 speed and sums in its own order.
        if kind != "cpu":
            raise PipelineError(f"--precision fp64 runs on the CPU only (this run's device is {device}): "
                                "add --device cpu, or use --precision auto or fp32")
        return Precision(kind, None, None, torch.float64)
    if mode == "fp32" or kind == "cpu":
        return Precision(kind, None, None)
    if kind == "cuda":
        return Precision(kind, torch.bfloat16, torch.bfloat16)
    if kind == "mps":
        return Precision(kind, torch.float16, None)
    raise PipelineError(f"no precision policy for device {device}")
