"""The experts of one layer of the 26B-A4B shape on a GPU: every kernel of `experts.GPU_KERNELS`, timed from
a CUDA graph where it can be captured (eagerly where not), against the bandwidth floor, and checked against
the per-expert reference.

One layer's experts (128 of them, hidden 2,816, intermediate 704, top-8, random bf16 weights) at the token
counts a denoising pass has: 32 (one single-line canvas), 64 (the server's two candidates), 256 (a block).
The floor is the bytes of the experts the routing touches, read once, over the card's bandwidth (the peak
of `--bandwidth`, 4.8 TB/s for an H200). `--sweep` also times other tile sizes of the Triton kernels, `--fp8`
the kernels over FP8 weights (whose floor is half).

    source scripts/device_env.sh; python3 scripts/bench_moe_gpu.py [--sweep] [--fp8] --out $OUT/bench_moe_gpu.txt

Exit status 1 when a kernel's output differs from the reference by more than 2% (relative, bf16).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from dfim.engine.model import triton_moe
from dfim.engine.model.config import RELEASED_26B_A4B
from dfim.engine.model.experts import FP8_KERNELS, GPU_KERNELS
from dfim.engine.model.experts_fp8 import moe_w8a8_reference, moe_w8a16_reference, quantize_experts
from dfim.engine.model.ops import gelu

SWEEP = [
    triton_moe.Tiles(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=st)
    for m, n, k, w, st in [
        (16, 64, 64, 4, 3), (16, 32, 128, 4, 4), (16, 64, 128, 4, 3), (32, 64, 64, 4, 3), (32, 64, 128, 4, 3),
        (64, 64, 64, 4, 3), (64, 64, 128, 8, 3), (32, 32, 128, 4, 4), (32, 64, 128, 4, 4),
    ]
]  # fmt: skip
# the weights as the products' rows (`weights_first`: the warpgroup MMA whatever the pairs), the down product
# several output tiles a program
SWEEP += [
    triton_moe.Tiles(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=st, weights_first=True,
                     down=triton_moe.Tiles(m, dn, dk, w, dst, column_tiles=ct))
    for m, n, k, w, st, dn, dk, dst, ct in [
        (16, 128, 64, 4, 4, 64, 64, 4, 1), (32, 128, 64, 4, 4, 64, 64, 4, 1), (32, 128, 64, 4, 4, 64, 64, 4, 4),
        (32, 128, 128, 4, 3, 64, 128, 3, 4), (32, 64, 128, 4, 4, 64, 64, 4, 4), (32, 256, 64, 8, 3, 128, 64, 3, 2),
        (64, 128, 64, 4, 4, 64, 64, 4, 4),
    ]
]  # fmt: skip

# FP8 weights: half the bytes a tile, so longer reductions a step are tried too
FP8_SWEEP = [
    triton_moe.Tiles(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=st)
    for m, n, k, w, st in [
        (16, 64, 256, 4, 3), (16, 128, 128, 4, 3), (16, 64, 256, 8, 4), (16, 128, 256, 8, 3),
        (16, 32, 256, 4, 4), (32, 64, 256, 4, 3), (16, 64, 512, 8, 3), (32, 64, 128, 4, 4),
    ]
]  # fmt: skip


# FP8 activations too (W8A8): the pairs as the products' rows (FP8 tensor cores from 64 of them), and the
# weights as their rows (`weights_first`: FP8 tensor cores from 64 output columns, whatever the pairs)
_T = triton_moe.Tiles
W8A8_SWEEP = [
    _T(block_m=m, block_n=n, block_k=k, num_warps=w, num_stages=st, weights_first=wf)
    for m, n, k, w, st, wf in [(32, 128, 128, 4, 3, False), (16, 128, 128, 4, 3, True), (32, 128, 128, 4, 3, True)]
] + [  # the down product on tiles of its own (its steps divide the activations' 128-column scale groups)
    _T(block_m=m, block_n=128, block_k=128, weights_first=True, down=_T(m, n, k, w, st))
    for m, n, k, w, st in [(16, 64, 128, 4, 3), (32, 64, 128, 4, 4), (32, 64, 64, 4, 4)]
] + [  # unpromoted sums, one activation scale a pair, several down tiles a program
    _T(block_m=m, block_n=128, block_k=128, weights_first=True, promote=promote, row_scale=rows,
       down=_T(m, dn, 128, 4, st, column_tiles=ct))
    for m in (16, 32)
    for promote, rows, dn, ct, st in [
        (False, False, 64, 1, 3), (True, True, 64, 1, 3), (False, True, 64, 1, 3), (False, True, 64, 11, 3),
    ]
] + [  # the gate and up product's own tiles, the down product as the default's
    _T(block_m=32, block_n=n, block_k=k, num_warps=w, num_stages=st, weights_first=True, promote=False,
       row_scale=True, down=_T(32, 64, 128, 4, 4, column_tiles=4))
    for n, k, w, st in [(128, 128, 4, 4), (128, 256, 4, 3), (64, 256, 4, 3), (128, 128, 8, 3), (256, 128, 8, 3),
                        (64, 128, 4, 4), (128, 64, 4, 5)]
] + [  # the down product's wider tiles (its activations read fewer times a program), exact reduction steps
    _T(block_m=32, block_n=128, block_k=128, weights_first=True, promote=False, row_scale=True,
       down=_T(32, dn, dk, w, st, column_tiles=ct))
    for dn, dk, w, st, ct in [(128, 128, 4, 4, 2), (128, 128, 8, 4, 2), (256, 128, 8, 3, 1), (128, 64, 4, 6, 2),
                              (64, 64, 4, 6, 4), (128, 128, 8, 4, 1), (256, 64, 8, 4, 1), (64, 128, 4, 4, 2)]
]  # fmt: skip


def tiles_name(t: triton_moe.Tiles) -> str:
    down = f" down {tiles_name(t.down)}" if t.down else ""
    extra = "".join(
        [" wf" if t.weights_first else "", "" if t.promote else " np", " rows" if t.row_scale else "",
         f" ct{t.column_tiles}" if t.column_tiles > 1 else ""]
    )  # fmt: skip
    return f"{t.block_m}x{t.block_n}x{t.block_k} w{t.num_warps} s{t.num_stages}{extra}{down}"


def reference(x: Tensor, weights: Tensor, index: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """The experts' output in fp32, one expert at a time (`moe_gathered` would copy every pair's weights)."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in index.unique().tolist():
        token, slot = (index == expert).nonzero(as_tuple=True)
        gate, up = (x[token].float() @ gate_up[expert].float().T).chunk(2, dim=-1)
        y = (gelu(gate) * up) @ down[expert].float().T
        out.index_add_(0, token, y * weights[token, slot, None])
    return out


