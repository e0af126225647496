"""One layer's attention at the 26B-A4B shape on a GPU, as a denoising pass meets it: the Triton kernel
(`triton_attention.attend`) at its default tiles and, with `--sweep`, at others, against the reference (SDPA
in fp32 with the mask the bounds say) and a floor.

Both layer kinds: sliding (16 query heads over 8 KV heads of 256, a 1,024-key window) and full (16 over 2
of 512, every key), for a 256-token canvas and the server's two 32-token rows, after a 4,096-token context:
the keys and bounds `FastDiffusionGemma` builds for that pass. The floor is the larger of the keys' and
values' bytes read once over the bandwidth and the products' arithmetic over the tensor cores' peak.

    source scripts/device_env.sh; python3 scripts/bench_attention_gpu.py [--sweep] [--flex] --out $OUT/bench_attention_gpu.txt

`--flex` also times PyTorch's FlexAttention (compiled, the same intervals as a block mask, GQA), to see
whether a compiled template beats the hand-written kernel at these shapes.

Exit status 1 when a tile's output differs from the reference by more than 2% (relative, bf16).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine.model import triton_attention
from dfim.engine.model.config import RELEASED_26B_A4B

sys.path.insert(0, str(Path(__file__).resolve().parent))  # PYTHONSAFEPATH leaves the scripts' folder out
from bench_moe_gpu import Report, bench_parser, timed  # noqa: E402

CONTEXT, BUCKET = 4096, 256
DEVICE = "cuda"
Tiles = triton_attention.Tiles
# Wide heads also by slices of the value's dimensions (`block_dv`): a smaller accumulator, so more rows a
# program and fewer reads of the keys from L2, for scores computed once a slice. Some tiles fix how many ways
# the keys are split (`splits`): a sliding layer's 1,535 keys over 128 programs leave each a few steps, and
# the split's partial sums (16 MB a layer) go through memory once more.
SWEEP = {
    256: [Tiles(32, 64), Tiles(64, 64), Tiles(64, 64, 8), Tiles(128, 64, 8), Tiles(64, 32, 4, 3),
          Tiles(128, 32, 8), Tiles(128, 64, 8, 2, 128), Tiles(128, 32, 4, 2, 128), Tiles(256, 32, 8, 2, 64),
          Tiles(128, 64, 8, splits=1), Tiles(128, 64, 8, splits=2), Tiles(128, 64, 8, splits=8),
          Tiles(64, 32, 4, 3, splits=8), Tiles(64, 64, 4, 2, splits=8)],
    512: [Tiles(16, 32), Tiles(32, 32), Tiles(32, 32, 8), Tiles(64, 32, 8, 1), Tiles(64, 32, 8, 2),
          Tiles(32, 64, 8, 1), Tiles(64, 16, 8, 2), Tiles(64, 64, 8, 1), Tiles(64, 32, 4, 2, 256),
          Tiles(64, 32, 8, 2, 128), Tiles(128, 32, 8, 2, 128), Tiles(128, 32, 8, 2, 256), Tiles(128, 64, 8, 1, 128),
          Tiles(64, 64, 4, 2, 128), Tiles(128, 32, 8, 2, 256, 2), Tiles(128, 32, 8, 2, 256, 8)],
}  # fmt: skip


def pass_inputs(
    heads: int, kv_heads: int, head_dim: int, sliding: bool, rows: int, length: int
) -> tuple[Tensor, Tensor, Tensor, int, int, Tensor]:
    """q, the caches, the key range and bounds of a decoder pass over `rows` canvases of `length` tokens."""
    window = RELEASED_26B_A4B["sliding_window"]
    tokens = rows * length
    hi = -(-(CONTEXT + tokens) // BUCKET) * BUCKET
    lo = max(0, hi - tokens - BUCKET - window + 1) if sliding else 0
    g = torch.Generator(device=DEVICE).manual_seed(0)
    q = torch.randn(1, heads, tokens, head_dim, generator=g, device=DEVICE) * head_dim**-0.25
    k, v = (
        torch.randn(1, kv_heads, hi, head_dim, generator=g, device=DEVICE) * head_dim**-0.25 for _ in "kv"
    )
    offsets = torch.arange(tokens, device=DEVICE)
    start = CONTEXT + (offsets // length) * length
    context = torch.full_like(offsets, CONTEXT)
    lowest = (context - window + 1).clamp(min=0) if sliding else torch.zeros_like(offsets)
    bounds = torch.stack([lowest, context, start, start + length], dim=1).int()
    bf16 = torch.bfloat16
    return q.to(bf16), k.to(bf16).contiguous(), v.to(bf16).contiguous(), lo, hi, bounds


def reference(q: Tensor, k: Tensor, v: Tensor, lo: int, hi: int, bounds: Tensor) -> Tensor:
    heads, tokens = q.shape[1], q.shape[2]
    groups = heads // k.shape[1]
    mask = triton_attention.interval_mask(bounds, lo, hi)[None, None]
    ref_k, ref_v = (x[:, :, lo:hi].repeat_interleave(groups, dim=1).float() for x in (k, v))
    out = F.scaled_dot_product_attention(q.float(), ref_k, ref_v, attn_mask=mask, scale=1.0)
    return out.transpose(1, 2).reshape(1, tokens, -1)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, lo: int, hi: int, bounds: Tensor) -> Callable[[], Tensor]:
    """FlexAttention over keys [lo, hi) with each query's two intervals as its mask (block-sparse: the blocks
    no query sees are skipped), the KV heads shared by their query heads, scale 1.0."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    lo1, hi1, lo2, hi2 = (bounds[:, i].contiguous() for i in range(4))

    def seen(b, h, q_idx, kv_idx):  # noqa: ANN001 - FlexAttention's mask_mod signature
        key = kv_idx + lo
        return ((key >= lo1[q_idx]) & (key < hi1[q_idx])) | ((key >= lo2[q_idx]) & (key < hi2[q_idx]))

    tokens = q.shape[2]
    mask = create_block_mask(seen, B=None, H=None, Q_LEN=tokens, KV_LEN=hi - lo, device=q.device)
    attend = torch.compile(flex_attention, dynamic=False)
    ks, vs = k[:, :, lo:hi].contiguous(), v[:, :, lo:hi].contiguous()

    def run() -> Tensor:
        out = attend(q, ks, vs, block_mask=mask, scale=1.0, enable_gqa=True)
        return out.transpose(1, 2).reshape(1, tokens, -1)

    return run


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tflops", type=float, default=989.0, help="the card's dense bf16 peak")
    parser.add_argument("--flex", action="store_true", help="also time FlexAttention (compiled)")
    args = parser.parse_args()
    report = Report()
    say = report.say
    c = RELEASED_26B_A4B
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; context {CONTEXT}, bf16")
    failed = False
    kinds = [
        ("sliding", c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], True),
        ("full", c["num_attention_heads"], c["num_global_key_value_heads"], c["global_head_dim"], False),
    ]
    for name, heads, kv_heads, head_dim, sliding in kinds:
        for rows, length in ((1, 256), (2, 32)):
            q, k, v, lo, hi, bounds = pass_inputs(heads, kv_heads, head_dim, sliding, rows, length)
            want = reference(q, k, v, lo, hi, bounds)
            seen = int(triton_attention.interval_mask(bounds, lo, hi).sum())  # query-key pairs attended
            flops = 4 * seen * heads * head_dim
            bytes_read = 2 * kv_heads * (hi - lo) * head_dim * 2
            floor_us = max(bytes_read / (args.bandwidth * 1e12), flops / (args.tflops * 1e12)) * 1e6
            say(f"\n{name} layer, {rows} x {length} tokens over keys [{lo}, {hi}): floor {floor_us:.1f} us")
            tiles: list[Tiles | None] = [None, *(SWEEP[head_dim] if args.sweep else [])]
            best = (float("inf"), "")
            for tile in tiles:
                label = "default" if tile is None else "{}x{} w{} s{}".format(*tile[:4])
                if tile is not None and tile.block_dv:
                    label += f" dv{tile.block_dv}"
                if tile is not None and tile.splits:
                    label += f" keys/{tile.splits}"
                fn = functools.partial(triton_attention.attend, q, k, v, lo, hi, bounds, tile)
                try:
                    err = float((fn().float() - want).norm() / want.norm())
                    ms, _ = timed(fn, graphs=True, repeat=50)
                except Exception as exc:  # noqa: BLE001 - a tile that does not build: the next one
                    say(f"  {label:16s} failed: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                ok = err <= 2e-2
                failed |= not ok
                say(f"  {label:16s} {1000 * ms:8.1f} us, {100 * floor_us / (1000 * ms):5.1f}% of the floor, "
                    f"error {err:.1e}{'' if ok else '  FAILED'}")  # fmt: skip
                if ok and ms < best[0]:
                    best = (ms, label)
            if args.flex:
                try:
                    fn = flex_attend(q, k, v, lo, hi, bounds)
                    err = float((fn().float() - want).norm() / want.norm())
                    ms, graphed = timed(fn, graphs=True, repeat=50)
                    say(f"  {'flex_attention':16s} {1000 * ms:8.1f} us, {100 * floor_us / (1000 * ms):5.1f}% of the "
                        f"floor, error {err:.1e} ({'graph' if graphed else 'eager'})")  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - FlexAttention may not take a shape: say so, go on
                    say(f"  {'flex_attention':16s} failed: {type(exc).__name__}: {str(exc)[:160]}")
            say(f"  best: {best[1]} {1000 * best[0]:.1f} us")
    report.write(args.out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
