"""The Triton kernels of `dfim.engine.model.triton_attention` (which explains them). This module imports
Triton at the top, so only `triton_kernels.load` imports it, on first use on a GPU machine: the CPU
install never needs Triton."""

import triton
import triton.language as tl

# A masked score: far below any real one, yet finite, so a row with no key yet in view computes no NaN
MASKED = tl.constexpr(-1.0e30)


@triton.jit
def attend_block(q, k_head, v_head, block, end, lo1, hi1, lo2, hi2, dims, value_dims, m, total, acc,
                 HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EXACT: tl.constexpr, MASK: tl.constexpr):  # fmt: skip
    """One key block's step of the online softmax: (m, total, acc) updated by keys [block, block + BLOCK_N).
    MASK: each row sees only the keys its intervals hold, below `end`; else every key of the block is in view
    of every row (no comparisons, no masked loads)."""
    keys = block + tl.arange(0, BLOCK_N)
    if MASK:
        key_ok = keys < end
        k = tl.load(k_head + keys[:, None] * HEAD_DIM + dims[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_head + keys[:, None] * HEAD_DIM + value_dims[None, :], mask=key_ok[:, None], other=0.0)
    else:
        k = tl.load(k_head + keys[:, None] * HEAD_DIM + dims[None, :])
        v = tl.load(v_head + keys[:, None] * HEAD_DIM + value_dims[None, :])
    if EXACT:
        scores = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        scores = tl.dot(q, tl.trans(k))
    if MASK:
        seen = ((keys[None, :] >= lo1[:, None]) & (keys[None, :] < hi1[:, None])) | (
            (keys[None, :] >= lo2[:, None]) & (keys[None, :] < hi2[:, None])
        )
        seen = seen & key_ok[None, :]
        scores = tl.where(seen, scores, MASKED)
    m_new = tl.maximum(m, tl.max(scores, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(scores - m_new[:, None])
    if MASK:
        p = tl.where(seen, p, 0.0)
    total = total * alpha + tl.sum(p, axis=1)
    if EXACT:
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, total, acc


@triton.jit
def attend_keys(q_ptr, k_ptr, v_ptr, bounds_ptr, out_ptr, part_ptr, stats_ptr, seq_len, groups, key_lo, key_hi,
                keys_per_split, k_head_stride, out_row_stride,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                EXACT: tl.constexpr, BLOCK_DV: tl.constexpr):  # fmt: skip
    """Program (KV head and slice of the value's dimensions, block of query rows, split of the keys). The
    query heads that share a KV head are folded into its rows (row r: head kv * groups + r // seq_len,
    position r % seq_len), so every key block read serves all of them. Each row sees the keys in [lo1, hi1)
    and [lo2, hi2) from `bounds` [T, 4] (its position's), within this split's share of [key_lo, key_hi).
    Online softmax in fp32, scale 1.0 (Gemma 4's normed queries and keys). A program writes BLOCK_DV of the
    output's HEAD_DIM dimensions (the scores take all of them): a wide head's accumulator split over
    programs, so that one program can take more rows. SPLIT: the unnormalised sum and the row's max and sum
    of weights go to `part`/`stats` for `combine_splits`; else the normalised rows go straight to out
    [T, Hq, D]."""
    slices = HEAD_DIM // BLOCK_DV
    kv = (tl.program_id(0) // slices).to(tl.int64)
    n_kv = tl.num_programs(0) // slices
    value_dims = (tl.program_id(0) % slices) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    split = tl.program_id(2)
    n_rows = groups * seq_len
    row_ok = rows < n_rows
    head = kv * groups + rows // seq_len
    position = rows % seq_len
    dims = tl.arange(0, HEAD_DIM)
    q = tl.load(
        q_ptr + (head * seq_len + position)[:, None] * HEAD_DIM + dims[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    lo1 = tl.load(bounds_ptr + position * 4 + 0, mask=row_ok, other=0)
    hi1 = tl.load(bounds_ptr + position * 4 + 1, mask=row_ok, other=0)
    lo2 = tl.load(bounds_ptr + position * 4 + 2, mask=row_ok, other=0)
    hi2 = tl.load(bounds_ptr + position * 4 + 3, mask=row_ok, other=0)
    start = key_lo + split * keys_per_split
    end = tl.minimum(start + keys_per_split, key_hi)
    # only the key blocks some row of this block can see
    first = tl.min(tl.where(row_ok & (hi1 > lo1), lo1, key_hi), axis=0)
    first = tl.minimum(first, tl.min(tl.where(row_ok & (hi2 > lo2), lo2, key_hi), axis=0))
    last = tl.maximum(tl.max(tl.where(row_ok, hi1, 0), axis=0), tl.max(tl.where(row_ok, hi2, 0), axis=0))
    start = tl.maximum(start, first)
    end = tl.minimum(end, last)
    # Key blocks inside the interval [lo1, hi1) of every row need no mask (a canvas row's context; most of a
    # sliding window): they run in a loop of their own, between two masked loops for the blocks around them.
    whole_lo = tl.max(tl.where(row_ok, lo1, 0), axis=0)
    whole_hi = tl.min(tl.where(row_ok, hi1, key_hi), axis=0)
    open_from = start + tl.cdiv(tl.maximum(whole_lo - start, 0), BLOCK_N) * BLOCK_N
    open_to = open_from + tl.maximum(tl.minimum(whole_hi, end) - open_from, 0) // BLOCK_N * BLOCK_N
    any_open = open_to > open_from  # else no such block: the first masked loop takes them all
    open_from = tl.where(any_open, open_from, end)
    open_to = tl.where(any_open, open_to, end)
    k_head = k_ptr + kv * k_head_stride
    v_head = v_ptr + kv * k_head_stride
    m = tl.full([BLOCK_M], MASKED, tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    if EXACT:  # fp32 inputs (the fp32 check): one masked loop, as ptxas takes minutes over three fp32 copies
        for block in range(start, end, BLOCK_N):
            m, total, acc = attend_block(q, k_head, v_head, block, end, lo1, hi1, lo2, hi2, dims, value_dims, m,
                                         total, acc, HEAD_DIM, BLOCK_N, EXACT, True)  # fmt: skip
    else:
        for block in range(start, open_from, BLOCK_N):
            m, total, acc = attend_block(q, k_head, v_head, block, end, lo1, hi1, lo2, hi2, dims, value_dims, m,
                                         total, acc, HEAD_DIM, BLOCK_N, EXACT, True)  # fmt: skip
        for block in range(open_from, open_to, BLOCK_N):
            m, total, acc = attend_block(q, k_head, v_head, block, end, lo1, hi1, lo2, hi2, dims, value_dims, m,
                                         total, acc, HEAD_DIM, BLOCK_N, EXACT, False)  # fmt: skip
        for block in range(open_to, end, BLOCK_N):
            m, total, acc = attend_block(q, k_head, v_head, block, end, lo1, hi1, lo2, hi2, dims, value_dims, m,
                                         total, acc, HEAD_DIM, BLOCK_N, EXACT, True)  # fmt: skip
    if SPLIT:
        slot = (split * n_kv + kv) * n_rows + rows
        tl.store(part_ptr + slot[:, None] * HEAD_DIM + value_dims[None, :], acc, mask=row_ok[:, None])
        if tl.program_id(0) % slices == 0:  # every slice has the same max and sum
            tl.store(stats_ptr + slot * 2, m, mask=row_ok)
            tl.store(stats_ptr + slot * 2 + 1, total, mask=row_ok)
    else:
        out = acc / tl.maximum(total, 1e-30)[:, None]
        dest = out_ptr + position[:, None] * out_row_stride + head[:, None] * HEAD_DIM + value_dims[None, :]
        tl.store(dest, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def combine_splits(part_ptr, stats_ptr, out_ptr, seq_len, groups, n_kv, out_row_stride,
                   HEAD_DIM: tl.constexpr, SPLITS: tl.constexpr):  # fmt: skip
    """Program (KV head, folded row): the splits' partial sums weighted by exp(max - overall max), over
    their weights' total -> the row of out [T, Hq, D]."""
    kv = tl.program_id(0).to(tl.int64)
    row = tl.program_id(1).to(tl.int64)
    n_rows = groups * seq_len
    splits = tl.arange(0, SPLITS)
    slot = (splits * n_kv + kv) * n_rows + row
    m = tl.load(stats_ptr + slot * 2)
    total = tl.load(stats_ptr + slot * 2 + 1)
    weight = tl.exp(m - tl.max(m, axis=0))
    dims = tl.arange(0, HEAD_DIM)
    part = tl.load(part_ptr + slot[:, None] * HEAD_DIM + dims[None, :])
    out = tl.sum(part * weight[:, None], axis=0) / tl.maximum(tl.sum(total * weight, axis=0), 1e-30)
    head = kv * groups + row // seq_len
    position = row % seq_len
    tl.store(out_ptr + position * out_row_stride + head * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def store_rows(k_ptr, v_ptr, cache_k_ptr, cache_v_ptr, slot_ptr, seq_len, cache_len, head_dim,
               BLOCK_D: tl.constexpr):  # fmt: skip
    """Program (token, KV head): the token's key and value rows of that head into the caches' row
    `slots[token]` (sources [Hkv, T, D], caches [Hkv, S, D], both contiguous)."""
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    inside = cols < head_dim
    slot = tl.load(slot_ptr + token).to(tl.int64)
    src = (head * seq_len + token) * head_dim + cols
    dst = (head * cache_len + slot) * head_dim + cols
    tl.store(cache_k_ptr + dst, tl.load(k_ptr + src, mask=inside), mask=inside)
    tl.store(cache_v_ptr + dst, tl.load(v_ptr + src, mask=inside), mask=inside)
