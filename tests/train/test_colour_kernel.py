"""The Triton colour kernels (train/colour_kernel.py), run in Triton's interpreter on the CPU, against the eager
`device_augment.colour` on the same rows: every jitter order, contrast at each slot, images of one block and of
several (the mean summed over blocks), fp32 and the fp16 the views train with."""

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from train import augment, device_augment

triton = pytest.importorskip("triton")  # PyTorch's Linux wheels bring it; where it is missing the views use colour() compiled
ROOT = Path(__file__).resolve().parents[2]
CASES = {"one block": (48, 20, 20), "two blocks": (48, 40, 40)}  # images, side, seed: 400 and 1,600 pixels


def _case(n: int, side: int, seed: int, pull: float = 1.0):
    recipe = augment.ViewRecipe(crop_scale=(1, 1), crop_ratio=(1, 1), flip_p=0, jitter_p=1.0, gray_p=0.3,
                                brightness=0.6, contrast=0.9, saturation=0.9, hue=0.4)
    p = augment.sample_params(n, recipe, side, np.random.default_rng(seed))
    p["jitter_order"] = torch.tensor(list(itertools.permutations(range(4))) * (n // 24))
    p["jitter"][-3:] = False  # and images that draw no jitter at all
    table, at = device_augment._plan(p, side)
    t = torch.from_numpy(table)
    a, sat, con, *rest = [t[:, at[name]] for name in ("a", "sat", "con", "hue_on", "hue", "gray")]
    # the resize's overshoot beyond [0, 1] included, laid out as the resize writes the images
    x = device_augment.rows_layout(torch.rand(n, 3, side, side, generator=torch.Generator().manual_seed(seed)) * 1.1 - 0.05)
    return x, [a, sat, con * pull, *rest]


def _inputs():
    for name, (n, side, seed) in CASES.items():
        for dtype in (torch.float32, torch.float16):
            x, args = _case(n, side, seed)
            yield (name, str(dtype)), x.to(dtype), args
    x, args = _case(24, 20, 3, pull=2.0)
    yield ("contrast pulled twice as far", "torch.float32"), x, args


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory):
    """The kernels' outputs for every case, from a process where Triton's interpreter runs them: it must be on
    before triton is first imported (its own library functions are kernels too), which this process can't promise."""
    out = tmp_path_factory.mktemp("colour") / "outputs.pt"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, __file__, str(out)], env=env, check=True, timeout=300)
    return torch.load(out)


@pytest.mark.parametrize("case", list(CASES))
def test_kernels_compute_colour(kernel_outputs, case):
    for key, x, args in _inputs():
        if key[0] != case:
            continue
        got, want = kernel_outputs[key], device_augment.colour(x.float(), *args)
        assert got.dtype == x.dtype and got.permute(0, 2, 1, 3).is_contiguous()  # the layout the blur reads
        # fp32 registers against colour() op by op in fp32; fp16 stored once at the end
        torch.testing.assert_close(got.float(), want, atol=2e-6 if x.dtype == torch.float32 else 5e-4, rtol=0)
        assert (want - x.float().clamp(0, 1)).abs().amax() > 0.2  # the jitter did change the images


def test_a_wrong_contrast_mean_shows(kernel_outputs):
    """The mean each image's contrast blends towards is what the kernels split across two passes: with the pull
    towards it doubled, the kernels and colour() move together, away from the ordinary output."""
    (key, x, args), = [c for c in _inputs() if c[0][0].startswith("contrast")]
    got = kernel_outputs[key]
    torch.testing.assert_close(got, device_augment.colour(x, *args), atol=2e-6, rtol=0)
    a, sat, con, *rest = args
    assert (got - device_augment.colour(x, a, sat, con / 2, *rest)).abs().amax() > 0.05


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_kernels_compile_for_a_hopper_gpu(dtype):
    """Triton's compiler, down to the cubin, for an H100/H200 (sm_90), here on the CPU: it refuses what the
    interpreter above lets through (a module-level value read inside a kernel, say), which would leave the views on
    the compiled fallback on every GPU, found only there."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from train import colour_kernel

    def kind(name: str, constexprs: dict) -> str:
        if name in constexprs:
            return "constexpr"
        if name in ("x_ptr", "out_ptr"):  # the views' images in, the same type out
            return f"*{dtype}"
        return "*fp32" if name.endswith("_ptr") else "i32"  # the parameter rows and sums; sizes and strides

    for kernel, constexprs in ((colour_kernel._contrast_sums, {"BLOCK": colour_kernel.BLOCK}),
                               (colour_kernel._jittered, {"BLOCK": colour_kernel.BLOCK, "BLOCKS": 64})):
        signature = {name: kind(name, constexprs) for name in kernel.arg_names}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                                  options=colour_kernel.OPTIONS)  # as colour() launches them
        assert compiled.asm["cubin"], kernel.__name__
        # the blends as fused multiply-adds, whatever a newer Triton's default (off, from 3.10) would have made
        assert "fma.rn.f32" in compiled.asm["ptx"], kernel.__name__


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernels need a CUDA GPU")
def test_compiled_kernels_compute_colour_on_cuda():
    """The same comparison with the kernels Triton compiles for the GPU, and through the views' dispatch."""
    from train import colour_kernel

    for key, x, args in _inputs():
        want = device_augment.colour(x.float(), *args)
        dev = [t.cuda() for t in args]
        for got in (colour_kernel.colour(x.cuda(), *dev), device_augment._colour(x.cuda(), *dev)):
            torch.testing.assert_close(got.float().cpu(), want, atol=2e-6 if x.dtype == torch.float32 else 5e-4,
                                       rtol=0, msg=lambda m: f"{key}: {m}")


if __name__ == "__main__":  # the interpreted side of kernel_outputs
    from train import colour_kernel
    torch.save({key: colour_kernel.colour(x, *args) for key, x, args in _inputs()}, sys.argv[1])
