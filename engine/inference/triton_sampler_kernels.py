"""The Triton kernel of `dfim.engine.inference.triton_sampler` (which explains it). This module imports
Triton at the top, so only `triton_kernels.load` imports it, on first use on a GPU machine."""

import triton
import triton.language as tl


@triton.jit
def sample_rows(logits_ptr, u_ptr, mode_ptr, entropy_ptr, lse_ptr, sampled_ptr, n_vocab, row_stride,
                BLOCK: tl.constexpr, SAMPLE: tl.constexpr):  # fmt: skip
    """One row of processed logits -> its mode (the first index of the largest logit, as torch.argmax), its
    entropy in nats, its log-normaliser, and (SAMPLE) the token the inverse CDF draws at u * total: three
    passes over the row, nothing of size V written."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    lanes = tl.arange(0, BLOCK)
    # Pass 1: each lane's largest logit and where it first occurs.
    lane_max = tl.full([BLOCK], -float("inf"), tl.float32)
    lane_idx = tl.full([BLOCK], 0, tl.int32)
    for start in range(0, n_vocab, BLOCK):
        idx = start + lanes
        x = tl.load(base + idx, mask=idx < n_vocab, other=-float("inf")).to(tl.float32)
        better = x > lane_max  # strictly: a lane keeps its earliest index on a tie
        lane_idx = tl.where(better, idx, lane_idx)
        lane_max = tl.where(better, x, lane_max)
    top = tl.max(lane_max, axis=0)
    mode = tl.min(tl.where(lane_max == top, lane_idx, n_vocab), axis=0)  # a row of -inf: every lane, token 0
    # Pass 2: the normaliser A = sum exp(x - top) and B = sum exp(x - top) (x - top); H = log A - B / A.
    total = tl.zeros([BLOCK], tl.float32)
    moment = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_vocab, BLOCK):
        idx = start + lanes
        x = tl.load(base + idx, mask=idx < n_vocab, other=-float("inf")).to(tl.float32)
        e = tl.exp(x - top)
        total += e
        moment += tl.where(e > 0, e * (x - top), 0.0)  # a masked token (-inf) adds nothing, not 0 * -inf
    a = tl.sum(total, axis=0)
    tl.store(mode_ptr + row, mode)
    tl.store(entropy_ptr + row, tl.log(a) - tl.sum(moment, axis=0) / a)
    tl.store(lse_ptr + row, top + tl.log(a))
    if SAMPLE:
        # Pass 3: the first token whose running sum exceeds u * A, among tokens of nonzero probability (a
        # scan's rounding must not land the draw on a masked token); none (u * A rounded up to the end):
        # the mode stands in.
        target = tl.load(u_ptr + row) * a
        carry = 0.0
        first = n_vocab
        for start in range(0, n_vocab, BLOCK):
            idx = start + lanes
            x = tl.load(base + idx, mask=idx < n_vocab, other=-float("inf")).to(tl.float32)
            e = tl.exp(x - top)
            running = tl.cumsum(e, axis=0) + carry
            first = tl.minimum(first, tl.min(tl.where((running > target) & (e > 0), idx, n_vocab), axis=0))
            carry = tl.max(running, axis=0)  # the running sum so far (the block's last, to rounding)
        tl.store(sampled_ptr + row, tl.where(first < n_vocab, first, mode))
