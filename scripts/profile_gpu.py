"""Where a denoising step's time goes: the per-kernel breakdown of issue 32 (must-have 3).

The 26B-A4B shape with random bf16 weights, batch 1, a 256-token canvas over a 4,096-token context,
as `scripts/bench_gpu.py` runs it. Two profiles of the same fixed-step block (the engine's sampler
chain over the fast path, stop steps off):

  eager  : no CUDA graph. Every kernel is attributed to the innermost of these scopes it runs under:
           qkv (projections, q/k norms, rope), attention (cache write + SDPA + o_proj), dense_mlp, router,
           experts, norms (the layer's RMSNorms), self_conditioning (soft embeddings + its MLP),
           lm_head (final norm, head, softcap), embed; a kernel under none of them is the sampler or
           glue between steps.
  graphs : the decoder pass replayed from a CUDA graph, as the server runs it. The profiler sees the
           graph's kernels (CUPTI graph-node tracing) but not the Python scopes, so kernels are grouped
           by name (GEMMs, attention, elementwise/reduction, copies). The step time here is the product's.

  --ar N : instead, N greedy autoregressive tokens (`FastDiffusionGemma.generate_ar`) replayed from their
           graphs: kernels per token and the top kernels by device time (AR decode is ~20 kernels a layer,
           so it is bound by their count as much as by bytes).

GPU:  source scripts/device_env.sh; python3 scripts/profile_gpu.py --out $OUT/profile_gpu.txt
      python3 scripts/profile_gpu.py --ar 64 --out $OUT/profile_gpu_ar.txt
CPU:  python scripts/profile_gpu.py --small     (the whole pipeline on a tiny config: CPU op times)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import BIG, SMALL, Tee, build_model  # noqa: E402

from dfim.engine.inference.fast_backend import fixed_step_block  # noqa: E402
from dfim.engine.model.attention import Attention  # noqa: E402
from dfim.engine.model.config import ModelConfig  # noqa: E402
from dfim.engine.model.experts_fp8 import use_fp8_experts  # noqa: E402
from dfim.engine.model.fast import FastDiffusionGemma  # noqa: E402
from dfim.engine.model.network import RMSNorm  # noqa: E402

SCOPES = (
    "qkv",
    "attention",
    "dense_mlp",
    "router",
    "experts",
    "norms",
    "self_conditioning",
    "lm_head",
    "embed",
)
OTHER = "sampler_and_glue"


def scoped(name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        with record_function(f"dfim::{name}"):
            return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def scopes(fast: FastDiffusionGemma) -> Iterator[None]:
    """Name the parts of a step for the profiler: module hooks and wrapped methods, all undone after."""
    model = fast.model
    handles = []
    wrapped: list[tuple[object, str]] = []  # instance attributes that shadow a method until removed

    def hook(module: torch.nn.Module, name: str) -> None:
        state: dict[str, record_function] = {}

        def pre(_module, _args):
            state["scope"] = record_function(f"dfim::{name}")
            state["scope"].__enter__()

        def post(_module, _args, _out):
            state.pop("scope").__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))

    def wrap(owner: object, attr: str, name: str) -> None:
        setattr(owner, attr, scoped(name, getattr(owner, attr)))  # the bound method, wrapped
        wrapped.append((owner, attr))

    for layer in fast.layers:
        hook(layer.mlp, "dense_mlp")
        hook(layer.router, "router")
        hook(layer.experts, "experts")
        for module in layer.modules():
            if isinstance(module, RMSNorm) and module not in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                hook(module, "norms")
    hook(model.decoder.self_conditioning, "self_conditioning")
    project = Attention.project  # called as a method, not a module: wrapped on the class
    Attention.project = scoped("qkv", project)  # type: ignore[method-assign]
    wrap(fast, "_attend_static", "attention")
    wrap(fast, "logits", "lm_head")
    wrap(fast, "embed", "embed")
    wrap(model, "soft_embeddings", "self_conditioning")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        Attention.project = project  # type: ignore[method-assign]
        for owner, attr in wrapped:
            delattr(owner, attr)


def scope_of(event) -> str:
    node = event
    while node is not None:
        if node.name.startswith("dfim::"):
            return node.name[len("dfim::") :]
        node = node.cpu_parent
    return OTHER


def kernel_group(name: str) -> str:
    n = name.lower()
    if "flash" in n or "fmha" in n or "attention" in n or "sdpa" in n or "efficient" in n:
        return "attention kernels"
    if "gemm" in n or "matmul" in n or "cutlass" in n or "sm90" in n or "nvjet" in n or "grouped" in n:
        return "GEMMs (dense, experts, head)"
    if "memcpy" in n or "memset" in n or "copy" in n or "index" in n or "scatter" in n or "gather" in n:
        return "copies, index, scatter"
    if "reduce" in n or "softmax" in n or "norm" in n or "argmax" in n or "topk" in n or "sort" in n:
        return "reductions, softmax, top-k, sort"
    if "elementwise" in n or "vectorized" in n or "triton" in n or "unrolled" in n:
        return "elementwise (fused or not)"
    return "other"


def kernels(prof) -> list[tuple[str, float, object]]:
    """(kernel name, device µs, the CPU op that launched it) for every GPU kernel/copy of an eager run."""
    return [
        (k.name, k.duration, event) for event in prof.events() for k in getattr(event, "kernels", []) or []
    ]


def device_kernels_after(prof, marker: str) -> list[tuple[str, float, object]]:
    """(kernel name, device µs, None) of every device event that started after the CPU scope `marker` began.
    A graph replay's kernels have no CPU op, and CUPTI records them only for graphs captured while the
    profiler runs, so the capture happens under the profiler too and this keeps the measured block's."""
    events = list(prof.events())
    start = min(e.time_range.start for e in events if e.name == marker)
    return [
        (e.name, e.time_range.elapsed_us(), None)
        for e in events
        if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA
        and e.time_range.start >= start
        and not e.name.startswith("dfim::")  # the scope's own mark on the device timeline
    ]


