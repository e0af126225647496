"""Attention over the fast path's static KV cache as Triton kernels, for inference on CUDA.

Why: the fast path attends a static slice [lo, hi) of each layer's cache so that one CUDA graph serves every
context length in a bucket, and hides what a query must not see with a boolean mask. With a mask, PyTorch's
SDPA cannot take its flash kernel on the sliding layers (the memory-efficient one runs), and on the full
layers (head_dim 512) cuDNN's flash kernel spreads a few dozen query rows over as few blocks: at a typing
fill's 64 canvas rows over 1,280 keys it took 0.32 ms a full layer, for a few microseconds of arithmetic
(docs/gpu.md). Building and expanding the masks and the layout copies around SDPA cost more kernels.

Here there is no mask tensor: each query position carries two key intervals, [lo1, hi1) and [lo2, hi2)
(`bounds`, [T, 4] int32, computed once a pass per layer kind), which say every mask the fast path needs:
a causal context row sees [its position - window + 1, position]; a canvas row sees the context and its own
canvas row's keys. `attend_keys` folds the query heads that share a KV head into its rows (one read of a key
block serves all of them), runs an online softmax in fp32 over the key blocks some row can see, and, when
there are too few (head, value slice, row block) programs to fill the GPU, splits the keys too;
`combine_splits` then merges the splits' partial sums (flash-decoding). The output is written as [T, Hq * D], the layout the
output projection reads, so no transpose follows.

Triton is imported on first use only: the CPU path never needs it (`available()` is False without it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from dfim.engine.model import triton_kernels

# The most programs the keys' splits may bring a launch to (about one per SM of an H100/H200: with more, a
# full layer's splits each ran a few key blocks and merging them cost more than they saved), and the fewest
# keys a split is worth.
TARGET_PROGRAMS = 132
MIN_SPLIT_KEYS = 128


KERNELS = "dfim.engine.model.triton_attention_kernels"


def available() -> bool:
    """Whether the kernels can run here (Triton imports)."""
    return triton_kernels.load(KERNELS) is not None


class Tiles(NamedTuple):
    """How `attend` splits its work: query rows a program, keys a step, warps, pipeline stages, the value
    dimensions a program writes (None: all of them; fewer lets a wide head take more rows a program), and
    how many ways the keys are split (None: until about TARGET_PROGRAMS programs run)."""

    block_m: int
    block_n: int
    warps: int = 4
    stages: int = 2
    block_dv: int | None = None
    splits: int | None = None


def blocks_for(head_dim: int, rows: int, exact: bool = False) -> Tiles:
    """The tiles for `rows` folded query rows. From a sweep of one layer's attention in a pass of the 26B
    shape on an H200 (`bench_attention_gpu.py --sweep`, docs/gpu.md): a 512-wide head, 128 rows by 32 keys
    over 8 warps, each program writing half the value's dimensions (229 us a full layer at a 256-token canvas
    against 254 with 32 unsliced rows and 323 with 16; 77 against 86 at two 32-token rows; the scores are
    computed once a slice, but each block of rows reads its KV head from L2 a quarter as often); fp32 keeps
    32 unsliced rows (a 128-row fp32 query tile alone is 256 KB); a 256-wide head, 128 rows by 64 keys over
    8 warps for a canvas of 256 tokens (50 us against 59) and 64 rows by 32 keys for the server's two
    32-token rows (18 against 20).
    A few rows (an AR token, a few typed tokens) keep 16 rows a program. `exact` (fp32 inputs, the fp32
    check's): 128 rows by 64 keys of a 256-wide head would need ~295 KB of shared memory, past an H200's
    227 KB, so fp32 keeps the 64 by 64 it used before (213 KB)."""
    if rows <= 16:
        return Tiles(16, 32) if head_dim >= 512 else Tiles(16, 64)
    if head_dim >= 512:
        return Tiles(32, 32) if exact else Tiles(128, 32, warps=8, block_dv=head_dim // 2)
    if rows <= 256:
        return Tiles(64, 32, stages=3)
    return Tiles(64, 64) if exact else Tiles(128, 64, warps=8)


def split_count(programs: int, keys: int) -> int:
    """How many ways to split `keys` keys over a launch of `programs` (head, value slice, row block)
    programs: doubled while the launch stays within TARGET_PROGRAMS and a split keeps MIN_SPLIT_KEYS keys,
    at most 16. From a sweep of fixed splits at the 26B shape on an H200 (`bench_attention_gpu.py --sweep`):
    a full layer at a 256-token canvas 178 us with 2 against 214 with 8, and 54 against 74 us with 8
    against 16 at two 32-token rows; the sliding layers' times barely move between 2 and 8."""
    splits = 1
    while splits < 16 and programs * splits * 2 <= TARGET_PROGRAMS and keys / (2 * splits) >= MIN_SPLIT_KEYS:
        splits *= 2
    return splits


def interval_mask(bounds: Tensor, lo: int, hi: int) -> Tensor:
    """The boolean mask [T, hi - lo] `bounds` [T, 4] says over keys [lo, hi) (True = attend): what the
    kernel computes, for SDPA where the kernel does not run."""
    keys = torch.arange(lo, hi, device=bounds.device)[None, :]
    b = bounds.long()
    return ((keys >= b[:, 0:1]) & (keys < b[:, 1:2])) | ((keys >= b[:, 2:3]) & (keys < b[:, 3:4]))


def attend(
    q: Tensor,
    cache_k: Tensor,
    cache_v: Tensor,
    lo: int,
    hi: int,
    bounds: Tensor,
    tiles: Tiles | None = None,
) -> Tensor:
    """Attention of q [1, Hq, T, D] over the keys/values [lo, hi) of cache_k/cache_v [1, Hkv, S, D] (each
    query row sees the keys its row of `bounds` [T, 4] int32 allows) -> [1, T, Hq * D] in q's dtype.
    `tiles` overrides `blocks_for` (`bench_attention_gpu.py` sweeps them)."""
    triton, kernels = triton_kernels.require(KERNELS)
    if (
        q.shape[0] != 1
        or not (cache_k.is_contiguous() and cache_v.is_contiguous())
        or cache_k.shape != cache_v.shape
    ):
        raise ValueError("attend reads batch 1 over contiguous caches of one shape")
    _, hq, t, d = q.shape
    hkv = cache_k.shape[1]
    groups = hq // hkv
    q = q.contiguous()
    bounds = bounds.to(torch.int32).contiguous()
    out = torch.empty(1, t, hq * d, dtype=q.dtype, device=q.device)
    rows = groups * t
    if rows == 0:
        return out
    exact = q.dtype == torch.float32
    block_m, block_n, warps, stages, block_dv, fixed_splits = tiles or blocks_for(d, rows, exact)
    block_dv = block_dv or d
    if block_dv < d and (block_dv < 16 or d % block_dv):  # a slice is a product's operand: 16 or more
        raise ValueError(f"value slices of {block_dv} (at least 16) must divide head_dim {d}")
    slices = d // block_dv
    programs = hkv * slices * triton.cdiv(rows, block_m)
    keys = max(hi - lo, 1)
    splits = fixed_splits or split_count(programs, keys)
    per_split = triton.cdiv(triton.cdiv(keys, splits), block_n) * block_n
    part = stats = out  # unused pointers when the keys are not split
    if splits > 1:
        part = torch.empty(splits, hkv, rows, d, dtype=torch.float32, device=q.device)
        stats = torch.empty(splits, hkv, rows, 2, dtype=torch.float32, device=q.device)
    kernels.attend_keys[(hkv * slices, triton.cdiv(rows, block_m), splits)](
        q, cache_k, cache_v, bounds, out, part, stats, t, groups, lo, hi, per_split, cache_k.stride(1),
        out.stride(1), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=splits > 1, EXACT=exact,
        BLOCK_DV=block_dv, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if splits > 1:
        kernels.combine_splits[(hkv, rows)](
            part, stats, out, t, groups, hkv, out.stride(1), HEAD_DIM=d, SPLITS=splits, num_warps=4
        )
    return out


def store_kv(cache_k: Tensor, cache_v: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    """cache_k[:, :, slots] = k and cache_v[:, :, slots] = v (caches [1, Hkv, S, D], k and v [1, Hkv, T, D],
    slots [T]) in one launch, where the two index assignments take two."""
    if not all(t.is_contiguous() for t in (cache_k, cache_v, k, v)) or k.shape != v.shape:
        cache_k[:, :, slots] = k
        cache_v[:, :, slots] = v
        return
    triton, kernels = triton_kernels.require(KERNELS)
    _, hkv, t, d = k.shape
    if t:
        kernels.store_rows[(t, hkv)](
            k, v, cache_k, cache_v, slots.contiguous(), t, cache_k.shape[2], d,
            BLOCK_D=triton.next_power_of_2(d), num_warps=1 if d <= 256 else 2,
        )  # fmt: skip


# (query heads, KV heads, head dim) of both layer kinds of the 26B-A4B shape and a small one
DEFAULT_HEADS = ((4, 2, 256), (8, 1, 512), (4, 4, 64))


def self_test(
    device: torch.device | str,
    dtype: torch.dtype,
    heads_of: Sequence[tuple[int, int, int]] = DEFAULT_HEADS,
    tiles: Tiles | None = None,
) -> float:
    """The worst relative error (norm of the difference over the norm) of `attend` against SDPA with the
    mask `interval_mask` says, for each (query heads, KV heads, head dim) of `heads_of` at 1, 7, 40 and 300 query
    positions (every block size `blocks_for` picks), split and unsplit keys, a causal window and a second
    interval; and `store_kv` against the index assignments it replaces (any difference: inf). A shape the
    kernel cannot build raises. `tiles`: those instead of `blocks_for`'s (the tests check other tiles)."""
    import torch.nn.functional as F

    g = torch.Generator(device=device).manual_seed(0)
    worst = 0.0
    lengths = ((1, 600), (7, 300), (40, 300), (300, 320))
    cases = [(h, kv, d, t, keys) for h, kv, d in heads_of for t, keys in lengths]
    for heads, kv_heads, head_dim, t, keys in cases:
        q = torch.randn(1, heads, t, head_dim, generator=g, device=device).to(dtype)
        k, v = (
            torch.randn(1, kv_heads, keys + 8, head_dim, generator=g, device=device).to(dtype) for _ in "kv"
        )
        pos = torch.arange(keys - t, keys, device=device)
        tail = torch.full_like(pos, keys - 2)
        bounds = torch.stack([(pos - 200).clamp(min=0), pos - 1, tail, tail + 2], dim=1).int()
        new_k, new_v = (
            torch.randn(1, kv_heads, t, head_dim, generator=g, device=device).to(dtype) for _ in "kv"
        )
        slots = torch.randperm(keys, generator=g, device=device)[:t]
        want_k, want_v = k.clone(), v.clone()
        want_k[:, :, slots], want_v[:, :, slots] = new_k, new_v
        store_kv(k, v, new_k, new_v, slots)
        if not (torch.equal(k, want_k) and torch.equal(v, want_v)):
            return float("inf")
        got = attend(q, k, v, 0, keys, bounds, tiles).float()
        mask = interval_mask(bounds, 0, keys)[None, None]
        groups = heads // kv_heads
        ref_k, ref_v = (x[:, :, :keys].repeat_interleave(groups, dim=1).float() for x in (k, v))
        want = F.scaled_dot_product_attention(q.float(), ref_k, ref_v, attn_mask=mask, scale=1.0)
        want = want.transpose(1, 2).reshape(1, t, heads * head_dim)
        worst = max(worst, float((got - want).norm() / want.norm()))
    return worst
