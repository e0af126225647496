"""The Triton kernels of `dfim.engine.model.triton_moe` (which explains them). This module imports Triton at
the top, so only `triton_kernels.load` imports it, on first use on a GPU machine: the CPU install never
needs Triton.

Triton resolves a kernel's helpers among its module's globals, which is why the kernels live in a module of
their own rather than inside the function that imports Triton.
"""

import triton
import triton.language as tl


@triton.jit
def expert_tile(active_ptr, offs_ptr, w_ptr, w_e, n_cols, BLOCK_N: tl.constexpr):
    """This program's expert (the program_id(0)-th of those with pairs, `sort_pairs`' `active`; -1 past
    them: no pairs, nothing to do), its tile of the output's columns (and which are inside), the expert's
    pairs [start, end) in sorted order, and its weights."""
    listed = tl.load(active_ptr + tl.program_id(0))
    expert = tl.maximum(listed, 0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    end = tl.where(listed >= 0, tl.load(offs_ptr + expert), 0)
    start = tl.where(listed > 0, tl.load(offs_ptr + expert - 1, mask=listed > 0, other=0), 0)
    return expert, cols, cols < n_cols, start, end, w_ptr + expert.to(tl.int64) * w_e


@triton.jit
def pair_block(token_ptr, row0, end, BLOCK_M: tl.constexpr):
    """An expert's pairs [row0, row0 + BLOCK_M) in sorted order (of its [start, end)): their positions,
    which are real, and their tokens."""
    rows = row0 + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    return rows, row_ok, tl.load(token_ptr + rows, mask=row_ok, other=0).to(tl.int64)


@triton.jit
def gelu_times(gate, up):
    """gelu(gate) * up, gelu's tanh approximation (ops.gelu); tanh(z) = 2 sigmoid(2z) - 1."""
    inner = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
    return 0.5 * gate * (2.0 * tl.sigmoid(2.0 * inner)) * up


@triton.jit
def saturate(v, dtype: tl.constexpr):
    """v rounded to `dtype`; float16 saturates at +-65504 instead of overflowing to inf (a NaN stays NaN)."""
    if dtype == tl.float16:
        v = tl.minimum(tl.maximum(v, -65504.0, propagate_nan=tl.PropagateNan.ALL), 65504.0,
                       propagate_nan=tl.PropagateNan.ALL)  # fmt: skip
    return v.to(dtype)


@triton.jit
def e4m3_grid(q):
    """q (|q| <= 448) rounded to the nearest e4m3 value in fp32, ties to even: what the GPU's conversion
    does, for Triton's interpreter, whose conversion rounds wrongly where the rounding carries into the next
    power of two (124.7 -> 64, Triton 3.9). Three bits of mantissa; below 2^-6 the step stays 2^-9."""
    step = tl.exp2(tl.maximum(tl.floor(tl.log2(tl.abs(q))), -6.0) - 3.0)
    t = q / step
    r = tl.floor(t + 0.5)
    r = tl.where((r - t == 0.5) & (r - 2.0 * tl.floor(r * 0.5) != 0.0), r - 1.0, r)  # a tie: to the even one
    return r * step


@triton.jit
def to_e4m3(v, ok, ROUND: tl.constexpr):
    """The rows of tile v [M, N] as e4m3 and one float32 scale a row (v ~= q * scale), over the columns `ok`
    [N] says are real: the row's largest finite magnitude goes to e4m3's largest value, 448. An all-zero row
    gets a tiny scale instead of a division by zero; an infinity saturates at +-448 and a NaN stays NaN, as
    the float16 products saturate and keep them. ROUND: round to e4m3's grid before the cast (`e4m3_grid`)."""
    finite = tl.abs(v) < float("inf")  # False for a NaN too
    scale = tl.maximum(tl.max(tl.where(ok[None, :] & finite, tl.abs(v), 0.0), axis=1), 1e-12) / 448.0
    q = tl.minimum(tl.maximum(v / scale[:, None], -448.0, propagate_nan=tl.PropagateNan.ALL), 448.0,
                   propagate_nan=tl.PropagateNan.ALL)  # fmt: skip
    if ROUND:
        q = e4m3_grid(q)
    return q.to(tl.float8e4nv), scale


@triton.jit
def quantize_rows(x_ptr, q_ptr, scale_ptr, n_cols, x_stride, BLOCK: tl.constexpr, ROUND: tl.constexpr):
    """Program (row): x's row as e4m3 (`to_e4m3`) into q [N, n_cols], its scale into scale [N]."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=ok, other=0.0).to(tl.float32)
    q, scale = to_e4m3(x[None, :], ok, ROUND)
    tl.store(q_ptr + row * n_cols + cols[None, :], q, mask=ok[None, :])
    tl.store(scale_ptr + row + tl.arange(0, 1), scale)


@triton.jit
def store_activations(act, h_ptr, h_scale_ptr, h_stride, rows, row_ok, cols, col_ok, n_inter,
                      BLOCK_N: tl.constexpr, QUANT: tl.constexpr, ROUND: tl.constexpr):  # fmt: skip
    """The experts' activations act [pairs, BLOCK_N columns] into h: QUANT, as e4m3 with one scale a (pair,
    this program's columns) in h_scale [pairs, cdiv(n_inter, BLOCK_N)]; else in h's dtype."""
    dest = h_ptr + rows[:, None].to(tl.int64) * h_stride + cols[None, :]
    if QUANT:
        q, group_scale = to_e4m3(act, col_ok, ROUND)
        tl.store(dest, q, mask=row_ok[:, None] & col_ok[None, :])
        groups = tl.cdiv(n_inter, BLOCK_N)
        tl.store(h_scale_ptr + rows.to(tl.int64) * groups + tl.program_id(1), group_scale, mask=row_ok)
    else:
        tl.store(dest, saturate(act, h_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def gate_up_act(x_ptr, w_ptr, scale_ptr, token_ptr, active_ptr, offs_ptr, h_ptr, n_hidden, n_inter, x_stride,
                w_e, w_n, w_k, h_stride, x_scale_ptr, h_scale_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, EXACT: tl.constexpr, SCALED: tl.constexpr, FP8_ACT: tl.constexpr,
                ROUND: tl.constexpr):  # fmt: skip
    """FP8_ACT (W8A8): x is e4m3 with a scale a token row (`x_scale`), both operands e4m3 (Hopper's warpgroup
    MMA takes them as they are from 64 rows a block; below that Triton widens both to float16), and the
    activations go out as e4m3 too, one scale a (pair, this program's BLOCK_N columns) in `h_scale`
    [pairs, cdiv(n_inter, BLOCK_N)], which `down_weighted` reads a reduction step of the same width at a
    time. ROUND: `to_e4m3`'s (the interpreter's)."""
    expert, cols, col_ok, start, end, w_expert = expert_tile(
        active_ptr, offs_ptr, w_ptr, w_e, n_inter, BLOCK_N
    )
    for row0 in range(start, end, BLOCK_M):
        rows, row_ok, tokens = pair_block(token_ptr, row0, end, BLOCK_M)
        gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, n_hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < n_hidden
            x = tl.load(x_ptr + tokens[:, None] * x_stride + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
            w_mask = k_ok[:, None] & col_ok[None, :]
            wg = tl.load(w_expert + cols[None, :] * w_n + ks[:, None] * w_k, mask=w_mask, other=0.0)
            wu = tl.load(w_expert + (cols[None, :] + n_inter) * w_n + ks[:, None] * w_k, mask=w_mask,
                         other=0.0)  # fmt: skip
            if SCALED and not FP8_ACT:  # FP8 weights: widened here (to float16: one instruction a pair on
                # Hopper), each output channel's scale applied after the sum
                wg = wg.to(x.dtype)
                wu = wu.to(x.dtype)
            if EXACT:  # fp32 weights: no TF32 rounding (the fp32 correctness check reads 1e-6)
                gate = tl.dot(x, wg, gate, input_precision="ieee")
                up = tl.dot(x, wu, up, input_precision="ieee")
            else:
                gate = tl.dot(x, wg, gate)
                up = tl.dot(x, wu, up)
        if SCALED:
            gate = gate * tl.load(scale_ptr + expert * 2 * n_inter + cols, mask=col_ok, other=0.0)[None, :]
            up = (
                up
                * tl.load(scale_ptr + expert * 2 * n_inter + n_inter + cols, mask=col_ok, other=0.0)[None, :]
            )
        if FP8_ACT:
            token_scale = tl.load(x_scale_ptr + tokens, mask=row_ok, other=0.0)[:, None]
            gate = gate * token_scale
            up = up * token_scale
        store_activations(gelu_times(gate, up), h_ptr, h_scale_ptr, h_stride, rows, row_ok, cols, col_ok, n_inter,
                          BLOCK_N, FP8_ACT, ROUND)  # fmt: skip


@triton.jit
def down_weighted(h_ptr, w_ptr, scale_ptr, slot_ptr, weight_ptr, active_ptr, offs_ptr, out_ptr, n_inter, n_hidden,
                  h_stride, w_e, w_n, w_k, out_stride, h_scale_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, EXACT: tl.constexpr, SCALED: tl.constexpr, FP8_ACT: tl.constexpr):  # fmt: skip
    """FP8_ACT: h is e4m3 with one scale a (pair, BLOCK_K columns), from `gate_up_act` with BLOCK_N =
    this BLOCK_K; each reduction step's product is scaled by its rows' scales before it is added."""
    expert, cols, col_ok, start, end, w_expert = expert_tile(
        active_ptr, offs_ptr, w_ptr, w_e, n_hidden, BLOCK_N
    )
    for row0 in range(start, end, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, n_inter, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < n_inter
            h = tl.load(h_ptr + rows[:, None].to(tl.int64) * h_stride + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
            w = tl.load(w_expert + cols[None, :] * w_n + ks[:, None] * w_k, mask=k_ok[:, None] & col_ok[None, :],
                        other=0.0)  # fmt: skip
            if SCALED and not FP8_ACT:
                w = w.to(h.dtype)
            if FP8_ACT:
                step = rows.to(tl.int64) * tl.cdiv(n_inter, BLOCK_K) + k0 // BLOCK_K
                acc += tl.dot(h, w) * tl.load(h_scale_ptr + step, mask=row_ok, other=0.0)[:, None]
            elif EXACT:
                acc = tl.dot(h, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(h, w, acc)
        if SCALED:
            acc = acc * tl.load(scale_ptr + expert * n_hidden + cols, mask=col_ok, other=0.0)[None, :]
        slots = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        routing = tl.load(weight_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)
        acc = acc * routing[:, None]
        tl.store(out_ptr + slots[:, None] * out_stride + cols[None, :], acc,
                 mask=row_ok[:, None] & col_ok[None, :])  # fmt: skip


@triton.jit
def sum_pairs(src_ptr, out_ptr, n_cols, K: tl.constexpr, BLOCK: tl.constexpr):
    """A token's output: the sum of its K pair rows (fp32, in pair order), rounded once to the output's dtype."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < n_cols
    acc = tl.zeros([BLOCK], tl.float32)
    for j in tl.static_range(K):
        acc += tl.load(src_ptr + (token * K + j) * n_cols + cols, mask=inside, other=0.0)
    tl.store(out_ptr + token * n_cols + cols, acc.to(out_ptr.dtype.element_ty), mask=inside)


@triton.jit
def route_rows(scores_ptr, expert_scale_ptr, weight_ptr, index_ptr, n_experts, K: tl.constexpr,
               BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    """One token's routing (`experts.Router`): softmax of its scores in fp32, the top K (highest first, the
    lower expert id first on a tie, as torch.topk), renormalised to sum 1, times each chosen expert's scale."""
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    inside = experts < n_experts
    scores = tl.load(scores_ptr + row * n_experts + experts, mask=inside, other=-float("inf")).to(tl.float32)
    probs = tl.exp(scores - tl.max(scores, axis=0))
    probs = tl.where(inside, probs / tl.sum(probs, axis=0), -1.0)
    slots = tl.arange(0, BLOCK_K)
    chosen = tl.zeros([BLOCK_K], tl.float32)
    index = tl.zeros([BLOCK_K], tl.int32)
    for slot in tl.static_range(K):
        best = tl.max(probs, axis=0)
        which = tl.min(tl.where(probs == best, experts, BLOCK_E), axis=0)
        which = tl.minimum(which, n_experts - 1)  # a NaN score matches nothing: still a real expert
        chosen = tl.where(slots == slot, best, chosen)
        index = tl.where(slots == slot, which, index)
        probs = tl.where(experts == which, -1.0, probs)
    used = slots < K
    scale = tl.load(expert_scale_ptr + index, mask=used, other=0.0).to(tl.float32)
    weights = chosen / tl.sum(tl.where(used, chosen, 0.0), axis=0) * scale
    tl.store(weight_ptr + row * K + slots, weights, mask=used)
    tl.store(index_ptr + row * K + slots, index.to(index_ptr.dtype.element_ty), mask=used)


@triton.jit
def experts_with_pairs(expert, n_pairs, n_experts, PAIRS: tl.constexpr, EXPERTS: tl.constexpr):
    """The experts' ids [EXPERTS], their pair counts, which are real experts with pairs, and how many are:
    from `expert` [PAIRS], whose padding lanes read expert 0 (taken off its count)."""
    ids = tl.arange(0, EXPERTS)
    counts = tl.histogram(expert, EXPERTS)
    counts = tl.where(ids == 0, counts - (PAIRS - n_pairs), counts)
    used = (counts > 0) & (ids < n_experts)
    return ids, counts, used, tl.sum(used.to(tl.int32), axis=0)


@triton.jit
def sort_pairs(index_ptr, order_ptr, token_ptr, offs_ptr, active_ptr, n_pairs, k, n_experts, n_active,
               PAIRS: tl.constexpr, EXPERTS: tl.constexpr):  # fmt: skip
    """One program sorts every token-expert pair by expert (stable: by pair id within an expert): `order`
    the pair ids in that order, `token` their tokens, `offs` [E] each expert's end in it (a running sum of
    the counts), `active` [n_active] the experts with pairs in ascending order, then -1. The work of an
    argsort, a scatter-add, a cumsum and a compaction (several kernels) in one."""
    pairs = tl.arange(0, PAIRS)
    inside = pairs < n_pairs
    expert = tl.load(index_ptr + pairs, mask=inside, other=0).to(tl.int32)
    key = tl.where(inside, expert, n_experts) * PAIRS + pairs  # the padding sorts after every real pair
    order = tl.sort(key) % PAIRS
    tl.store(order_ptr + pairs, order, mask=inside)
    tl.store(token_ptr + pairs, order // k, mask=inside)
    ids, counts, used, listed = experts_with_pairs(expert, n_pairs, n_experts, PAIRS, EXPERTS)
    tl.store(offs_ptr + ids, tl.cumsum(counts, axis=0), mask=ids < n_experts)
    rank = tl.cumsum(used.to(tl.int32), axis=0) - 1
    tl.store(active_ptr + rank, ids, mask=used)
    tl.store(active_ptr + ids, tl.full([EXPERTS], -1, tl.int32), mask=(ids >= listed) & (ids < n_active))


@triton.jit
def sort_pairs_by_expert(index_ptr, order_ptr, token_ptr, offs_ptr, active_ptr, n_pairs, k, n_experts, n_active,
                         PAIRS: tl.constexpr, EXPERTS: tl.constexpr):  # fmt: skip
    """`sort_pairs`' outputs with one program per expert, for many pairs: program e places the pairs routed
    to e, in pair order (stable), after every pair of a lower expert, and writes its own entries of `offs`
    and `active`. Every program reads all the pairs (a few KB, from L2) and none waits for another, where
    one program's sort of 2,048 keys took ~20 us."""
    e = tl.program_id(0)
    pairs = tl.arange(0, PAIRS)
    inside = pairs < n_pairs
    expert = tl.load(index_ptr + pairs, mask=inside, other=0).to(tl.int32)
    mine = inside & (expert == e)
    start = tl.sum((inside & (expert < e)).to(tl.int32), axis=0)
    count = tl.sum(mine.to(tl.int32), axis=0)
    slot = start + tl.cumsum(mine.to(tl.int32), axis=0) - 1
    tl.store(order_ptr + slot, pairs.to(tl.int64), mask=mine)
    tl.store(token_ptr + slot, (pairs // k).to(tl.int64), mask=mine)
    tl.store(offs_ptr + e, start + count)
    ids, _, used, listed = experts_with_pairs(expert, n_pairs, n_experts, PAIRS, EXPERTS)
    if count > 0:  # e's place among the experts with pairs, in ascending order
        tl.store(active_ptr + tl.sum((used & (ids < e)).to(tl.int32), axis=0), e)
    if (e >= listed) & (e < n_active):
        tl.store(active_ptr + e, -1)


@triton.jit
def accumulate(a, b, acc, PROMOTE: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc + a @ b for e4m3 a and b. PROMOTE: each step's sum is added into acc in fp32, since Hopper's FP8
    MMA keeps fewer bits in its own accumulator; without it the MMA accumulates the whole reduction itself
    (Triton's default there), which lets it run asynchronously across steps."""
    if PROMOTE:
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def gate_up_act_first(x_ptr, w_ptr, scale_ptr, token_ptr, active_ptr, offs_ptr, h_ptr, n_hidden, n_inter, x_stride,
                      w_e, w_n, w_k, h_stride, x_scale_ptr, h_scale_ptr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ROUND: tl.constexpr, QUANT: tl.constexpr,
                      PROMOTE: tl.constexpr, FP8: tl.constexpr):  # fmt: skip
    """`gate_up_act` with the weights as the products' first operand: a product's rows are BLOCK_N output
    columns and its columns an expert's BLOCK_M pairs, so from 64 columns a program Hopper's warpgroup MMA
    runs whatever the pairs (with the pairs as rows it needs 64 of them, where an expert has ~16).
    FP8 (W8A8): both tiles e4m3 as they are (else Triton widens both to float16 first), x with a scale a
    token row, the weights one an output channel; QUANT: the activations go out as e4m3 with one scale a
    (pair, BLOCK_N columns), else in h's dtype (fp32, for `quantize_rows` to give one scale a pair). Without
    FP8 the weights and x are 16-bit, the activations go out in h's dtype and nothing is scaled."""
    expert, cols, col_ok, start, end, w_expert = expert_tile(
        active_ptr, offs_ptr, w_ptr, w_e, n_inter, BLOCK_N
    )
    if FP8:
        gate_scale = tl.load(scale_ptr + expert * 2 * n_inter + cols, mask=col_ok, other=0.0)
        up_scale = tl.load(scale_ptr + expert * 2 * n_inter + n_inter + cols, mask=col_ok, other=0.0)
    for row0 in range(start, end, BLOCK_M):
        rows, row_ok, tokens = pair_block(token_ptr, row0, end, BLOCK_M)
        gate = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k0 in range(0, n_hidden, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < n_hidden
            x = tl.load(x_ptr + tokens[None, :] * x_stride + ks[:, None],
                        mask=k_ok[:, None] & row_ok[None, :], other=0.0)  # fmt: skip
            w_mask = col_ok[:, None] & k_ok[None, :]
            wg = tl.load(w_expert + cols[:, None] * w_n + ks[None, :] * w_k, mask=w_mask, other=0.0)
            wu = tl.load(
                w_expert + (cols[:, None] + n_inter) * w_n + ks[None, :] * w_k, mask=w_mask, other=0.0
            )
            gate = accumulate(wg, x, gate, PROMOTE, BLOCK_K)
            up = accumulate(wu, x, up, PROMOTE, BLOCK_K)
        if FP8:
            token_scale = tl.load(x_scale_ptr + tokens, mask=row_ok, other=0.0)[None, :]
            gate = gate * gate_scale[:, None] * token_scale
            up = up * up_scale[:, None] * token_scale
        act = tl.trans(gelu_times(gate, up))  # [pairs, columns]
        store_activations(act, h_ptr, h_scale_ptr, h_stride, rows, row_ok, cols, col_ok, n_inter, BLOCK_N, QUANT,
                          ROUND)  # fmt: skip


@triton.jit
def down_weighted_first(h_ptr, w_ptr, scale_ptr, slot_ptr, weight_ptr, active_ptr, offs_ptr, out_ptr, n_inter,
                        n_hidden, h_stride, w_e, w_n, w_k, out_stride, h_scale_ptr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr, ROW_SCALE: tl.constexpr,
                        PROMOTE: tl.constexpr, COLUMN_TILES: tl.constexpr, FP8: tl.constexpr):  # fmt: skip
    """`down_weighted` with the weights first (`gate_up_act_first`). FP8 (W8A8): with ROW_SCALE the
    activations have one scale a pair, applied once after the sum; else one a pair and GROUP columns
    (gate_up's BLOCK_N), which BLOCK_K divides, so each reduction step's product is scaled by its pairs'
    scales of one group; the weights' output channels are scaled at the end. A program writes COLUMN_TILES
    tiles of BLOCK_N output columns in one loop over (tile, step): the reduction (the intermediate size) is
    short, and one loop keeps the loads of the next tile in flight while a tile is finished."""
    expert, _, _, start, end, w_expert = expert_tile(active_ptr, offs_ptr, w_ptr, w_e, n_hidden, BLOCK_N)
    groups = tl.cdiv(n_inter, GROUP)
    k_steps = tl.cdiv(n_inter, BLOCK_K)
    for row0 in range(start, end, BLOCK_M):
        rows = row0 + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        slots = tl.load(slot_ptr + rows, mask=row_ok, other=0).to(tl.int64)
        routing = tl.load(weight_ptr + slots, mask=row_ok, other=0.0).to(tl.float32)
        if FP8 and ROW_SCALE:
            routing = routing * tl.load(h_scale_ptr + rows, mask=row_ok, other=0.0)
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for step in range(0, COLUMN_TILES * k_steps):
            cols = (tl.program_id(1) * COLUMN_TILES + step // k_steps) * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < n_hidden
            k0 = (step % k_steps) * BLOCK_K
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < n_inter
            h = tl.load(h_ptr + rows[None, :].to(tl.int64) * h_stride + ks[:, None],
                        mask=k_ok[:, None] & row_ok[None, :], other=0.0)  # fmt: skip
            w = tl.load(w_expert + cols[:, None] * w_n + ks[None, :] * w_k, mask=col_ok[:, None] & k_ok[None, :],
                        other=0.0)  # fmt: skip
            if ROW_SCALE or not FP8:
                acc = accumulate(w, h, acc, PROMOTE, BLOCK_K)
            else:
                step_scale = tl.load(
                    h_scale_ptr + rows.to(tl.int64) * groups + k0 // GROUP, mask=row_ok, other=0.0
                )
                acc += tl.dot(w, h) * step_scale[None, :]
            if step % k_steps == k_steps - 1:  # the tile's last step: scale and write it, start the next
                if FP8:
                    acc = acc * tl.load(scale_ptr + expert * n_hidden + cols, mask=col_ok, other=0.0)[:, None]
                acc = acc * routing[None, :]
                tl.store(out_ptr + slots[None, :] * out_stride + cols[:, None], acc,
                         mask=col_ok[:, None] & row_ok[None, :])  # fmt: skip
                acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