def table(title: str, rows: dict[str, float], per: float, log: Tee, unit: str) -> None:
    total = sum(rows.values())
    log(f"\n{title}")
    log(f"  {'part':<36} {unit + ' per step':>14} {'share':>7}")
    for name, value in sorted(rows.items(), key=lambda kv: -kv[1]):
        log(f"  {name:<36} {value / per:>14.3f} {value / total:>7.1%}")
    log(f"  {'total':<36} {total / per:>14.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="a tiny config on the CPU (smoke run)")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument(
        "--canvas",
        type=int,
        default=0,
        help="canvas tokens (default: the shape's 256; 32 is a single-line fill)",
    )
    parser.add_argument("--top", type=int, default=25, help="kernels listed by name")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "profile_gpu.txt"))
    parser.add_argument("--trace", default="", help="also write the graph profile's Chrome trace here")
    parser.add_argument("--fp8", action="store_true", help="experts in FP8 (dfim.engine.model.experts_fp8)")
    parser.add_argument("--ar", type=int, default=0, help="profile N autoregressive tokens instead (GPU)")
    args = parser.parse_args()
    log = Tee(args.out)
    small = args.small or not torch.cuda.is_available()
    device = torch.device("cpu" if small else "cuda")
    dtype = torch.float32 if small else torch.bfloat16
    context_len = min(args.context, 256) if small else args.context
    shape = SMALL if small else BIG
    config = ModelConfig(**({**shape, "canvas_length": args.canvas} if args.canvas else shape))
    log(f"date {time.strftime('%Y-%m-%d %H:%M:%S')}  command: {' '.join(sys.argv)}")
    log(f"torch {torch.__version__}  device {device}  dtype {dtype}")
    if device.type == "cuda":
        log(f"GPU {torch.cuda.get_device_properties(0).name}")
    model = build_model(config, device, dtype)
    moe = "auto"  # with FP8 experts: the kernel the engine picks (`experts_fp8.pick_fp8_kernel`)
    if args.fp8:
        for layer in model.decoder.layers:
            use_fp8_experts(layer.experts, drop_bf16=True)
    g = torch.Generator(device="cpu").manual_seed(1)
    context = torch.randint(16, config.vocab_size, (1, context_len), generator=g).to(device)
    bucket = 16 if small else 256
    max_len = context_len + 2 * config.canvas_length + 2 * bucket
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    unit = "ms" if device.type == "cuda" else "ms (CPU)"

    def block(fast: FastDiffusionGemma) -> None:
        fixed_step_block(
            lambda canvas, self_cond: fast.denoise(canvas, self_cond, clone=False),
            length=fast.canvas_length,
            vocab_size=fast.vocab,
            eos_id=config.eos_token_id,
            pad_id=config.pad_token_id,
            steps=args.steps,
            generator=torch.Generator(device=device).manual_seed(0),
        )
        if device.type == "cuda":
            torch.cuda.synchronize()

    if args.ar and device.type == "cuda":
        return profile_ar(model, context, max_len, bucket, moe, args, log)
    results: dict[str, float] = {}
    for mode in ("eager", "graphs"):
        graphs = mode == "graphs" and device.type == "cuda"
        if graphs:  # captured under the profiler (see device_kernels_after), then timed without it
            with profile(activities=activities) as prof:
                fast = FastDiffusionGemma(model, max_len=max_len, bucket=bucket, graphs=True, moe=moe)
                fast.encode(context)
                block(fast)  # warm-up and the graph capture
                with record_function("dfim::measured"):
                    block(fast)
            found = device_kernels_after(prof, "dfim::measured")
        else:
            fast = FastDiffusionGemma(model, max_len=max_len, bucket=bucket, graphs=False, moe=moe)
            fast.encode(context)
            block(fast)  # warm-up
        t0 = time.perf_counter()
        block(fast)
        wall = (time.perf_counter() - t0) * 1e3 / args.steps
        results[f"{mode}_wall_ms_step"] = wall
        log(f"\n== {mode}: experts kernel {fast.moe}, CUDA graphs {fast.use_graphs}; wall {wall:.2f} ms/step")
        if not graphs:
            with scopes(fast), profile(activities=activities) as prof:
                block(fast)
            found = kernels(prof)
        if mode == "eager":
            by_scope: dict[str, float] = defaultdict(float)
            if found:
                for _name, us, event in found:
                    by_scope[scope_of(event) if event is not None else OTHER] += us / 1e3
            else:  # the CPU: each op's own time, under its innermost scope
                for event in prof.events():
                    if not event.name.startswith("dfim::"):
                        by_scope[scope_of(event)] += event.self_cpu_time_total / 1e3
            table(
                f"eager step by part ({'device' if found else 'CPU'} time)", by_scope, args.steps, log, unit
            )
        by_group: dict[str, float] = defaultdict(float)
        by_name: dict[str, float] = defaultdict(float)
        for name, us, _event in found:
            by_group[kernel_group(name)] += us / 1e3
            by_name[name] += us / 1e3
        if found:
            table(f"{mode} step by kernel kind (device time)", by_group, args.steps, log, unit)
            log(f"\n{mode}: top {args.top} kernels by device time (ms per step)")
            for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[: args.top]:
                log(f"  {ms / args.steps:9.3f}  {name[:110]}")
            results[f"{mode}_device_ms_step"] = sum(by_name.values()) / args.steps
            log(f"{mode}: {len(found) / args.steps:.0f} kernels per step")
        if mode == "graphs" and args.trace:
            prof.export_chrome_trace(args.trace)
        del fast
    log("\nsummary: " + ", ".join(f"{k} {v:.2f}" for k, v in results.items()))
    return 0


