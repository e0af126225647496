"""The dense products of a denoising pass at the 26B-A4B shape on a GPU: cuBLAS (`F.linear`) against
Triton's own GEMM templates (torch.compile's max-autotune, which tries tile sizes and split-K), at the rows a
pass has: 256 (a block) by default, 64 (the server's two 32-token rows) with `--rows 64,256`.

Each shape runs as a pass meets it: 30 products in a row over 30 weights (no weight still in L2), captured in
one CUDA graph; the time is the replay's over 30. The floor is the larger of the weight's bytes over the
bandwidth and the product's arithmetic over the tensor cores' peak. What it answers: whether a Triton GEMM
tuned to these shapes (cuBLAS launches few blocks where N is 2,816) is worth writing. `--fp8` times instead
what an FP8 checkpoint's dense layers would cost kept in FP8 (W8A8, as the experts run): each weight row in
e4m3 with its scale, the activations quantized a row at a time (`triton_moe.quantize_rows`, one kernel) and
multiplied by cuBLASLt's FP8 GEMM with row-wise scales (`torch._scaled_mm`), the quantization included.

    source scripts/device_env.sh; python3 scripts/bench_dense_gpu.py --out $OUT/bench_dense_gpu.txt
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from dfim.engine.model.fast_check import GEMV_26B_SHAPES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # PYTHONSAFEPATH leaves the scripts' folder out
from bench_moe_gpu import Report, bench_parser, every_layer, timed  # noqa: E402

LAYERS = 30


def fp8_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [N, K] as e4m3 rows and their scales, laid out as `_scaled_mm`'s second operand wants."""
    from dfim.engine.model.experts_fp8 import quantize_rows

    q, scale = quantize_rows(w)
    return q, scale.float()


def fp8_linear(x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """`F.linear(x, w)` in W8A8: x quantized a row at a time, cuBLASLt's FP8 GEMM with row-wise scales."""
    from dfim.engine.model import triton_moe

    q, scale = weight
    xq, x_scale = triton_moe.quantize_rows(x)
    return torch._scaled_mm(
        xq, q.t(), scale_a=x_scale[:, None], scale_b=scale[None, :], out_dtype=torch.bfloat16
    )


def main() -> None:
    parser = bench_parser(__doc__, sweep=False)
    parser.add_argument("--tflops", type=float, default=989.0, help="the card's dense bf16 peak")
    parser.add_argument("--rows", default="256", help="rows a product, comma-separated (each compiles anew)")
    parser.add_argument("--fp8", action="store_true", help="cuBLAS bf16 against FP8 W8A8 (_scaled_mm)")
    args = parser.parse_args()
    torch._dynamo.config.cache_size_limit = 64  # one compiled product per shape
    report = Report()
    say = report.say
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {LAYERS} products a graph, bf16")
    tuned = torch.compile(F.linear, mode="max-autotune-no-cudagraphs", dynamic=False)
    second = ("fp8 w8a8", fp8_linear) if args.fp8 else ("triton max-autotune", tuned)
    totals: dict[int, list[float]] = {}
    for n_out, n_in in GEMV_26B_SHAPES:
        weights = [
            torch.randn(n_out, n_in, device="cuda", dtype=torch.bfloat16) * n_in**-0.5 for _ in range(LAYERS)
        ]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, n_in, device="cuda", dtype=torch.bfloat16)
            floor_us = max(
                n_out * n_in * 2 / (args.bandwidth * 1e12), 2 * rows * n_out * n_in / (args.tflops * 1e12)
            )
            floor_us *= 1e6
            want = F.linear(x, weights[0]).float()
            line = f"{rows:4d} x {n_in} -> {n_out}: floor {floor_us:6.2f} us"
            for i, (name, product) in enumerate((("cublas", F.linear), second)):
                try:
                    ws = [fp8_weight(w) for w in weights] if product is fp8_linear else weights
                    err = float((product(x, ws[0]).float() - want).norm() / want.norm())
                    ms, _ = timed(every_layer(functools.partial(product, x), ws), graphs=True, repeat=20)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    line += f"; {name} failed: {type(exc).__name__}: {str(exc)[:80]}"
                    continue
                us = 1000 * ms / LAYERS
                totals.setdefault(rows, [0.0, 0.0])[i] += us
                line += f"; {name} {us:6.2f} us ({100 * floor_us / us:4.1f}%, error {err:.0e})"
            say(line)
    for rows, (cublas, other) in totals.items():
        say(f"{rows} rows, the six shapes once each: cuBLAS {cublas:.1f} us, {second[0]} {other:.1f} us")
    report.write(args.out)


if __name__ == "__main__":
    main()
