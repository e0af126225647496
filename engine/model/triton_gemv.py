"""One token's products with a weight matrix (GEMV) as one Triton kernel, for inference on CUDA.

Why: an autoregressive token multiplies one row by every dense weight of the network (q/k/v, the output
projection, the dense MLP: ~3.2 GB of bf16 at the 26B-A4B shape, a 0.66 ms floor on an H200), and cuBLAS
pads that row to a tile of 8 and splits K with a reduction kernel after it: 1.4 ms of a 4.0 ms token
(docs/gpu.md). A product of one row needs none of that: each program streams a few weight rows once and
sums in fp32. The dense MLP's activation rides along: `gelu_linear` reads [gate ; up] and applies
gelu(gate) * up to each chunk as it multiplies (one kernel fewer a layer).

More than one row (a canvas, an encoded chunk) keeps cuBLAS, whose tensor-core tiles are what those need.
The arithmetic is a product's in fp32 with one rounding to the input's dtype at the end; the order of the
sum differs from cuBLAS's, as any two GEMM kernels' do.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine.model import ops, triton_kernels, triton_norm

KERNELS = "dfim.engine.model.triton_gemv_kernels"
# The dtypes the startup check covers (`fast_check.gemv_mismatches`); others keep cuBLAS.
DTYPES = (torch.float32, torch.bfloat16)


def fits(x: Tensor, weight: Tensor) -> bool:
    """Whether the one-row kernel takes `x @ weight.T`: one row of a checked dtype, a weight of that dtype
    whose rows are contiguous, the layers' kernels applying (`triton_norm.applies`: CUDA inference) and this
    one passing its own check (`works`)."""
    return (
        math.prod(x.shape[:-1]) == 1
        and x.dtype in DTYPES
        and weight.dim() == 2
        and weight.stride(-1) == 1
        and weight.dtype == x.dtype
        and triton_norm.applies(x)
        and works(x.device.type)
    )


@functools.cache
def works(device_type: str) -> bool:
    """Whether the kernel builds and agrees with an fp64 product on this kind of device (run once). Where
    not, products keep cuBLAS and the log says why; the layers' other kernels have their own check."""
    from dfim.engine.model.fast_check import gemv_mismatches

    return triton_kernels.passes_check(
        lambda: gemv_mismatches(device_type), "Triton's one-row product kernel is", device_type
    )


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """`F.linear(x, weight)`, by the one-row kernel where it `fits`."""
    return gemv(x, weight) if fits(x, weight) else F.linear(x, weight)


def gelu_linear(gate_up: Tensor, weight: Tensor) -> Tensor:
    """`F.linear(gelu(gate) * up, weight)` for gate_up [..., 2I] = [gate ; up]: one kernel for one row, the
    activation kernel and cuBLAS for more, PyTorch's ops where the layers' kernels do not apply."""
    if fits(gate_up, weight):
        return gemv(gate_up, weight, gated=True)
    if triton_norm.applies(gate_up):
        return F.linear(triton_norm.gelu_mul(gate_up), weight)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.linear(ops.gelu(gate) * up, weight)


def gemv(
    x: Tensor,
    weight: Tensor,
    *,
    gated: bool = False,
    block_n: int | None = None,
    block_k: int | None = None,
    warps: int | None = None,
) -> Tensor:
    """x [..., K] (one row; [..., 2K] = [gate ; up] when `gated`) times weight [N, K] transposed -> [..., N]
    in x's dtype. `block_n` / `block_k` override the tile (`bench_gemv_gpu.py` sweeps them)."""
    n_out, n_in = weight.shape
    if math.prod(x.shape[:-1]) != 1 or x.shape[-1] != (2 * n_in if gated else n_in):
        raise ValueError(f"one row of {2 * n_in if gated else n_in} values, got {tuple(x.shape)}")
    if weight.stride(-1) != 1:
        raise ValueError("the weight's rows must be contiguous")
    triton, kernels = triton_kernels.require(KERNELS)
    row = x.reshape(-1).contiguous()
    out = torch.empty(*x.shape[:-1], n_out, dtype=x.dtype, device=x.device)
    default_n, default_k, default_warps = tile(n_in, gated)
    block_n, block_k, warps = block_n or default_n, block_k or default_k, warps or default_warps
    kernels.gemv_rows[(triton.cdiv(n_out, block_n),)](
        row, weight, out, n_out, n_in, weight.stride(0),
        GATED=gated, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
    )  # fmt: skip
    return out


def tile(n_in: int, gated: bool = False) -> tuple[int, int, int]:
    """(BLOCK_N, BLOCK_K, warps), from a sweep over the 26B shape's products on an H200 (docs/gpu.md,
    `bench_gemv_gpu.py --sweep`): two rows a program and 1,024 values of each a step were fastest or within
    4% of it for every plain product (many small programs keep every SM's loads in flight); the gated down
    projection, whose steps also compute the activation, took four rows and 512. A short row is read whole."""
    block_n, block_k = (4, 512) if gated else (2, 1024)
    return block_n, min(block_k, max(64, 1 << (n_in - 1).bit_length())), 4