def bench_parser(doc: str, sweep: bool = True) -> argparse.ArgumentParser:
    """The GPU kernel benches' common options: the card's bandwidth, a tile sweep, the report's file."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--bandwidth", type=float, default=4.8, help="the card's peak, TB/s")
    if sweep:
        parser.add_argument("--sweep", action="store_true", help="also time other tile sizes")
    parser.add_argument("--out", type=Path)
    return parser


def every_layer(product: Callable[[Tensor], Tensor], weights: list[Tensor]) -> Callable[[], Tensor]:
    """`product` over each of `weights` in turn, as a pass meets one product in every layer (with a weight
    each, none is still in L2 from the call before): one call to time, returning the last output."""

    def run() -> Tensor:
        for w in weights[:-1]:
            product(w)
        return product(weights[-1])

    return run


class Report:
    """Lines printed as they come and written to a file at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def write(self, path: Path | None) -> None:
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(self.lines) + "\n")


def timed(fn: Callable[[], Tensor], graphs: bool, repeat: int = 50) -> tuple[float, bool]:
    """(ms per call, whether it ran from a CUDA graph)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = None
    if graphs:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            graph = g
        except Exception:  # noqa: BLE001 - not capturable: time it eagerly
            torch.cuda.synchronize()
            graph = None
    run = graph.replay if graph is not None else fn
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000 / repeat, graph is not None


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--tokens", default="32,64,256")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 kernels (weights in e4m3)")
    parser.add_argument("--w8a8-only", action="store_true", help="with --sweep: sweep only the W8A8 tiles")
    args = parser.parse_args()
    report = Report()
    say = report.say
    device = torch.device("cuda")
    c = RELEASED_26B_A4B
    e, h, i, k = c["num_experts"], c["hidden_size"], c["moe_intermediate_size"], c["top_k_experts"]
    g = torch.Generator(device="cpu").manual_seed(0)
    gate_up = (torch.randn(e, 2 * i, h, generator=g) * 0.02).to(device, torch.bfloat16)
    down = (torch.randn(e, h, i, generator=g) * 0.02).to(device, torch.bfloat16)
    say(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}; experts {e} x (2x{i} x {h} + {h} x {i}), top-{k}"
    )
    fp8 = quantize_experts(gate_up, down) if args.fp8 else None
    failed = False
    for n in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(n, h, generator=g).to(device, torch.bfloat16)
        index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(device)
        weights = torch.softmax(torch.randn(n, k, generator=g), dim=-1).to(device)
        touched = index.unique().numel()
        floor = touched * 3 * i * h * 2 / (args.bandwidth * 1e12) * 1000
        want = reference(x, weights, index, gate_up, down)
        say(f"\n{n} tokens: {touched} experts touched, floor {floor:.3f} ms at {args.bandwidth} TB/s")
        kernels: list[tuple[str, Callable[..., Tensor]]] = [
            (name, f) for name, f in GPU_KERNELS.items() if name != "gathered" or n <= 64
        ]
        if args.sweep and not args.w8a8_only:
            kernels += [
                (f"triton {tiles_name(t)}", functools.partial(triton_moe.moe_triton, tiles=t))
                for t in SWEEP[1:]
            ]  # fmt: skip
        calls = [(name, functools.partial(kernel, x, weights, index, gate_up, down), want, floor, 2e-2)
                 for name, kernel in kernels]  # fmt: skip
        if fp8 is not None:  # FP8 weights: half the bytes; W8A16 against its exact reference
            want8 = moe_w8a16_reference(x, weights, index, fp8).float()
            calls += [
                ("triton_fp8 (W8A16)", functools.partial(FP8_KERNELS["triton_fp8"], x, weights, index, fp8), want8,
                 floor / 2, 2e-2),
                ("triton_fp8 bf16 products", functools.partial(FP8_KERNELS["triton_fp8"], x, weights, index, fp8,
                                                               torch.bfloat16), want8, floor / 2, 2e-2),
                ("grouped_fp8 (W8A8)", functools.partial(FP8_KERNELS["grouped_fp8"], x, weights, index, fp8), want8,
                 floor / 2, 8e-2),
            ]  # fmt: skip
            w8a8_want = {
                group: moe_w8a8_reference(x, weights, index, fp8, group).float()
                for group in {triton_moe.tiles_for(n * k, e, fp8=True, fp8_act=True).activation_group(i)}
                | ({t.activation_group(i) for t in W8A8_SWEEP} if args.sweep else set())
            }  # the activations' groups are the tiles' output columns
            default_group = triton_moe.tiles_for(n * k, e, fp8=True, fp8_act=True).activation_group(i)
            calls += [
                ("w8a8 triton", functools.partial(FP8_KERNELS["triton_w8a8"], x, weights, index, fp8),
                 w8a8_want[default_group], floor / 2, 2e-2),
            ]  # fmt: skip
            try:
                w8a8 = FP8_KERNELS["triton_w8a8"](x, weights, index, fp8).float()
                say(f"  W8A8's quantized activations against W8A16's: relative error "
                    f"{float((w8a8 - want8).norm() / want8.norm()):.1e}")  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - the timed loop below reports it as failed
                say(f"  W8A8 failed: {type(exc).__name__}: {str(exc)[:120]}")
            if args.sweep:
                calls += [
                    (f"w8a8 {tiles_name(t)}",
                     functools.partial(triton_moe.moe_triton, x, weights, index, fp8.gate_up, fp8.down, t,
                                       fp8.gate_up_scale, fp8.down_scale, torch.float8_e4m3fn),
                     w8a8_want[t.activation_group(i)], floor / 2, 2e-2)
                    for t in W8A8_SWEEP
                ]  # fmt: skip
            if args.sweep and not args.w8a8_only:
                calls += [
                    (f"triton_fp8 {tiles_name(t)}",
                     functools.partial(triton_moe.moe_triton, x, weights, index, fp8.gate_up, fp8.down, t,
                                       fp8.gate_up_scale, fp8.down_scale, torch.float16), want8, floor / 2, 2e-2)
                    for t in FP8_SWEEP
                ]  # fmt: skip
        best: dict[str, tuple[float, str]] = {}  # the fastest correct kernel, bf16 and FP8 weights apart
        for name, fn, reference_out, bound, limit in calls:
            try:
                got = fn().float()
                err = ((got - reference_out).norm() / reference_out.norm()).item()
                ms, graphed = timed(fn, graphs=True)
            except Exception as exc:  # noqa: BLE001 - report and go on to the next kernel
                say(f"  {name:28s} failed: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            ok = err <= limit
            failed |= not ok
            family = "w8a8" if "w8a8" in name.lower() else "fp8" if "fp8" in name else "bf16"
            if ok and ms < best.get(family, (float("inf"), ""))[0]:
                best[family] = (ms, name)
            say(
                f"  {name:28s} {ms:7.3f} ms ({'graph' if graphed else 'eager'}), {100 * bound / ms:5.1f}% of "
                f"its floor, relative error {err:.1e}{'' if ok else '  FAILED'}"
            )
        for family, (ms, name) in sorted(best.items()):
            say(f"  best {family} at {n} tokens: {name} {ms:.3f} ms")
    report.write(args.out)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
