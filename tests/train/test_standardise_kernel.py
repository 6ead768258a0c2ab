"""The Triton kernel of the views' last pass (train/standardise_kernel.py), run in Triton's interpreter on the CPU,
against the eager `device_augment.standardise` on the same views: the resize's layout and a plain one, rows of a
power of two and not, programs of one row and of many (the last one partly past the end), both memory formats,
fp32 and the fp16 the views train with, images solarized and not, in order and gathered from another order."""

import sys

import pytest
import torch

from tests.train.triton_helpers import hopper_cubin, interpreted_outputs
from train import device_augment

triton = pytest.importorskip("triton")  # PyTorch's Linux wheels bring it; where it is missing finish runs compiled
# images, side, rows layout: a program takes 51 rows of 20 px (not a multiple of 20) or 31 of 33 px (a row not a
# power of two wide); the last program of each case is short
CASES = {"20 px, rows layout": (7, 20, True), "33 px, rows layout": (3, 33, True), "20 px, plain": (5, 20, False)}


def _case(n: int, side: int, rows_layout: bool, dtype: torch.dtype):
    """Views in [0, 1] with the products' overshoot (what the blur leaves), and a solarize column cut from a wider
    table as `from_table` hands it over (a row stride of 5): images 0 and 2 solarized, the others not."""
    g = torch.Generator().manual_seed(side + n)
    x = (torch.rand(n, 3, side, side, generator=g) * 1.1 - 0.05).to(dtype)
    table = torch.zeros(n, 5)
    table[[0, 2], 3] = 1.0
    return (device_augment.rows_layout(x) if rows_layout else x), table[:, 3:4]


def _inputs():
    scale, shift = device_augment._standardisation(torch.device("cpu"))
    for name, (n, side, rows_layout) in CASES.items():
        for dtype in (torch.float32, torch.float16):
            x, sol = _case(n, side, rows_layout, dtype)
            for channels_last in (True, False):
                yield (name, str(dtype), channels_last, "in order"), x, sol, scale, shift, channels_last, None
        # views made in another order (blurred_first's), put back: output image i is image rows[i]
        rows = torch.randperm(n, generator=torch.Generator().manual_seed(n))
        yield (name, "torch.float16", True, "gathered"), x, sol, scale, shift, True, rows


def _reference(x, sol, scale, shift, channels_last, rows):
    return device_augment.standardise(x, sol, scale, shift, channels_last, rows)


@pytest.fixture(scope="module")
def kernel_outputs(tmp_path_factory):
    """The kernel's outputs for every case, from Triton's interpreter."""
    return interpreted_outputs(__file__, tmp_path_factory.mktemp("standardise") / "outputs.pt")


@pytest.mark.parametrize("case", list(CASES))
def test_kernel_computes_standardise(kernel_outputs, case):
    for key, *args in _inputs():
        if key[0] != case:
            continue
        got, want = kernel_outputs[key], _reference(*args)
        fmt = torch.channels_last if args[-2] else torch.contiguous_format
        assert got.dtype == torch.float32 and got.shape == want.shape and got.is_contiguous(memory_format=fmt), key
        # fp32 registers against standardise's fp32 ops; a fused multiply-add may round the last bit otherwise
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=lambda m: f"{key}: {m}")


def test_the_solarize_column_is_read_per_image(kernel_outputs):
    """Images 0 and 2 solarized, the others not: a kernel reading the column with the wrong stride, or ignoring
    it, would fail the comparison above; this says the cases can tell."""
    key, x, sol, scale, shift, channels_last, _ = next(_inputs())
    want = _reference(x, sol, scale, shift, channels_last, None)
    plain = _reference(x, torch.zeros_like(sol), scale, shift, channels_last, None)
    differs = (want - plain).abs().amax(dim=(1, 2, 3))
    assert (differs[[0, 2]] > 1).all() and (differs[[1, 3, 4, 5, 6]] == 0).all()
    torch.testing.assert_close(kernel_outputs[key], want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_kernel_compiles_for_a_hopper_gpu(dtype, gather):
    from train import standardise_kernel

    constexprs = {"ROWS": 4, "BW": 256, "GATHER": gather}
    assert hopper_cubin(standardise_kernel._standardised, constexprs, {"x_ptr": f"*{dtype}", "rows_ptr": "*i64"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA GPU")
def test_compiled_kernel_computes_standardise_on_cuda():
    """The same comparison with the kernel Triton compiles for the GPU, alone and through finish's dispatch, and
    at the size the views train at (512 views of 224 px, 4 rows a program)."""
    from train import standardise_kernel

    cases = list(_inputs())
    x = device_augment.rows_layout(torch.rand(512, 3, 224, 224, generator=torch.Generator().manual_seed(0)).half())
    sol = (torch.rand(512, 1, generator=torch.Generator().manual_seed(1)) < 0.2).float()
    scale, shift = device_augment._standardisation(torch.device("cpu"))
    cases += [(("224 px", "torch.float16", True, order), x, sol, scale, shift, True, rows)
              for order, rows in (("in order", None), ("gathered", torch.randperm(512)))]
    for key, x, sol, scale, shift, channels_last, rows in cases:
        want = _reference(x, sol, scale, shift, channels_last, rows)
        dev = (x.cuda(), sol.cuda(), scale.cuda(), shift.cuda())
        rows = None if rows is None else rows.cuda()
        for got in (standardise_kernel.standardise(*dev, channels_last, rows),
                    device_augment._standardise(*dev, channels_last, rows)):
            fmt = torch.channels_last if channels_last else torch.contiguous_format
            assert got.is_contiguous(memory_format=fmt), key
            torch.testing.assert_close(got.cpu(), want, atol=1e-6, rtol=0, msg=lambda m: f"{key}: {m}")


if __name__ == "__main__":  # the interpreted side of kernel_outputs
    from train import standardise_kernel
    torch.save({key: standardise_kernel.standardise(*args) for key, *args in _inputs()}, sys.argv[1])
