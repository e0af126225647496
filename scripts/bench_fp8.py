"""FP8 experts at the 26B-A4B shape on one GPU, against bf16 in the same run.

Random bf16 weights, batch 1, a 256-token canvas over a 4,096-token context, as `scripts/bench_gpu.py`:

  1. bf16: the fast path (CUDA graphs, the expert kernel `pick_gpu_kernel` chooses), a 16-step fixed block;
  2. each FP8 kernel of `--kernels` against its fp32 reference (`FP8_REFERENCES`) and against the bf16 experts, on one
     layer's real expert tensors and 256 routed tokens: relative errors (the run fails past 2e-2 against
     the reference);
  3. every layer's experts to FP8 (e4m3, a scale per expert and output channel), the bf16 copies freed;
  4. FP8: the same block for each kernel of `--kernels` (the grouped W8A8 GEMM, the Triton W8A16 and W8A8
     experts); ms a step, tokens/s, and the experts' bytes beside the bf16 ones;
  5. each one's last denoising pass's logits against (1)'s (relative error, argmax agreement).

GPU:  source scripts/device_env.sh; python3 scripts/bench_fp8.py --out $OUT/bench_fp8.txt  (about 2 minutes)

`--w8a8-tiles 'promote=0,row_scale=1,down.column_tiles=4'` times the W8A8 experts on tiles other than
`triton_moe.tiles_for`'s: those fields of its W8A8 tiles replaced (`down.` ones on the down product's).
`--bf16-tiles 'weights_first=1,block_n=128'` does the same for the bf16 experts, and `--kernels ''` times
those alone.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import BIG, Tee, build_model, fixed_block, med, timed  # noqa: E402

from dfim.engine.model import triton_moe  # noqa: E402
from dfim.engine.model.config import ModelConfig  # noqa: E402
from dfim.engine.model.experts import FP8_KERNELS, moe_grouped  # noqa: E402
from dfim.engine.model.experts_fp8 import FP8_REFERENCES, fp8_kernel_works, use_fp8_experts  # noqa: E402
from dfim.engine.model.fast import FastDiffusionGemma  # noqa: E402

# how many of the layer's 256 tokens each FP8 kernel is checked on against its fp32 reference
# (`FP8_REFERENCES`; the grouped kernel's goes pair by pair); the run fails past 2e-2 against it
CHECKS = {"grouped_fp8": 16, "triton_fp8": 256, "triton_w8a8": 256}


def override_tiles(spec: str, w8a8: bool) -> None:
    """Make `triton_moe.tiles_for` return its W8A8 tiles (`w8a8`), or its tiles for 16-bit weights, with the
    fields of `spec` ('field=value,...', `down.field` for the down product's own tiles) replaced, for this
    process."""
    import dataclasses

    top: dict[str, int] = {}
    down: dict[str, int] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        (down if key.startswith("down.") else top)[key.removeprefix("down.")] = int(value)
    chosen = triton_moe.tiles_for

    def tiles_for(pairs: int, experts: int, fp8: bool = False, fp8_act: bool = False) -> triton_moe.Tiles:
        tiles = chosen(pairs, experts, fp8=fp8, fp8_act=fp8_act)
        if not (fp8_act if w8a8 else not fp8):  # not the tiles asked for
            return tiles
        own = dataclasses.replace(tiles.down or dataclasses.replace(tiles, down=None), **down)
        return dataclasses.replace(tiles, down=own, **top)

    triton_moe.tiles_for = tiles_for


def block_ms(fast: FastDiffusionGemma, context: torch.Tensor, steps: int, reps: int) -> float:
    fast.reset()
    fast.encode(context)
    fixed_block(fast, steps)  # warm-up and graph capture
    return med(timed(lambda: fixed_block(fast, steps), fast.device, reps=reps, warmup=0)) * 1e3


def last_logits(fast: FastDiffusionGemma, context: torch.Tensor) -> torch.Tensor:
    """One denoising pass over a fixed canvas (the same for both runs), logits [L, V] fp32."""
    fast.reset()
    fast.encode(context)
    g = torch.Generator(device="cpu").manual_seed(7)
    canvas = torch.randint(16, fast.vocab, (1, fast.canvas_length), generator=g).to(fast.device)
    return fast.denoise(canvas)[0].float().clone()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--kernels",
        default="grouped_fp8,triton_fp8,triton_w8a8",
        help="the FP8 experts' kernels to time (experts.FP8_KERNELS), comma-separated",
    )
    parser.add_argument("--w8a8-tiles", default="", help="fields of the W8A8 tiles to replace (above)")
    parser.add_argument("--bf16-tiles", default="", help="fields of the bf16 experts' tiles to replace")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_fp8.txt"))
    args = parser.parse_args()
    log = Tee(args.out)
    if args.w8a8_tiles:
        override_tiles(args.w8a8_tiles, w8a8=True)
    if args.bf16_tiles:
        override_tiles(args.bf16_tiles, w8a8=False)
    if not torch.cuda.is_available():
        log("needs a CUDA GPU (SM90 for the FP8 grouped GEMM)")
        return 2
    device, dtype = torch.device("cuda"), torch.bfloat16
    config = ModelConfig(**BIG)
    log(f"date {time.strftime('%Y-%m-%d %H:%M:%S')}  command: {' '.join(sys.argv)}")
    log(f"torch {torch.__version__}  GPU {torch.cuda.get_device_properties(0).name}")
    model = build_model(config, device, dtype)
    g = torch.Generator(device="cpu").manual_seed(1)
    context = torch.randint(16, config.vocab_size, (1, args.context), generator=g).to(device)
    max_len = args.context + 2 * config.canvas_length + 512
    results: dict[str, float] = {}
    kernels = [name for name in args.kernels.split(",") if name]  # none: the bf16 step alone
    unknown = [name for name in kernels if name not in CHECKS]
    if unknown:
        log(f"unknown FP8 kernels {unknown}: choose from {sorted(CHECKS)}")
        return 2

    fast = FastDiffusionGemma(model, max_len=max_len, bucket=256)
    experts = model.decoder.layers[0].experts
    bf16_bytes = sum(
        (layer.experts.gate_up_proj.numel() + layer.experts.down_proj.numel()) * 2
        for layer in model.decoder.layers
    )

    def time_block(name: str, fast: FastDiffusionGemma) -> None:
        ms = block_ms(fast, context, args.steps, args.reps)
        results[f"{name}_ms_step"] = ms / args.steps
        log(
            f"{name} ({fast.moe} experts, graphs {fast.use_graphs}): {ms / args.steps:.2f} ms/step, "
            f"{config.canvas_length / (ms / 1e3):.0f} tok/s at {args.steps} steps"
        )

    time_block("bf16", fast)
    if not kernels:
        log("summary: " + ", ".join(f"{key} {value:.4g}" for key, value in results.items()))
        return 0
    want_logits = last_logits(fast, context)
    del fast
    gc.collect()
    torch.cuda.empty_cache()

    # the kernel on one layer's real tensors: 256 tokens routed at random, top-k of E
    n, k, e = config.canvas_length, config.top_k_experts, config.num_experts
    x = torch.randn(n, config.hidden_size, generator=g).to(device, dtype)
    index = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(n)]).to(device)
    weights = torch.softmax(torch.randn(n, k, generator=g), dim=-1).to(device)
    bf16_out = moe_grouped(x, weights, index, experts.gate_up_proj, experts.down_proj).float()
    fp8 = use_fp8_experts(experts, drop_bf16=False)
    if "grouped_fp8" in kernels:
        why = fp8_kernel_works(fp8, device, dtype)
        log(f"grouped FP8 kernel self-test: {'ok' if why is None else why}")
        if why is not None:
            return 1
    failed = False
    for name in kernels:
        reference, rows = FP8_REFERENCES[name], CHECKS[name]
        got = FP8_KERNELS[name](x, weights, index, fp8).float()
        want = reference(x[:rows], weights[:rows], index[:rows], fp8).float()
        err_ref = float((got[:rows] - want).norm() / want.norm())
        err_bf16 = float((got - bf16_out).norm() / bf16_out.norm())
        failed |= not err_ref <= 2e-2
        log(
            f"one layer, {n} tokens, {name}: against its fp32 reference {err_ref:.2e} ({rows} tokens), against "
            f"the bf16 experts {err_bf16:.2e}{'' if err_ref <= 2e-2 else '  FAILED'}"
        )
        results.update({f"{name}_err_reference": err_ref, f"{name}_err_bf16": err_bf16})
    if failed:
        return 1

    t0 = time.time()
    for layer in model.decoder.layers:
        use_fp8_experts(layer.experts, drop_bf16=True)
    gc.collect()
    torch.cuda.empty_cache()
    fp8_bytes = sum(layer.experts.fp8.nbytes for layer in model.decoder.layers)
    log(
        f"experts to FP8 in {time.time() - t0:.1f} s: {fp8_bytes / 1e9:.1f} GB (bf16 {bf16_bytes / 1e9:.1f} GB); "
        f"GPU memory now {torch.cuda.memory_allocated() / 1e9:.1f} GB"
    )
    for kernel in kernels:  # each over the same FP8 weights
        fast = FastDiffusionGemma(model, max_len=max_len, bucket=256, moe=kernel)
        time_block(kernel, fast)
        got_logits = last_logits(fast, context)
        del fast
        gc.collect()
        torch.cuda.empty_cache()
        rel = float((got_logits - want_logits).norm() / want_logits.norm())
        agree = float((got_logits.argmax(-1) == want_logits.argmax(-1)).float().mean())
        log(
            f"{kernel}: one denoising pass, {config.num_hidden_layers} layers: logits against bf16's relative error "
            f"{rel:.3f}, argmax agreement {agree:.1%} (random weights: bf16 rounding alone moves these)"
        )
    bandwidth_floor = fp8_bytes / 3.35e12 * 1e3
    log(f"experts' FP8 bytes at 3.35 TB/s (H100): {bandwidth_floor:.1f} ms a step")
    log("summary: " + ", ".join(f"{key} {value:.4g}" for key, value in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
