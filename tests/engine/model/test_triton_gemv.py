"""One-row products (dfim.engine.model.triton_gemv): where the kernel applies, and that it computes the
product (plain, and with the MLP's activation fused) to its inputs' rounding. The kernel runs on CUDA, or on
the CPU under Triton's interpreter where Triton is installed; without either (the CPU-only install) the
kernel test skips."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from dfim.engine.model import ops, triton_gemv, triton_norm

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from dfim.engine.model import triton_gemv
    from dfim.engine.model.fast_check import GEMV_26B_SHAPES, gemv_mismatches

    device = sys.argv[1]
    bad = gemv_mismatches(device, ((37, 96), (5, 600), (300, 64), (1, 1030)))
    if device == "cuda":  # the 26B shape's products too (the interpreter would take minutes)
        bad += gemv_mismatches(device, GEMV_26B_SHAPES)
    x, w = torch.randn(96, device=device), torch.randn(37, 96, device=device)
    got = triton_gemv.gemv(x, w)  # a 1-D row
    if got.shape != (37,) or not torch.allclose(got, w @ x, rtol=1e-4, atol=1e-4):
        bad.append(f"1-D row: {tuple(got.shape)}")
    print("\\n".join(bad) or "ok")
    """
)

# An AR token through the fast path under the interpreter: every one-row product of a layer takes the kernel.
CALL_SITES = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, "tests/engine/model")
    from test_fast_path import fast_of, make_model
    from dfim.engine.model import triton_gemv

    assert triton_gemv.works("cpu")  # the startup check's own calls, before counting
    calls = []
    real = triton_gemv.gemv
    triton_gemv.gemv = lambda x, w, **kw: calls.append(kw.get("gated", False)) or real(x, w, **kw)
    model = make_model()
    fast = fast_of(model)
    fast.encode(torch.tensor([[5, 6, 7]]))
    fast.ar_logits(9)
    layers = len(model.decoder.layers)
    # q/k/v, the output projection, gate/up, the router; and the gated down projection
    want = [False] * 4 * layers + [True] * layers
    print("ok" if sorted(calls) == want else f"{len(calls)} calls for {layers} layers: {calls}")
    """
)


def test_kernel_matches_the_product(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)


def test_an_ar_token_takes_the_kernel_at_every_product(kernel_check, kernel_target):
    if kernel_target[0] == "cuda":
        pytest.skip("the interpreter's run says which calls a token makes")
    kernel_check(CALL_SITES, *kernel_target)


@pytest.mark.skipif(triton_norm.interpreting(), reason="the interpreter runs the kernels on CPU tensors")
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


def test_gemv_refuses_what_it_cannot_compute():
    with pytest.raises(ValueError, match="one row"):
        triton_gemv.gemv(torch.randn(2, 16), torch.randn(8, 16))
    with pytest.raises(ValueError, match="one row"):
        triton_gemv.gemv(torch.randn(1, 16), torch.randn(8, 16), gated=True)
    with pytest.raises(ValueError, match="contiguous"):
        triton_gemv.gemv(torch.randn(1, 16), torch.randn(16, 8).T)


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
        assert not triton_gemv.fits(torch.empty(2, 3, 0, device="cuda"), torch.empty(5, 0, device="cuda"))
        half = torch.randn(1, 32, device="cuda", dtype=torch.float16)  # a dtype the check does not cover
        assert not triton_gemv.fits(half, w.half())
