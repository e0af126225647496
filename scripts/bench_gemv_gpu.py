"""One token's dense products at the 26B-A4B shape on a GPU: the one-row Triton kernel (`triton_gemv`) at
its default tile and, with `--sweep`, at others, against cuBLAS (`F.linear`) and the bandwidth floor.

Each shape runs as an autoregressive token meets it: 30 products in a row, each over its own weight (as
many as the model's layers, so no weight is still in the L2 cache from the call before), captured in one
CUDA graph; the time is the replay's over 30. The MLP's down projection is timed gated (its activation
fused) against cuBLAS after the activation kernel.

    source scripts/device_env.sh; python3 scripts/bench_gemv_gpu.py [--sweep] --out $OUT/bench_gemv_gpu.txt

Exit status 1 when a kernel's output differs from cuBLAS's by more than 1% (relative, bf16).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from dfim.engine.model import triton_gemv, triton_norm
from dfim.engine.model.fast_check import GEMV_26B_SHAPES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # PYTHONSAFEPATH leaves the scripts' folder out
from bench_moe_gpu import Report, bench_parser, every_layer, timed  # noqa: E402

LAYERS = 30
# rows a program x values of a row a step x warps; a block of 4,096 or more reads a whole row at once
# (no loop: every load in flight together); at most 16,384 values a tile (registers)
SWEEP = [
    (n, k, w)
    for n in (1, 2, 4, 8, 16)
    for k in (256, 512, 1024, 2048, 4096, 8192)
    for w in (2, 4, 8)
    if n * k <= 16384 and k // w >= 64
]


def bench_shape(
    n_out: int, n_in: int, gated: bool, sweep: bool, bandwidth: float, say: Callable[[str], None]
) -> tuple[float, float, float, bool]:
    """One shape: (cuBLAS's, the default tile's and the best tile's us a product, whether one failed)."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    weights = [torch.randn(n_out, n_in, device=device, dtype=dtype) * n_in**-0.5 for _ in range(LAYERS)]
    x = torch.randn(1, 1, 2 * n_in if gated else n_in, device=device, dtype=dtype)
    floor_us = n_out * n_in * 2 / (bandwidth * 1e12) * 1e6

    def cublas(w: Tensor) -> Tensor:
        return F.linear(triton_norm.gelu_mul(x) if gated else x, w)

    def ours(w: Tensor, tile: tuple[int | None, int | None, int | None] = (None, None, None)) -> Tensor:
        return triton_gemv.gemv(x, w, gated=gated, block_n=tile[0], block_k=tile[1], warps=tile[2])

    want = cublas(weights[0]).float()
    say(f"\n{n_out} x {n_in}{' gated' if gated else ''}: floor {floor_us:.2f} us at {bandwidth} TB/s")
    block_n, block_k, warps = triton_gemv.tile(n_in, gated)
    calls = [("cublas", cublas), (f"default {block_n}x{block_k} w{warps}", ours)]
    if sweep:
        calls += [(f"{n}x{k} w{w}", functools.partial(ours, tile=(n, k, w))) for n, k, w in SWEEP]
    times: dict[str, float] = {}
    failed = False
    for name, product in calls:
        try:
            err = float((product(weights[0]).float() - want).norm() / want.norm())
            ms, _ = timed(every_layer(product, weights), graphs=True, repeat=20)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next tile
            say(f"  {name:18s} failed: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        us = 1000 * ms / LAYERS
        ok = err <= 1e-2
        failed |= not ok
        say(f"  {name:18s} {us:7.2f} us, {100 * floor_us / us:5.1f}% of the floor, error {err:.1e}"
            f"{'' if ok else '  FAILED'}")  # fmt: skip
        if ok:
            times[name] = us
    mine = {name: us for name, us in times.items() if name != "cublas"}
    default = next((us for name, us in mine.items() if name.startswith("default")), float("nan"))
    best = min(mine.values(), default=float("nan"))
    if mine:
        say(f"  best: {min(mine, key=mine.__getitem__)} {best:.2f} us")
    return times.get("cublas", float("nan")), default, best, failed


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    report = Report()
    say = report.say
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {LAYERS} products a graph, bf16")
    totals = [0.0, 0.0, 0.0]
    failed = False
    for n_out, n_in in GEMV_26B_SHAPES:
        gated = (n_out, n_in) == GEMV_26B_SHAPES[-1]  # the MLP's down projection
        *times, bad = bench_shape(n_out, n_in, gated, args.sweep, args.bandwidth, say)
        totals = [t + u for t, u in zip(totals, times, strict=True)]
        failed |= bad
    say(f"\nthe six shapes, one product each: cuBLAS {totals[0]:.1f} us, default tiles {totals[1]:.1f} us, "
        f"best tiles {totals[2]:.1f} us")  # fmt: skip
    report.write(args.out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
