"""The experts' Triton kernels (dfim.engine.model.triton_moe) against the per-expert reference: crowded and
empty experts, a token count that is no multiple of a block, strided weights, FP8 weights. They run on CUDA, or on the
CPU under Triton's interpreter where Triton is installed (fp32 and fp16 there: the interpreter's bf16
products are wrong, Triton 3.9); without either (the CPU-only install) those tests skip."""

from __future__ import annotations

import textwrap

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from dfim.engine.model import experts, triton_moe

    device = sys.argv[1]
    dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
    g = torch.Generator().manual_seed(0)
    bad = []
    for dtype in dtypes:
        for n in (1, 5, 37):
            e, hidden, inter, k = 8, 96, 40, 2
            x = torch.randn(n, hidden, generator=g)
            gate_up = torch.randn(e, hidden, 2 * inter, generator=g).transpose(1, 2) * 0.1  # strided
            down = torch.randn(e, hidden, inter, generator=g) * 0.1
            index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)])
            index[: n // 2] = torch.tensor([0, 1])  # crowd two experts, leave others empty
            weights = torch.rand(n, k, generator=g)
            want = experts.moe_gathered(x, weights, index, gate_up, down)
            args = [t.to(device) for t in (x.to(dtype), weights, index, gate_up.to(dtype), down.to(dtype))]
            # the default tiles, and the down product on tiles of its own
            own_down = triton_moe.Tiles(down=triton_moe.Tiles(block_m=32, block_n=32, block_k=16))
            # 16-bit weights as the products' first operand, two down tiles a program (the last one half out)
            first = triton_moe.Tiles(
                block_m=16, block_n=64, block_k=32, weights_first=True,
                down=triton_moe.Tiles(block_m=16, block_n=32, block_k=16, column_tiles=2),
            )  # fmt: skip
            if dtype == torch.float32:
                try:
                    triton_moe.moe_triton(*args, first)
                    bad.append("fp32 weights went first")
                except ValueError:
                    pass
            for tiles in (None, own_down) if dtype == torch.float32 else (None, own_down, first):
                got = triton_moe.moe_triton(*args, tiles).float().cpu()
                err = ((got - want).norm() / want.norm()).item()
                limit = 1e-5 if dtype == torch.float32 else 2e-2
                if not err <= limit:
                    bad.append(f"{dtype} n={n} {tiles}: relative error {err:.2e} > {limit:.0e}")
    # FP8 weights (W8A16): against the same arithmetic over the dequantized weights
    from dfim.engine.model import experts_fp8

    def fp8_case(e, hidden, inter, k, n, dtype):  # random FP8 experts, tokens and their routing, on the device
        fp8 = experts_fp8.quantize_experts(
            torch.randn(e, 2 * inter, hidden, generator=g) * 0.1, torch.randn(e, hidden, inter, generator=g) * 0.1
        )
        fp8 = experts_fp8.Fp8Experts(*(t.to(device) for t in vars(fp8).values()))
        x = torch.randn(n, hidden, generator=g).to(device, dtype)
        index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(device)
        return fp8, x, torch.rand(n, k, generator=g).to(device), index

    for dtype in dtypes[1:]:
        fp8, x, weights, index = fp8_case(8, 96, 40, 2, 21, dtype)
        want = experts_fp8.moe_w8a16_reference(x, weights, index, fp8).float()
        runs = {
            "engine": lambda: experts_fp8.moe_triton_fp8(x, weights, index, fp8),
            "fp16 products": lambda: triton_moe.moe_triton(
                x, weights, index, fp8.gate_up, fp8.down, None, fp8.gate_up_scale, fp8.down_scale, torch.float16
            ),
        }
        for name, run in runs.items():
            got = run().float()
            err = ((got - want).norm() / want.norm()).item()
            if not err <= 2e-2:
                bad.append(f"FP8 weights, {dtype}, {name}: relative error {err:.2e} > 2e-02")
    # FP8 activations too (W8A8): the default tiles (the weights as the products' first operand), and the pairs
    # first in 16 and 64 rows; on a GPU the weights-first and 64-row tiles run on FP8 tensor cores. On the CPU
    # the kernels round to e4m3's grid themselves (the interpreter's conversion rounds wrongly, 124.7 -> 64)
    for dtype in dtypes[1:]:
        e, k, n = 8, 2, 37
        fp8, x, weights, index = fp8_case(e, 96, 200, k, n, dtype)
        pairs_first = [triton_moe.Tiles(block_m=m, block_n=32, block_k=64) for m in (16, 64)]
        # the down product's steps half a scale group; groups wider than gate_up's reduction steps
        own_down = triton_moe.Tiles(
            block_m=16, block_n=64, block_k=64, weights_first=True, down=triton_moe.Tiles(block_n=64, block_k=32)
        )
        wide_groups = triton_moe.Tiles(block_m=16, block_n=128, block_k=64, weights_first=True)
        # one scale a pair, unpromoted sums, the down product two tiles a program (its second one past the
        # output's 96 columns)
        by_rows = triton_moe.Tiles(
            block_m=16, block_n=64, block_k=64, weights_first=True, promote=False, row_scale=True,
            down=triton_moe.Tiles(block_n=32, block_k=64, column_tiles=2),
        )  # fmt: skip
        default = triton_moe.tiles_for(n * k, e, fp8=True, fp8_act=True)
        for tiles in [*pairs_first, own_down, wide_groups, by_rows, default]:
            group = 200 if tiles.row_scale else tiles.block_n
            want = experts_fp8.moe_w8a8_reference(x, weights, index, fp8, group).float()
            args = (fp8.gate_up, fp8.down, tiles, fp8.gate_up_scale, fp8.down_scale, torch.float8_e4m3fn)
            got = triton_moe.moe_triton(x, weights, index, *args).float()
            err = ((got - want).norm() / want.norm()).item()
            # tight enough to see groups of the wrong width (~2e-2); Hopper's FP8 MMA sums with fewer bits
            # (weights first: ~3.5e-3 on an H200, each step's sum added in fp32; 64 pairs first: ~1e-2)
            limit = 5e-3
            if device == "cuda" and (tiles.weights_first or tiles.block_m >= 64):
                limit = 1e-2 if tiles.weights_first else 2e-2
            if not err <= limit:
                bad.append(f"W8A8, {dtype}, {tiles}: relative error {err:.2e} > {limit:.0e}")
        # with the default tiles, an infinity saturates (the row stays finite, as float16 products do) and a NaN
        # stays in its token's row (on CUDA: the interpreter converts a NaN to a finite e4m3 value)
        x[5, 2] = float("inf")
        nan_rows = [3] if device == "cuda" else []
        x[nan_rows, 7] = float("nan")
        finite = triton_moe.moe_triton(x, weights, index, *args).float().isfinite().all(dim=1).tolist()
        if finite != [i not in nan_rows for i in range(n)]:
            bad.append(f"W8A8, {dtype}: a NaN or infinite activation reached the wrong rows")
    # float16 products: an activation past float16's range saturates at 65504 (clamped after the cast: a
    # bfloat16 clamp would round the bound to 65536, which float16 reads as inf); a NaN stays NaN
    small = experts_fp8.quantize_experts(
        torch.randn(8, 80, 96, generator=g) * 1e-3, torch.randn(8, 96, 40, generator=g) * 1e-3
    )  # small weights keep the products themselves within float16's range
    small = experts_fp8.Fp8Experts(*(t.to(device) for t in vars(small).values()))
    x = torch.randn(3, 96, generator=g)
    x[:, 5] = 7e4
    x = x.to(device, torch.bfloat16)
    index = torch.tensor([[0, 1]] * 3, device=device)
    ones = torch.ones(3, 2, device=device)
    args = (small.gate_up, small.down, None, small.gate_up_scale, small.down_scale, torch.float16)
    got = triton_moe.moe_triton(x, ones, index, *args).float()
    want = experts_fp8.moe_w8a16_reference(x.float().clamp(-65504, 65504), ones, index, small).float()
    err = ((got - want).norm() / want.norm()).item()
    if not err <= 2e-2:
        bad.append(f"float16 products past their range: relative error {err:.2e} > 2e-02")
    x[1, 0] = float("nan")
    got = triton_moe.moe_triton(x, ones, index, *args).float()
    if not (bool(got[1].isnan().any()) and bool(got[[0, 2]].isfinite().all())):
        bad.append("float16 products: a NaN activation did not stay NaN in its own row only")
    from dfim.engine.model.fast_check import routing_mismatches

    bad += routing_mismatches(device)  # the router's and the sort's kernels
    print("\\n".join(bad) or "ok")
    """
)


def test_kernels_match_the_reference(kernel_check, kernel_target):
    kernel_check(CHECK, *kernel_target)


def test_an_experts_pairs_fit_one_block_where_they_can():
    from dfim.engine.model import triton_moe

    # a single-line canvas at batch 1: a few pairs an expert, 16-row blocks; a block's canvas: larger ones,
    # so an expert's weights are read once
    assert triton_moe.tiles_for(32 * 8, 128).block_m == 16
    assert triton_moe.tiles_for(256 * 8, 128).block_m == 32
    assert triton_moe.tiles_for(512 * 8, 128).block_m == 64
    # FP8 weights: the same bytes a tile read twice the reduction
    assert (
        triton_moe.tiles_for(32 * 8, 128, fp8=True).block_k == 2 * triton_moe.tiles_for(32 * 8, 128).block_k
    )
    # FP8 activations too: the weights first, at least 64 output columns (the FP8 warpgroup MMA's rows)
    for pairs in (32 * 8, 256 * 8):
        w8a8 = triton_moe.tiles_for(pairs, 128, fp8=True, fp8_act=True)
        assert w8a8.weights_first and w8a8.block_n >= 64
