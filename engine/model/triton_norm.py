"""RMSNorm as one Triton kernel, for inference on CUDA, and the norms around a layer's residual fused.

Why: Gemma's RMSNorm in plain PyTorch is about eight kernels (cast up, square, mean, add, rsqrt, two
multiplies, cast down), and a denoising step of the 26B-A4B shape runs ~300 norms, most of them on a few
hundred rows. In eager mode with CUDA graphs (the server's default on a GPU) those ~2,400 small kernels cost
6.8 of a 45 ms step (docs/gpu.md, "Where a step's time goes"); one kernel a norm removes most of that.
`torch.compile` fuses them as well, but it costs the first fill of every new shape tens of seconds.

A layer's other norms go with what surrounds them: `residual_norm` adds a normed branch to the residual
(two kernels become one), `feed_forward_residual` the dense and experts' branches (about ten become one),
`head_norm_rope` norms and rotates every q/k/v head of a fused projection (about sixteen become one),
`feed_forward_inputs` writes the three norms the feed-forward reads (five become one),
`gelu_mul` is a gated MLP's activation over one fused gate/up product, and the LM head's soft cap
(`softcap`) and self-conditioning's softmax (`softmax_into`) are one pass each over the logits.

The arithmetic is the reference's (`dfim.engine.model.ops.rms_norm`): the row in fp32, mean of squares,
`rsqrt(mean + eps)`, times the weight in fp32, one rounding to the input's dtype at the end.

Triton is imported on first use only: the CPU path never needs it, and a machine without it keeps the
reference arithmetic (`available()` is False).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator

import torch
from torch import Tensor

from dfim.engine.model import triton_kernels

KERNELS = "dfim.engine.model.triton_norm_kernels"


@functools.cache  # read once: the CPU path asks for every norm, and the tests set it before Python starts
def interpreting() -> bool:
    """Whether the tests asked for the fused kernels on CPU tensors, run by Triton's interpreter
    (DFIM_TRITON_ON_CPU=1 and TRITON_INTERPRET=1, both): the CPU then checks the code a GPU runs. Triton's
    own variable alone changes nothing, so a server that inherits it stays on the reference ops."""
    return (
        os.environ.get("DFIM_TRITON_ON_CPU") == "1"
        and os.environ.get("TRITON_INTERPRET") == "1"
        and available()
    )


def runs_on(device_type: str) -> bool:
    """Whether the Triton kernels are meant for tensors of this device type: CUDA, or the CPU when the tests
    ask for the interpreter (`interpreting`)."""
    return device_type == "cuda" or interpreting()


def available() -> bool:
    """Whether the kernel can run here (Triton imports)."""
    return triton_kernels.load(KERNELS) is not None


def applies(x: Tensor, chunked: bool = False) -> bool:
    """Whether the layers' fused kernels (this module's, and the router's of `triton_moe`) should run on `x`:
    inference on CUDA, outside `torch.compile` (which fuses the reference itself and would only trip over an
    opaque call), with Triton present, the kernels checked (`works`) and not `disabled`. A row-wise kernel
    holds a row of up to 65,536 values; `chunked` ones (`softcap`, `softmax_into`) take rows of any width."""
    return (
        runs_on(x.device.type)
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()
        and (chunked or x.shape[-1] <= 65536)
        and not _disabled
        and available()
        and works(x.device.type)
    )


_disabled = False


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The reference PyTorch ops for the duration, on every device (the fp32 check's reference pass, so it
    does not compare the fused kernels with themselves)."""
    global _disabled
    before, _disabled = _disabled, True
    try:
        yield
    finally:
        _disabled = before


