"""The Triton kernel of `dfim.engine.model.triton_gemv` (which explains it). This module imports Triton at the
top, so only `triton_kernels.load` imports it, on first use on a GPU machine."""

import triton
import triton.language as tl

from dfim.engine.model.triton_norm_kernels import gelu_times


@triton.jit
def gemv_rows(x_ptr, w_ptr, out_ptr, n_out, n_in, w_stride,
              GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """out[n] = sum_k x[k] * w[n, k] for one row x, BLOCK_N outputs a program. Each program streams its
    BLOCK_N weight rows once, BLOCK_K contiguous values of each at a time, and accumulates in fp32. GATED: x
    is [gate ; up] (2 * n_in) and the product reads gelu(gate) * up, rounded as the separate activation
    kernel rounds it (`gelu_times`)."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = rows < n_out
    dtype = out_ptr.dtype.element_ty
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * w_stride
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in range(0, n_in, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        inside = cols < n_in
        x = tl.load(x_ptr + cols, mask=inside, other=0.0).to(tl.float32)
        if GATED:
            up = tl.load(x_ptr + n_in + cols, mask=inside, other=0.0).to(tl.float32)
            x = gelu_times(x, up, dtype)
        # the weights are read once a product: streamed past the cache
        w = tl.load(w_rows + cols[None, :], mask=keep[:, None] & inside[None, :], other=0.0,
                    eviction_policy="evict_first")  # fmt: skip
        acc += w.to(tl.float32) * x[None, :]
    tl.store(out_ptr + rows, tl.sum(acc, axis=1).to(dtype), mask=keep)
