"""The mixture of experts as two Triton kernels, for inference on CUDA.

Why: at batch 1 a denoising pass of the 26B-A4B shape routes its canvas tokens to most of the 128 experts,
so a pass reads nearly every expert weight and the experts are bandwidth-bound (docs/gpu.md, "Where a
step's time goes": 22.5 of a 46 ms step, the grouped GEMM alone 18.0 against a 13.6 ms floor). The grouped
path (`experts.moe_grouped`) also spends 4.5 ms on gathering, activation and scattering between its two
GEMMs, and on an H200 with torch 2.11 its GEMM cannot be captured in a CUDA graph at all, so the padded
fallback (every expert over every token) runs there.

Here the token-expert pairs are sorted by expert once (`sort_pairs`: one program for a few pairs, one per expert
for many, no host sync), then:

- `gate_up_act`: one program per (expert with pairs, tile of the intermediate size) reads its tile of the gate and
  up rows once, multiplies the expert's tokens (gathered through the sort, no copy) and writes
  `gelu(gate) * up` for them: the activation never goes to memory between the products.
- `down_weighted`: one program per (expert with pairs, tile of the hidden size) multiplies those activations by
  the down projection and by each pair's routing weight, and writes each pair's row in the pairs'
  original order, so summing a token's k rows (`sum_pairs`, one small kernel) gives the layer's output.

Both loop over an expert's tokens in blocks of `Tiles.block_m` on the device, so nothing depends on the host
knowing the counts, and a CUDA graph captures the whole layer. Their grids cover min(experts, pairs) experts,
the p-th program taking the p-th expert that has pairs (`sort_pairs` lists them): one token's decode touches
k of the experts, and a grid over all of them launched ~16x the programs, nearly all with nothing to do.
Products accumulate in fp32; the activations are rounded once, to the products' input dtype (x's, or float16
for FP8 weights), as the reference rounds its GEMM outputs.

`route` is the router's softmax, top-k and renormalisation in one kernel (about eight in PyTorch).

Triton is imported on first use only: the CPU path never needs it (`available()` is False without it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dfim.engine.model import triton_kernels

KERNELS = "dfim.engine.model.triton_moe_kernels"
# The most token-expert pairs `sort_pairs` sorts in one program: a 1,024-token encode chunk at top-8.
MAX_SORTED_PAIRS = 8192
# From this many pairs the sort runs one program per expert (`sort_pairs_by_expert`); below it one program
# sorts them all (an AR token's 8 pairs need no 128 programs).
SPREAD_PAIRS = 256


def available() -> bool:
    """Whether the kernels can run here (Triton imports)."""
    return triton_kernels.load(KERNELS) is not None


@dataclass(frozen=True)
class Tiles:
    """Tile sizes and launch settings of both kernels (`scripts/bench_moe_gpu.py` compares others)."""

    block_m: int = 16  # an expert's pairs per block: at batch 1 most experts get fewer than 16
    block_n: int = 64  # output columns per program
    block_k: int = 64  # reduction columns per step
    num_warps: int = 4
    num_stages: int = 3  # loads in flight: the kernels are bound by reading the weights
    # W8A8 or 16-bit weights: the weights are the products' first operand (`gate_up_act_first`), block_n
    # their rows, so from 64 columns Hopper's warpgroup MMA runs whatever an expert's pairs
    weights_first: bool = False
    # the down product's own tiles (None: these); its reduction is short (the experts' intermediate size),
    # its output wide. W8A8 with the weights first: its block_k divides block_n here, the width of the
    # activations' scale groups; with the pairs first its block_k is ignored (a step is one group)
    down: Tiles | None = None
    # W8A8 with the weights first only. promote: each reduction step's FP8 sum is added in fp32 (Hopper's
    # MMA accumulates with fewer bits); off, the MMA accumulates the whole reduction and runs asynchronously
    promote: bool = True
    # the experts' activations quantized one scale a pair (a pass of `quantize_rows` between the kernels)
    # instead of one a pair and block_n columns: the down product then scales once, after its sum
    row_scale: bool = False
    # with the weights first: the down product's output tiles a program (set on `down`); its reduction is
    # short, so one loop over (tile, step) keeps loads in flight across tiles
    column_tiles: int = 1

    def activation_group(self, inter: int) -> int:
        """W8A8: the width of the experts' activations' scale groups (`moe_w8a8_reference`'s group)."""
        return inter if self.row_scale and self.weights_first else self.block_n


def tiles_for(pairs: int, experts: int, fp8: bool = False, fp8_act: bool = False) -> Tiles:
    """The tiles for `pairs` token-expert pairs over `experts` experts: an expert's pairs in one block where
    they fit, so its weights are read once (an H200 at the 26B shape, `scripts/bench_moe_gpu.py --sweep`:
    32 and 64 tokens 0.36 / 0.41 ms a layer with 16 rows, 256 tokens 0.45 ms with 32, 512 tokens 0.49 ms
    with 64). FP8 weights take twice the reduction a step where an expert's pairs are few (a tile of the
    same bytes: 0.203 / 0.231 ms at 32 / 64 tokens against 0.217 / 0.238). FP8 activations too (`fp8_act`,
    W8A8) put the weights first, 128 output columns a program, with 16 or 32 pairs, sums the whole reduction
    in the MMA and quantizes the activations one scale a pair, as vLLM's FP8 experts do; a 256-token canvas's
    down product takes 64 columns a tile and four tiles a program (0.189 / 0.232 ms at 32 / 256 tokens, where
    each step's sum promoted to fp32 and a scale a 128-column group took 0.196 / 0.262 in the same run;
    docs/bench/gpu-w8a8-rows-2026-11-29)."""
    per_expert = pairs / max(experts, 1)
    if fp8_act:
        w8a8 = dict(block_n=128, block_k=128, weights_first=True, promote=False, row_scale=True)
        if per_expert <= 8:
            return Tiles(block_m=16, **w8a8, down=Tiles(16, 64, 128))
        return Tiles(block_m=32, **w8a8, down=Tiles(32, 64, 128, num_stages=4, column_tiles=4))
    if per_expert <= 8:
        return Tiles(block_m=16, block_k=256 if fp8 else 128)
    if per_expert <= 24:
        return Tiles(block_m=32, block_k=128)
    return Tiles(block_m=64, block_k=64)


def sort_pairs(index: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """index [N, k] -> (the pair ids sorted by expert, stable; the token of each; offs [E]: each expert's end in
    that order; active [min(E, N*k)] int32: the experts with pairs, ascending, then -1) in one kernel
    (`experts._sort_by_expert`, `// k` and a compaction are about ten): one program for a few pairs, one per
    expert for many (SPREAD_PAIRS)."""
    n, k = index.shape
    if n * k > MAX_SORTED_PAIRS:  # one program holds every pair: past this, torch's sort (several kernels)
        from dfim.engine.model.experts import _sort_by_expert

        order, _, _, offs = _sort_by_expert(index, num_experts)
        # as many pairs as this touch every expert or nearly: all listed (an empty one finds no pairs)
        active = torch.arange(num_experts, dtype=torch.int32, device=index.device)
        return order, order // k, offs, active
    triton, kernels = triton_kernels.require(KERNELS)
    flat = index.reshape(-1).contiguous()
    order = torch.empty(n * k, dtype=torch.long, device=index.device)
    tokens = torch.empty_like(order)
    offs = torch.empty(num_experts, dtype=torch.int32, device=index.device)
    active = torch.empty(min(num_experts, n * k), dtype=torch.int32, device=index.device)
    pairs = max(triton.next_power_of_2(n * k), 16)
    experts = max(triton.next_power_of_2(num_experts), 16)
    if n * k >= SPREAD_PAIRS:
        kernels.sort_pairs_by_expert[(num_experts,)](
            flat, order, tokens, offs, active, n * k, k, num_experts, active.numel(), PAIRS=pairs,
            EXPERTS=experts, num_warps=8 if pairs >= 4096 else 4,  # 4 warps spill registers at 8,192 pairs
        )  # fmt: skip
        return order, tokens, offs, active
    kernels.sort_pairs[(1,)](
        flat, order, tokens, offs, active, n * k, k, num_experts, active.numel(), PAIRS=pairs,
        EXPERTS=experts, num_warps=8 if pairs >= 2048 else 4,
    )  # fmt: skip
    return order, tokens, offs, active


def quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [N, H] -> (e4m3 [N, H], float32 [N]), one scale a row (`experts_fp8.quantize_rows`' arithmetic) in one
    kernel where PyTorch takes about five."""
    triton, kernels = triton_kernels.require(KERNELS)
    if x.stride(-1) != 1:
        x = x.contiguous()
    n, hidden = x.shape
    q = torch.empty(n, hidden, dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(n, dtype=torch.float32, device=x.device)
    if n:
        # ROUND: only the interpreter runs on the CPU, and its conversion to e4m3 rounds wrongly
        kernels.quantize_rows[(n,)](
            x, q, scale, hidden, x.stride(0), BLOCK=triton.next_power_of_2(hidden), ROUND=x.device.type == "cpu",
            num_warps=4,
        )  # fmt: skip
    return q, scale


def route(scores: Tensor, top_k: int, expert_scale: Tensor) -> tuple[Tensor, Tensor]:
    """`experts.Router`'s routing of scores [N, E] in one kernel -> weights [N, k] fp32, index [N, k]."""
    triton, kernels = triton_kernels.require(KERNELS)
    n, e = scores.shape
    scores = scores.contiguous()
    weights = torch.empty(n, top_k, dtype=torch.float32, device=scores.device)
    index = torch.empty(n, top_k, dtype=torch.long, device=scores.device)
    if n:
        kernels.route_rows[(n,)](
            scores, expert_scale.contiguous(), weights, index, e, K=top_k,
            BLOCK_E=max(triton.next_power_of_2(e), 16), BLOCK_K=max(triton.next_power_of_2(top_k), 2), num_warps=1,
        )  # fmt: skip
    return weights, index


def moe_triton(
    x: Tensor,
    weights: Tensor,
    index: Tensor,
    gate_up: Tensor,
    down: Tensor,
    tiles: Tiles | None = None,
    gate_up_scale: Tensor | None = None,
    down_scale: Tensor | None = None,
    products: torch.dtype | None = None,
) -> Tensor:
    """The experts' output for x [N, H]: weights/index [N, k], gate_up [E, 2I, H], down [E, H, I] (any
    strides; a unit last one reads fastest); the same contract as the other kernels of `experts.GPU_KERNELS`.
    With the scales (gate_up_scale [E, 2I], down_scale [E, H], float32) the weights are FP8 (e4m3), one
    scale per expert and output channel (`experts_fp8.Fp8Experts`), and stay FP8 in memory: they are
    widened to the products' dtype tile by tile, so a pass reads half the bytes (W8A16).

    `products`: the dtype of the products' inputs (None: x's); the output keeps x's dtype. float16 suits FP8
    weights: Hopper widens e4m3 to float16 in one instruction a pair, where bfloat16 takes one more a value
    (the widening, not the bytes, then bounds the kernel), every e4m3 value is exact in float16, and its
    mantissa is longer than bfloat16's. Activations beyond float16's +-65504 saturate there.
    `products=torch.float8_e4m3fn` with FP8 weights (W8A8): activations quantized on the fly, x one scale a
    token row (`quantize_rows`), the experts' activations one a pair (`tiles.row_scale`, the default) or one
    a pair and `tiles.block_n` columns (the down product's reduction step then takes that width): the
    arithmetic of `experts_fp8.moe_w8a8_reference`.
    With `tiles.weights_first` (the default, `tiles_for`) the weights are the products' first operand, so they
    run on Hopper's FP8 tensor cores whatever an expert's pairs; with the pairs first, only from 64 rows."""
    scaled = gate_up_scale is not None and down_scale is not None
    if products is not None and products != gate_up.dtype and not scaled:
        raise ValueError(f"products in {products} need FP8 weights (these are {gate_up.dtype})")
    fp8_act = products == torch.float8_e4m3fn
    if fp8_act and not scaled:
        raise ValueError("FP8 activations (products in float8_e4m3fn) need FP8 weights with their scales")
    triton, kernels = triton_kernels.require(KERNELS)
    n, k = index.shape
    e, two_i, hidden = gate_up.shape
    inter = two_i // 2
    out_dtype = x.dtype
    if n * k == 0:
        return x.new_zeros(x.shape)
    x_scale = None
    if fp8_act:
        x, x_scale = quantize_rows(x)
    elif products == torch.float16 and x.dtype != products:
        # once here, not in every program's loop; clamped after the cast (bfloat16 cannot hold 65504)
        x = x.to(products).clamp_(-65504.0, 65504.0)
    elif products is not None and x.dtype != products:
        x = x.to(products)
    if x.stride(-1) != 1:
        x = x.contiguous()
    order, tokens, offs, active = sort_pairs(index, e)
    sixteen_bit = not scaled and x.dtype in (torch.float16, torch.bfloat16)
    tiles = tiles or tiles_for(n * k, e, fp8=scaled, fp8_act=fp8_act)
    dt = tiles.down or tiles
    weights_first = tiles.weights_first
    if weights_first and not (fp8_act or sixteen_bit):
        raise ValueError(f"the weights go first for W8A8 or 16-bit weights, not {gate_up.dtype} x {x.dtype}")
    if not weights_first and dt.column_tiles > 1:
        raise ValueError("column_tiles are for the weights first")
    if not (weights_first and fp8_act) and (tiles.row_scale or not tiles.promote):
        raise ValueError("row_scale and promote=False are for W8A8 with the weights first")
    if weights_first and fp8_act and not tiles.row_scale and tiles.block_n % dt.block_k:
        raise ValueError(
            f"the down product's steps of {dt.block_k} must divide the scale groups of {tiles.block_n}"
        )
    row_scale = weights_first and tiles.row_scale
    # row scales: the activations go out in fp32 (L2-sized) for `quantize_rows`, since a 16-bit copy would
    # round twice on the way to e4m3
    h = torch.empty(n * k, inter, dtype=torch.float32 if row_scale else x.dtype, device=x.device)
    groups = triton.cdiv(inter, tiles.block_n)
    grouped = fp8_act and not row_scale  # one scale a pair and group, written by the gate/up kernel
    h_scale = torch.empty(n * k, groups, dtype=torch.float32, device=x.device) if grouped else h
    grid_up = (active.numel(), groups)
    grid_down = (active.numel(), triton.cdiv(triton.cdiv(hidden, dt.block_n), dt.column_tiles))
    launch = dict(
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, num_warps=tiles.num_warps, num_stages=tiles.num_stages
    )
    down_launch = dict(
        BLOCK_M=dt.block_m, BLOCK_N=dt.block_n, num_warps=dt.num_warps, num_stages=dt.num_stages
    )
    out = torch.empty(n * k, hidden, dtype=torch.float32, device=x.device)
    if weights_first:
        gu_scale = gate_up_scale.float().contiguous() if fp8_act else x  # unused pointers without FP8
        d_scale = down_scale.float().contiguous() if fp8_act else x
        promote = fp8_act and tiles.promote
        # ROUND: only the interpreter runs on the CPU
        kernels.gate_up_act_first[grid_up](
            x, gate_up, gu_scale, tokens, active, offs, h, hidden, inter, x.stride(0), *gate_up.stride(),
            h.stride(0), x if x_scale is None else x_scale, h_scale, BLOCK_K=tiles.block_k,
            ROUND=x.device.type == "cpu", QUANT=grouped, PROMOTE=promote, FP8=fp8_act, **launch,
        )  # fmt: skip
        if row_scale:
            h, h_scale = quantize_rows(h)
        kernels.down_weighted_first[grid_down](
            h, down, d_scale, order, weights.reshape(-1).float(), active, offs, out, inter, hidden, h.stride(0),
            *down.stride(), out.stride(0), h_scale, BLOCK_K=dt.block_k, GROUP=tiles.block_n, ROW_SCALE=row_scale,
            PROMOTE=promote, COLUMN_TILES=dt.column_tiles, FP8=fp8_act, **down_launch,
        )  # fmt: skip
    else:
        flags = dict(EXACT=x.dtype == torch.float32, SCALED=scaled, FP8_ACT=fp8_act)
        # ROUND: only the interpreter runs on the CPU
        kernels.gate_up_act[grid_up](
            x, gate_up, gate_up_scale.float().contiguous() if scaled else x, tokens, active, offs, h, hidden,
            inter, x.stride(0), *gate_up.stride(), h.stride(0), x if x_scale is None else x_scale, h_scale,
            **launch, **flags, BLOCK_K=tiles.block_k, ROUND=x.device.type == "cpu",
        )  # fmt: skip
        kernels.down_weighted[grid_down](
            h, down, down_scale.float().contiguous() if scaled else h, order, weights.reshape(-1).float(), active,
            offs, out, inter, hidden, h.stride(0), *down.stride(), out.stride(0), h_scale, **down_launch, **flags,
            BLOCK_K=tiles.block_n if fp8_act else dt.block_k,  # W8A8: a step reads one group's scales
        )  # fmt: skip
    summed = torch.empty(n, hidden, dtype=out_dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(hidden))
    kernels.sum_pairs[(n, triton.cdiv(hidden, block))](
        out, summed, hidden, K=k, BLOCK=block
    )  # a sum and a cast
    return summed