@functools.cache
def works(device_type: str) -> bool:
    """Whether every fused kernel of the layers builds and agrees with its reference on this kind of device
    (`fast_check.fused_kernels_mismatches`, small shapes, run once): where one fails, none is used (the
    reference ops run) and the log says why, so a Triton that cannot build a kernel costs speed, not a crash."""
    from dfim.engine.model.fast_check import fused_kernels_mismatches

    return triton_kernels.passes_check(
        lambda: fused_kernels_mismatches(device_type), "Triton's fused kernels are", device_type
    )


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMSNorm over the last axis of `x` (any float dtype), scaled by `weight` [H] when given, in one
    kernel launch: one program per row."""
    triton, kernels = triton_kernels.require(KERNELS)
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
    kernels.rms_norm_rows[(rows,)](
        flat,
        weight.contiguous() if has_weight else flat,  # an unused pointer when there is no weight
        out,
        cols,
        flat.stride(0),
        out.stride(0),
        eps,
        HAS_WEIGHT=has_weight,
        BLOCK=block,
        num_warps=_warps(block),
    )
    return out.view(x.shape)


def _warps(block: int) -> int:
    return 8 if block >= 4096 else 4 if block >= 1024 else 2


def residual_norm(x: Tensor, y: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`x + rms_norm(y, weight)` (a branch added to the residual) in one kernel; x and y [..., H] alike."""
    triton, kernels = triton_kernels.require(KERNELS)
    cols = x.shape[-1]
    x, y = x.contiguous(), y.contiguous()
    out = torch.empty_like(x)
    if rows := x.numel() // max(cols, 1):
        block = triton.next_power_of_2(cols)
        kernels.residual_norm_rows[(rows,)](
            x, y, weight.contiguous(), out, cols, eps, BLOCK=block, num_warps=_warps(block)
        )
    return out


def feed_forward_residual(
    x: Tensor,
    a: Tensor,
    b: Tensor,
    weights: tuple[Tensor, Tensor, Tensor],
    scalar: Tensor,
    eps: float,
) -> Tensor:
    """`(x + rms_norm(rms_norm(a, wa) + rms_norm(b, wb), w)) * scalar` (a layer's dense and experts' branches
    normed, summed, normed, added to the residual and scaled), weights = (wa, wb, w), in one kernel."""
    triton, kernels = triton_kernels.require(KERNELS)
    cols = x.shape[-1]
    x, a, b = x.contiguous(), a.contiguous(), b.contiguous()
    out = torch.empty_like(x)
    if rows := x.numel() // max(cols, 1):
        block = triton.next_power_of_2(cols)
        kernels.feed_forward_residual_rows[(rows,)](
            x, a, b, *(w.contiguous() for w in weights), scalar, out, cols, eps, BLOCK=block,
            num_warps=_warps(block),
        )  # fmt: skip
    return out


