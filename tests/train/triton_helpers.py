"""What the tests of the Triton kernels (train/colour_kernel.py, train/standardise_kernel.py) share: their outputs
from Triton's interpreter on the CPU, and their compile for a Hopper GPU on the CPU."""

import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def interpreted_outputs(script: str, out: Path) -> dict:
    """Run `script` (a test file whose __main__ saves its kernels' outputs to argv[1]) in a process where Triton's
    interpreter runs them: it must be on before triton is first imported (its own library functions are kernels
    too), which a test process can't promise."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, script, str(out)], env=env, check=True, timeout=300)
    return torch.load(out)


def hopper_cubin(kernel, constexprs: dict, pointers: dict) -> bytes:
    """Triton's compiler, down to the cubin, for an H100/H200 (sm_90), here on the CPU: it refuses what the
    interpreter lets through (a module-level value read inside a kernel, say), which would leave the views on the
    compiled fallback on every GPU, found only there. pointers: the type of each pointer argument not *fp32;
    every other argument not in constexprs is an i32 (sizes and strides)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    def kind(name: str) -> str:
        if name in constexprs:
            return "constexpr"
        return pointers.get(name, "*fp32") if name.endswith("_ptr") else "i32"

    signature = {name: kind(name) for name in kernel.arg_names}
    return triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32)).asm["cubin"]
