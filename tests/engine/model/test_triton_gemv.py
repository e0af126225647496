"""One-row products (dfim.engine.model.triton_gemv): where the kernel applies, and that it computes the
product (plain, and with the MLP's activation fused) to its inputs' rounding. The kernel runs on CUDA, or on
the CPU under Triton's interpreter where Triton is installed; without either (the CPU-only install) the
kernel test skips."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from dfim.engine.model import ops, triton_gemv

CHECK = textwrap.dedent(
    """
    import sys
    from dfim.engine.model.fast_check import GEMV_26B_SHAPES, gemv_mismatches

    device = sys.argv[1]
    bad = gemv_mismatches(device, ((37, 96), (5, 600), (300, 64), (1, 1030)))
    if device == "cuda":  # the 26B shape's products too (the interpreter would take minutes)
        bad += gemv_mismatches(device, GEMV_26B_SHAPES)
    print("\\n".join(bad) or "ok")
    """
)


def test_kernel_matches_the_product(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)


def test_cpu_and_many_rows_keep_the_reference_products():
    w = torch.randn(24, 16)
    gate_up = torch.randn(1, 1, 32)
    with torch.no_grad():
        for x in (torch.randn(1, 1, 16), torch.randn(2, 3, 16)):
            assert not triton_gemv.fits(x, w)
            assert torch.equal(triton_gemv.linear(x, w), F.linear(x, w))
        gate, up = gate_up.chunk(2, dim=-1)
        down = torch.randn(8, 16)
        assert torch.equal(triton_gemv.gelu_linear(gate_up, down), F.linear(ops.gelu(gate) * up, down))


def test_tile_reads_long_rows_and_a_short_row_whole():
    assert triton_gemv.tile(2816) == (2, 1024, 4)
    assert triton_gemv.tile(2112, gated=True) == (4, 512, 4)
    assert triton_gemv.tile(96) == (2, 128, 4)  # a short row: one block covers it
    assert triton_gemv.tile(8)[1] == 64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_row_on_cuda_takes_the_kernel():
    w = torch.randn(64, 32, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        assert triton_gemv.fits(torch.randn(1, 1, 32, device="cuda", dtype=torch.bfloat16), w)
        assert not triton_gemv.fits(torch.randn(1, 2, 32, device="cuda", dtype=torch.bfloat16), w)
        assert not triton_gemv.fits(torch.randn(1, 1, 32, device="cuda"), w)  # fp32 row, bf16 weight
