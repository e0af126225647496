"""The Triton kernels of `dfim.engine.model.triton_norm` (which explains them). This module imports Triton at
the top, so only `triton_kernels.load` imports it, on first use on a GPU machine: the CPU install never
needs Triton. Triton resolves a kernel's helpers among its module's globals, hence a module of their own.

Every kernel runs one program per row (a token's hidden state, or one head of it) and computes in fp32,
rounding to the output's dtype exactly where the separate PyTorch ops of the reference round, so a fused
kernel gives the reference's values up to its rsqrt and tanh (the gated activation's tanh is a sigmoid form,
within ~1e-7 of PyTorch's for large negative inputs).
"""

import triton
import triton.language as tl


@triton.jit
def normed(row_ptr, w_ptr, cols, inside, n_cols, eps, HAS_WEIGHT: tl.constexpr):
    """One row's RMSNorm in fp32, unrounded: the row, times rsqrt(mean of squares + eps), times the weight."""
    y = tl.load(row_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    y = y * tl.rsqrt(tl.sum(y * y, axis=0) / n_cols + eps)
    if HAS_WEIGHT:
        y = y * tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    return y


@triton.jit
def rms_norm_rows(x_ptr, w_ptr, out_ptr, n_cols, x_stride, out_stride, eps,
                  HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    y = normed(x_ptr + row * x_stride, w_ptr, cols, inside, n_cols, eps, HAS_WEIGHT)
    tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def residual_norm_rows(x_ptr, y_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK: tl.constexpr):  # fmt: skip
    """out = x + norm(y) * w, the norm rounded before the add."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    y = normed(y_ptr + row * n_cols, w_ptr, cols, inside, n_cols, eps, True).to(dtype).to(tl.float32)
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (x + y).to(dtype), mask=inside)


@triton.jit
def feed_forward_residual_rows(x_ptr, a_ptr, b_ptr, wa_ptr, wb_ptr, w_ptr, scalar_ptr, out_ptr, n_cols, eps,
                               BLOCK: tl.constexpr):  # fmt: skip
    """out = (x + norm(norm_a(a) + norm_b(b))) * scalar."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    a = normed(a_ptr + row * n_cols, wa_ptr, cols, inside, n_cols, eps, True).to(dtype).to(tl.float32)
    b = normed(b_ptr + row * n_cols, wb_ptr, cols, inside, n_cols, eps, True).to(dtype).to(tl.float32)
    total = (a + b).to(dtype).to(tl.float32)
    total = total * tl.rsqrt(tl.sum(total * total, axis=0) / n_cols + eps)
    total = (total * tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)).to(dtype).to(tl.float32)
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    summed = (x + total).to(dtype).to(tl.float32)
    scalar = tl.load(scalar_ptr).to(tl.float32)
    tl.store(out_ptr + row * n_cols + cols, (summed * scalar).to(dtype), mask=inside)


@triton.jit
def head_norm_rope(src_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, token, src_head, out_head, n_heads, seq_len,
                   src_stride, eps, HEAD_DIM: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROPE: tl.constexpr):  # fmt: skip
    """One head of one token: RMSNorm over the head (its weight if any), then RoPE
    (`x * cos + rotate_half(x) * sin`, rotate_half(x) = cat(-x2, x1)), each rounded as its PyTorch op
    rounds; written to out [B, n_heads, T, D] (the attention's layout) at head `out_head`."""
    cols = tl.arange(0, HEAD_DIM)
    half: tl.constexpr = HEAD_DIM // 2
    row_ptr = src_ptr + token * src_stride + src_head * HEAD_DIM
    dtype = out_ptr.dtype.element_ty
    y = normed(row_ptr, w_ptr, cols, cols < HEAD_DIM, HEAD_DIM, eps, HAS_WEIGHT).to(dtype).to(tl.float32)
    if ROPE:
        # the partner column's normed value, with the same row scale as the whole row's norm gives it
        partner = (cols + half) % HEAD_DIM
        x = tl.load(row_ptr + cols).to(tl.float32)
        xp = tl.load(row_ptr + partner).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
        yp = xp * rstd
        if HAS_WEIGHT:
            yp = yp * tl.load(w_ptr + partner).to(tl.float32)
        yp = yp.to(dtype).to(tl.float32)
        yp = tl.where(cols < half, -yp, yp)
        cos = tl.load(cos_ptr + token * HEAD_DIM + cols).to(tl.float32)
        sin = tl.load(sin_ptr + token * HEAD_DIM + cols).to(tl.float32)
        y = (y * cos).to(dtype).to(tl.float32) + (yp * sin).to(dtype).to(tl.float32)
    batch, position = token // seq_len, token % seq_len
    tl.store(out_ptr + ((batch * n_heads + out_head) * seq_len + position) * HEAD_DIM + cols, y.to(dtype))


@triton.jit
def qkv_heads_rows(src_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, n_q, n_kv, v_head0, seq_len,
                   src_stride, eps, HEAD_DIM: tl.constexpr):  # fmt: skip
    """Program (token, head) over every q, k and v head of a fused q/k/v product's row: q and k normed with
    their weights and rotated, v normed without a weight (`v_head0`: where v's heads start in the row: after
    k's, or k's own heads where the layer has no v projection)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    if head < n_q:
        head_norm_rope(src_ptr, wq_ptr, cos_ptr, sin_ptr, q_ptr, token, head, head, n_q, seq_len, src_stride, eps,
                       HEAD_DIM, True, True)  # fmt: skip
    elif head < n_q + n_kv:
        head_norm_rope(src_ptr, wk_ptr, cos_ptr, sin_ptr, k_ptr, token, head, head - n_q, n_kv, seq_len, src_stride,
                       eps, HEAD_DIM, True, True)  # fmt: skip
    else:
        v = head - n_q - n_kv
        head_norm_rope(src_ptr, wk_ptr, cos_ptr, sin_ptr, v_ptr, token, v_head0 + v, v, n_kv, seq_len, src_stride,
                       eps, HEAD_DIM, False, False)  # fmt: skip


@triton.jit
def feed_forward_inputs_rows(x_ptr, wa_ptr, wb_ptr, scale_ptr, a_ptr, b_ptr, r_ptr, n_cols, root, eps,
                             BLOCK: tl.constexpr):  # fmt: skip
    """A layer's three feed-forward inputs from one read of the residual x: norm_a(x) (the dense MLP's),
    norm_b(x) (the experts'), and the router's norm(x) * scale * root, rounded after each product as the
    reference rounds."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    dtype = a_ptr.dtype.element_ty
    y = normed(x_ptr + row * n_cols, wa_ptr, cols, inside, n_cols, eps, False)
    wa = tl.load(wa_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    wb = tl.load(wb_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(a_ptr + row * n_cols + cols, (y * wa).to(dtype), mask=inside)
    tl.store(b_ptr + row * n_cols + cols, (y * wb).to(dtype), mask=inside)
    scale = tl.load(scale_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    r = (y.to(dtype).to(tl.float32) * scale).to(dtype).to(tl.float32) * root
    tl.store(r_ptr + row * n_cols + cols, r.to(dtype), mask=inside)


@triton.jit
def gelu_times(gate, up, dtype: tl.constexpr):
    """gelu(gate) * up in fp32, rounded to `dtype` where `ops.gelu(gate) * up` rounds: gelu's tanh form
    before the product, and the product."""
    inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
    act = (
        (0.5 * gate * (2.0 * tl.sigmoid(2.0 * inner))).to(dtype).to(tl.float32)
    )  # tanh(z) = 2 sigmoid(2z) - 1
    return (act * up).to(dtype).to(tl.float32)


@triton.jit
def gelu_mul_rows(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    """A gated MLP's activation: row [gate ; up] (2 * n_cols) -> gelu(gate) * up."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    gate = tl.load(x_ptr + row * 2 * n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * n_cols + n_cols + cols, mask=inside, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + row * n_cols + cols, gelu_times(gate, up, dtype).to(dtype), mask=inside)


@triton.jit
def softcap_rows(x_ptr, out_ptr, n_cols, x_stride, out_stride, cap, BLOCK: tl.constexpr):  # fmt: skip
    """The LM head's soft cap: out = tanh(x / cap) * cap in fp32, from logits in any dtype (the product's)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    z = tl.load(x_ptr + row * x_stride + cols, mask=inside, other=0.0).to(tl.float32) / cap
    tanh = 2.0 * tl.sigmoid(2.0 * z) - 1.0
    tl.store(out_ptr + row * out_stride + cols, tanh * cap, mask=inside)


@triton.jit
def row_chunk_max_sum(x_ptr, stats_ptr, n_cols, x_stride, n_chunks, BLOCK: tl.constexpr):
    """One chunk of one fp32 row -> its largest value m and sum exp(x - m), for `softmax_rows_into`."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    total = tl.sum(tl.where(x > -float("inf"), tl.exp(x - m), 0.0), axis=0)
    at = (row * n_chunks + chunk) * 2
    tl.store(stats_ptr + at, m)
    tl.store(stats_ptr + at + 1, total)


@triton.jit
def softmax_rows_into(x_ptr, stats_ptr, out_ptr, n_cols, x_stride, out_stride, n_chunks, BLOCK: tl.constexpr,
                      CHUNKS: tl.constexpr):  # fmt: skip
    """One chunk of one row's softmax in the output's dtype: exp(x - logsumexp), the row's logsumexp combined
    from its chunks' (m, sum) (every program combines them again: a few dozen numbers from L2)."""
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS)
    inside = chunks < n_chunks
    m = tl.load(stats_ptr + (row * n_chunks + chunks) * 2, mask=inside, other=-float("inf"))
    total = tl.load(stats_ptr + (row * n_chunks + chunks) * 2 + 1, mask=inside, other=0.0)
    top = tl.max(m, axis=0)
    lse = top + tl.log(tl.sum(tl.where(total > 0, total * tl.exp(m - top), 0.0), axis=0))
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=-float("inf")).to(tl.float32)
    p = tl.where(x > -float("inf"), tl.exp(x - lse), 0.0)
    tl.store(out_ptr + row * out_stride + cols, p.to(out_ptr.dtype.element_ty), mask=ok)
