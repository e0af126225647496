"""RMSNorm as one Triton kernel, for inference on CUDA.

Why: Gemma's RMSNorm in plain PyTorch is about eight kernels (cast up, square, mean, add, rsqrt, two
multiplies, cast down), and a denoising step of the 26B-A4B shape runs ~300 norms, most of them on a few
hundred rows. In eager mode with CUDA graphs (the server's default on a GPU) those ~2,400 small kernels cost
6.8 of a 45 ms step (docs/gpu.md, "Where a step's time goes"); one kernel a norm removes most of that.
`torch.compile` fuses them as well, but it costs the first fill of every new shape tens of seconds.

The arithmetic is the reference's (`dfim.engine.model.ops.rms_norm`): the row in fp32, mean of squares,
`rsqrt(mean + eps)`, times the weight in fp32, one rounding to the input's dtype at the end.

Triton is imported on first use only: the CPU path never needs it, and a machine without it keeps the
reference arithmetic (`available()` is False).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor


@functools.cache
def _compiled() -> tuple[Any, Any] | None:
    """(triton, the row kernel), or None where Triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def rms_norm_rows(x_ptr, w_ptr, out_ptr, n_cols, x_stride, out_stride, eps,
                      HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        inside = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0).to(tl.float32)
        y = x * tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=inside)

    return triton, rms_norm_rows


def available() -> bool:
    """Whether the kernel can run here (Triton imports)."""
    return _compiled() is not None


def applies(x: Tensor) -> bool:
    """Whether `ops.rms_norm` should use the kernel for `x`: inference on CUDA, outside `torch.compile`
    (which fuses the reference itself and would only trip over an opaque call), with Triton present."""
    return (
        x.is_cuda
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and x.shape[-1] <= 65536
        and available()
    )


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over the last axis of `x` (any float dtype), scaled by `weight` [H] when given, in one
    kernel launch: one program per row."""
    compiled = _compiled()
    if compiled is None:
        raise RuntimeError("Triton is not available here")
    triton, kernel = compiled
    cols = x.shape[-1]
    flat = x.reshape(-1, cols)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    rows = flat.shape[0]
    if rows == 0:
        return out.view(x.shape)
    block = triton.next_power_of_2(cols)
    has_weight = weight is not None
    kernel[(rows,)](
        flat,
        weight.contiguous() if has_weight else flat,  # an unused pointer when there is no weight
        out,
        cols,
        flat.stride(0),
        out.stride(0),
        eps,
        HAS_WEIGHT=has_weight,
        BLOCK=block,
        num_warps=8 if block >= 4096 else 4 if block >= 1024 else 2,
    )
    return out.view(x.shape)
