"""The Triton kernels of `dfim.engine.inference.triton_sampler` (which explains them). This module imports
Triton at the top, so only `triton_kernels.load` imports it, on first use on a GPU machine."""

import triton
import triton.language as tl


@triton.jit
def chunk_stats(logits_ptr, stats_ptr, first_ptr, n_vocab, row_stride, n_chunks, BLOCK: tl.constexpr):
    """One chunk of BLOCK logits of one row -> its largest logit m and where that first occurs, A = sum
    exp(x - m) and B = sum exp(x - m) (x - m): one read, a program per (row, chunk), so a few rows still fill
    the card."""
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    idx = chunk * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * row_stride + idx, mask=idx < n_vocab, other=-float("inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    first = tl.min(tl.where(x == m, idx, n_vocab), axis=0)  # a chunk of -inf: its first token
    e = tl.where(x > -float("inf"), tl.exp(x - m), 0.0)  # a masked token adds nothing (and no 0 * -inf)
    at = (row * n_chunks + chunk) * 3
    tl.store(stats_ptr + at, m)
    tl.store(stats_ptr + at + 1, tl.sum(e, axis=0))
    tl.store(stats_ptr + at + 2, tl.sum(tl.where(e > 0, e * (x - m), 0.0), axis=0))
    tl.store(first_ptr + row * n_chunks + chunk, first)


@triton.jit
def combine_rows(logits_ptr, u_ptr, stats_ptr, first_ptr, mode_ptr, entropy_ptr, lse_ptr, sampled_ptr, n_vocab,
                 row_stride, n_chunks, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                 SAMPLE: tl.constexpr):  # fmt: skip
    """One row's chunks -> its mode (the first index of the largest logit, as torch.argmax), entropy
    log A - B / A and log-normaliser over the row's top logit, and (SAMPLE) the inverse CDF's token at
    u * A: the chunk where the running sum passes it, then the first token of nonzero probability there."""
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS)
    inside = chunks < n_chunks
    at = (row * n_chunks + chunks) * 3
    m = tl.load(stats_ptr + at, mask=inside, other=-float("inf"))
    a = tl.load(stats_ptr + at + 1, mask=inside, other=0.0)
    b = tl.load(stats_ptr + at + 2, mask=inside, other=0.0)
    first = tl.load(first_ptr + row * n_chunks + chunks, mask=inside, other=n_vocab)
    top = tl.max(m, axis=0)
    mode = tl.min(tl.where(inside & (m == top), first, n_vocab), axis=0)  # the first chunk holding the top
    weight = tl.where(a > 0, a * tl.exp(m - top), 0.0)  # each chunk's share of A
    total = tl.sum(weight, axis=0)
    moment = tl.sum(tl.where(a > 0, tl.exp(m - top) * (b + a * (m - top)), 0.0), axis=0)
    tl.store(mode_ptr + row, mode)
    tl.store(entropy_ptr + row, tl.log(total) - moment / total)
    tl.store(lse_ptr + row, top + tl.log(total))
    if SAMPLE:
        target = tl.load(u_ptr + row) * total
        running = tl.cumsum(weight, axis=0)
        pick = tl.min(tl.where((running > target) & (weight > 0), chunks, CHUNKS), axis=0)
        before = tl.sum(tl.where(chunks < pick, weight, 0.0), axis=0)
        idx = pick * BLOCK + tl.arange(0, BLOCK)
        # no chunk picked (pick == CHUNKS): every index is past the vocabulary, nothing is read
        x = tl.load(logits_ptr + row * row_stride + idx, mask=idx < n_vocab, other=-float("inf")).to(
            tl.float32
        )
        e = tl.where(x > -float("inf"), tl.exp(x - top), 0.0)
        passed = (tl.cumsum(e, axis=0) + before > target) & (e > 0)
        token = tl.min(tl.where(passed, idx, n_vocab), axis=0)
        # none (u * A rounded up past the chunks' sums): the mode stands in, as in the reference
        tl.store(sampled_ptr + row, tl.where(token < n_vocab, token, mode))
