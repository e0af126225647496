"""Time one product of the shapes a dfim-base layer has (and those of a model twice as big), with the int8
weights the CPU path uses today (`dfim.engine.model.int8.linear_int8`), fp32, and torch's int4 CPU kernel
(`_weight_int4pack_mm_for_cpu`, bf16 activations, groups of 32): what lower-bit weights would cost a fill.

    python scripts/bench_int4_cpu.py [--threads 2]

Random weights and activations (the kernels' speed does not depend on the values); microseconds per
product, best of a few hundred calls after a warm-up.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from dfim.engine.model.int8 import linear_int8, pack_int8

# [out, in]: a 384-wide layer (dfim-base) and a 544-wide one (2x the parameters), with their LM heads
SHAPES = [(1152, 384), (384, 1152), (16384, 384), (1632, 544), (544, 1632), (16384, 544)]
GROUP = 32


def per_call_us(fn: Callable[..., object], *args: object, calls: int = 300) -> float:
    for _ in range(20):
        fn(*args)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    int4 = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    print(f"torch {torch.__version__}, {args.threads} threads, int4 kernel: {int4}")
    for out_dim, in_dim in SHAPES:
        weight = torch.randn(out_dim, in_dim)
        packed8 = pack_int8(weight)
        if int4:
            q = torch.randint(0, 16, (out_dim, in_dim), dtype=torch.int32)
            packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            scales = torch.randn(in_dim // GROUP, out_dim, 2, dtype=torch.bfloat16)
        for rows in (1, 32):
            x = torch.randn(rows, in_dim)
            fp32 = per_call_us(torch.matmul, x, weight.t())
            line = f"[{out_dim}, {in_dim}] x {rows:>2} rows: fp32 {fp32:7.0f} us"
            if packed8 is not None:
                line += f", int8 {per_call_us(linear_int8, x, packed8):7.0f} us"
            if int4:
                mm = torch.ops.aten._weight_int4pack_mm_for_cpu
                line += f", int4 {per_call_us(mm, x.to(torch.bfloat16), packed4, GROUP, scales):7.0f} us"
            print(line)


if __name__ == "__main__":
    main()