def head_norm_rope(
    heads: Tensor,
    counts: tuple[int, int],
    own_v: bool,
    weights: tuple[Tensor, Tensor],
    cos: Tensor,
    sin: Tensor,
    eps: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v from a fused q/k/v product `heads` [B, T, Hq + Hkv (+ Hkv with `own_v`), D], counts =
    (Hq, Hkv) (without `own_v`, v is the k heads themselves, as Gemma's full layers have it): q and k normed with their weights and rotated by cos/sin
    [B|1, T, D] (`attention.apply_rope`), v normed without a weight -> [B, Hq|Hkv, T, D], contiguous. One
    kernel launch; the values are those of `rms_norm` then `apply_rope` in the heads' dtype."""
    triton, kernels = triton_kernels.require(KERNELS)
    b, t, _, d = heads.shape
    hq, hkv = counts
    src = heads.reshape(b * t, -1)
    if src.stride(-1) != 1:
        src = src.contiguous()
    tokens = b * t
    cos = cos.expand(b, t, d).contiguous()
    sin = sin.expand(b, t, d).contiguous()
    q = torch.empty(b, hq, t, d, dtype=heads.dtype, device=heads.device)
    k = torch.empty(b, hkv, t, d, dtype=heads.dtype, device=heads.device)
    v = torch.empty_like(k)
    if tokens:
        kernels.qkv_heads_rows[(tokens, hq + 2 * hkv)](
            src, weights[0], weights[1], cos, sin, q, k, v, hq, hkv, hq + hkv if own_v else hq, t, src.stride(0), eps,
            HEAD_DIM=d, num_warps=_warps(d),
        )  # fmt: skip
    return q, k, v


def feed_forward_inputs(
    x: Tensor, weight_a: Tensor, weight_b: Tensor, router_scale: Tensor, root: float, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """(rms_norm(x, weight_a), rms_norm(x, weight_b), rms_norm(x) * router_scale * root) from one read of x."""
    triton, kernels = triton_kernels.require(KERNELS)
    cols = x.shape[-1]
    x = x.contiguous()
    outs = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
    if rows := x.numel() // max(cols, 1):
        block = triton.next_power_of_2(cols)
        kernels.feed_forward_inputs_rows[(rows,)](
            x, weight_a.contiguous(), weight_b.contiguous(), router_scale.contiguous(), *outs, cols, root, eps,
            BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
    return outs


def gelu_mul(gate_up: Tensor) -> Tensor:
    """`gelu(gate) * up` for gate_up [..., 2I] = [gate ; up] (one product over row-fused weights) -> [..., I]."""
    triton, kernels = triton_kernels.require(KERNELS)
    width = gate_up.shape[-1] // 2
    flat = gate_up.reshape(-1, 2 * width).contiguous()
    out = torch.empty(*gate_up.shape[:-1], width, dtype=gate_up.dtype, device=gate_up.device)
    if rows := flat.shape[0]:
        kernels.gelu_mul_rows[(rows, triton.cdiv(width, 1024))](flat, out, width, BLOCK=1024, num_warps=4)
    return out


def softcap(logits: Tensor, cap: float, out: Tensor | None = None) -> Tensor:
    """tanh(logits / cap) * cap as fp32 in one pass over the LM head's product [..., V] (any dtype), into `out`
    (fp32, the same shape) when given: the reference's cast, divide, tanh and multiply are four passes over
    a [B, L, V] fp32 tensor (a 256-token canvas's is 268 MB), plus the copy into a static buffer."""
    triton, kernels = triton_kernels.require(KERNELS)
    cols = logits.shape[-1]
    flat = logits.reshape(-1, cols)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    if out is None:
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    elif out.shape != logits.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"out {tuple(out.shape)} {out.dtype}: want {tuple(logits.shape)} float32, contiguous"
        )
    dest = out.view(-1, cols)
    if rows := flat.shape[0]:
        kernels.softcap_rows[(rows, triton.cdiv(cols, 4096))](
            flat, dest, cols, flat.stride(0), dest.stride(0), cap, BLOCK=4096, num_warps=8
        )
    return out


def softmax_into(logits: Tensor, out: Tensor) -> Tensor:
    """softmax(logits [..., V] fp32) over the last axis, written into `out` (the same shape, any float dtype,
    contiguous) in two launches: each chunk's max and sum, then each chunk's probabilities in out's dtype.
    PyTorch's softmax into fp32, cast and copy read a 256-token canvas's 268 MB three times (the fast path's
    self-conditioning input: 0.37 ms a step on an H200); this reads it twice and writes out once."""
    triton, kernels = triton_kernels.require(KERNELS)
    cols = logits.shape[-1]
    if out.shape != logits.shape or not out.is_contiguous() or logits.dtype != torch.float32:
        raise ValueError(
            f"softmax of {tuple(logits.shape)} {logits.dtype} into {tuple(out.shape)}: want fp32 logits and "
            "a contiguous output of their shape"
        )
    flat = logits.reshape(-1, cols)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    dest = out.view(-1, cols)
    if rows := flat.shape[0]:
        block = min(4096, max(triton.next_power_of_2(cols), 16))
        chunks = triton.cdiv(cols, block)
        stats = torch.empty(rows, chunks, 2, dtype=torch.float32, device=logits.device)
        warps = _warps(block)
        kernels.row_chunk_max_sum[(rows, chunks)](
            flat, stats, cols, flat.stride(0), chunks, BLOCK=block, num_warps=warps
        )
        kernels.softmax_rows_into[(rows, chunks)](
            flat, stats, dest, cols, flat.stride(0), dest.stride(0), chunks, BLOCK=block,
            CHUNKS=max(triton.next_power_of_2(chunks), 2), num_warps=warps,
        )  # fmt: skip
    return out
