"""RMSNorm's Triton kernels (dfim.engine.model.triton_norm): where they apply, and that they compute the
reference's arithmetic (the plain norm, the residual and feed-forward norms, the q/k/v heads' norm and RoPE). The kernel runs on CUDA, or on the CPU under Triton's interpreter where Triton is
installed; without either (the CPU-only install) those two tests skip."""

from __future__ import annotations

import textwrap

import torch

from dfim.engine.model import ops, triton_norm

CHECK = textwrap.dedent(
    """
    import sys
    from dfim.engine.model.fast_check import fused_norm_mismatches, norm_mismatches

    device = sys.argv[1]
    bad = norm_mismatches(device, (64, 300, 2816)) + fused_norm_mismatches(device, 96, 64)
    if device == "cuda":  # the 26B shape's widths too (the interpreter would take minutes)
        bad += fused_norm_mismatches(device, 2816, 256) + fused_norm_mismatches(device, 2816, 512)
    print("\\n".join(bad) or "ok")
    """
)


def test_cpu_inference_and_training_keep_the_reference_arithmetic():
    x = torch.randn(4, 96, dtype=torch.bfloat16)
    weight = torch.rand(96, dtype=torch.bfloat16) + 0.5
    assert not triton_norm.applies(x)
    with torch.no_grad():
        assert torch.equal(ops.rms_norm(x, weight, 1e-6), ops.rms_norm_reference(x, weight, 1e-6))
    x32 = torch.randn(4, 96, requires_grad=True)
    out = ops.rms_norm(x32, weight.float(), 1e-6)
    out.sum().backward()  # training differentiates the reference
    assert x32.grad is not None and torch.allclose(out, ops.rms_norm_reference(x32, weight.float(), 1e-6))


def test_kernel_matches_the_reference(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)