def profile_ar(
    model: torch.nn.Module, context: Tensor, max_len: int, bucket: int, moe: str, args, log: Tee
) -> int:
    """`args.ar` greedy tokens after the context, from CUDA graphs captured under the profiler (so CUPTI
    records their kernels), then timed without it."""
    n = args.ar
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fast = FastDiffusionGemma(model, max_len=max_len + n, bucket=bucket, graphs=True, moe=moe)
        fast.encode(context[:, :-1])
        start, last = fast.length, int(context[0, -1])
        fast.generate_ar(last, n)  # warm-up and the graphs' capture
        fast.truncate(start)
        torch.cuda.synchronize()
        with record_function("dfim::measured"):
            fast.generate_ar(last, n)
            torch.cuda.synchronize()
    found = device_kernels_after(prof, "dfim::measured")
    fast.truncate(start)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fast.generate_ar(last, n)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / n
    by_group: dict[str, float] = defaultdict(float)
    by_name: dict[str, float] = defaultdict(float)
    for name, us, _event in found:
        by_group[kernel_group(name)] += us / 1e3
        by_name[name] += us / 1e3
    log(f"\n== AR decode from graphs: experts kernel {fast.moe}; wall {wall:.3f} ms/token")
    table("AR token by kernel kind (device time)", by_group, n, log, "ms")
    log(f"\nAR: top {args.top} kernels by device time (ms per token)")
    for name, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[: args.top]:
        log(f"  {ms / n:9.4f}  {name[:110]}")
    log(
        f"AR: {len(found) / n:.0f} kernels per token, {sum(by_name.values()) / n:.3f} ms of kernels per token"
    )
    log(f"\nsummary: ar_wall_ms_token {wall:.3f}, ar_device_ms_token {sum(by_name.values()) / n:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
