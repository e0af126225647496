"""One-run GPU benchmark of issue 7: the DiffusionGemma 26B-A4B shape, random bf16 weights, batch 1.

Sections (each guarded: a failure is printed and the run goes on):
  env / copy bandwidth
  check  : the fast path against our network and transformers against ours, layer by layer, fp32, on a
           four-layer model of the same shape with a well-conditioned init (dfim.engine.model.fast_check,
           which states the tolerances). A failed (or crashed) check makes the run exit with status 1.
  build the model on the GPU (parameter count and bytes against DESIGN §2)
  (a)    : our engine, 16 and 48 fixed denoising steps: the engine's own sampler chain with the stop steps
           off over the fast path's graph-replayed decoder pass (then again with torch.compile)
  (c)    : our autoregressive decode of the same network (same kernels, its own graphs)
  (b)    : transformers' `generate` on the same weight tensors (no second copy)
  summary: tokens/s, ms per step / token, bandwidth floors and the share of them reached, diffusion/AR.

GPU:  python3 scripts/bench_gpu.py --out $OUT/bench_gpu.txt
CPU:  python scripts/bench_gpu.py --small          (the whole pipeline on a tiny config, < 60 s)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

try:  # installed, or the GPU machine's mirror of the installed layout (scripts/device_env.sh)
    import dfim.engine  # noqa: F401
except ImportError:  # a bare checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dfim.engine.inference.fast_backend import fixed_step_block  # noqa: E402
from dfim.engine.model import fast_check  # noqa: E402
from dfim.engine.model.config import (
    RELEASED_26B_A4B,  # noqa: E402
    ModelConfig,  # noqa: E402
)
from dfim.engine.model.fast import FastDiffusionGemma, expected_experts_touched, weight_bytes  # noqa: E402
from dfim.engine.model.fast_check import transformers_view  # noqa: E402
from dfim.engine.model.network import DiffusionGemma  # noqa: E402

BIG = RELEASED_26B_A4B
SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=7,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    global_head_dim=32,
    num_global_key_value_heads=1,
    sliding_window=32,
    num_experts=16,
    top_k_experts=4,
    moe_intermediate_size=32,
    canvas_length=32,
)
DESIGN_PARAMS, DESIGN_BYTES = 25.25e9, 50.5e9

RESULTS: dict[str, float] = {}
START = time.time()


class Tee:
    def __init__(self, path: str | None) -> None:
        self.file = open(path, "w", buffering=1) if path else None  # noqa: SIM115

    def __call__(self, *parts) -> None:
        line = " ".join(str(p) for p in parts)
        print(line, flush=True)
        if self.file:
            self.file.write(line + "\n")


log = Tee(None)


@contextlib.contextmanager
def section(name: str):
    log(f"\n== {name}  (t={time.time() - START:.0f}s)")
    try:
        yield
    except Exception:  # noqa: BLE001 - report and go on with the next section
        log(f"!! section {name!r} failed:\n{traceback.format_exc()}")
    finally:
        gc.collect()
        if torch.cuda.is_available():
            try:
                torch.cuda.empty_cache()
            except Exception as err:  # noqa: BLE001 - e.g. a capture aborted by the time limit
                log(f"!! empty_cache failed: {err}")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: torch.device, reps: int, warmup: int = 1) -> list[float]:
    """Host wall seconds per call (device synchronised around each)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


# --- model on the device ----------------------------------------------------------------------


def build_model(config: ModelConfig, device: torch.device, dtype: torch.dtype) -> DiffusionGemma:
    """Random weights created directly on the device: meta model, then `to_empty` and in-place init."""
    with torch.device("meta"):
        model = DiffusionGemma(config)
    model = model.to(dtype).to_empty(device=device).eval()
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=g)
            else:  # norms and scales: around one, not exactly (a wrong wiring shows in the check)
                p.normal_(1.0, 0.1, generator=g)
        for b in model.buffers():
            b.fill_(1.0)
    model.requires_grad_(False)
    return model


def hf_generate(hf, context: torch.Tensor, steps: int):
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    config = DiffusionGemmaGenerationConfig(
        max_new_tokens=hf.config.canvas_length,
        max_denoising_steps=steps,
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=0.1),
        t_min=0.4,
        t_max=0.8,
        stability_threshold=1,
        confidence_threshold=1e-30,  # never confident: exactly `steps` steps, as ours in fixed mode
    )
    return hf.generate(context, generation_config=config)


# --- bytes and floors -------------------------------------------------------------------------


def byte_counts(model: DiffusionGemma, context: int) -> dict[str, float]:
    c = model.config
    el = model.decoder.embed_tokens.weight.element_size()
    params = {n: p.numel() for n, p in model.named_parameters()}
    total = sum(params.values())
    experts = sum(v for n, v in params.items() if ".experts." in n)
    embed = params["model.decoder.embed_tokens.weight"]
    self_cond = sum(v for n, v in params.items() if ".self_conditioning." in n)
    dense = total - experts  # attention, dense MLPs, routers, norms, embedding, self-conditioning
    touched = expected_experts_touched(c.canvas_length, c.num_experts, c.top_k_experts)
    kv_row = {True: 2 * c.num_key_value_heads * c.head_dim, False: 2 * c.global_kv_heads * c.global_head_dim}
    window_rows = min(context, c.sliding_window - 1)
    kv_diff = sum(
        kv_row[t != "full_attention"]
        * ((window_rows if t != "full_attention" else context) + c.canvas_length)
        for t in c.layer_types
    )
    kv_ar = sum(
        kv_row[t != "full_attention"] * (window_rows + 1 if t != "full_attention" else context + 1)
        for t in c.layer_types
    )
    return {
        "params": total,
        "bytes": total * el,
        "touched": touched,
        # DESIGN's definition: every weight a step touches, read once
        "diff_weights": (dense + experts * touched) * el,
        # what a step must really move: + the embedding read again for self-conditioning + KV cache
        "diff_all": (dense + experts * touched + embed) * el + kv_diff * el,
        # an AR token: no self-conditioning MLP, one embedding row (the LM head reads it all), top-k experts
        "ar_all": (dense - self_cond + experts * c.top_k_experts / c.num_experts) * el + kv_ar * el,
    }


# --- sections ---------------------------------------------------------------------------------


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    times = timed(lambda: dst.copy_(src), device, reps=10, warmup=3)
    return 2 * nbytes / med(times)  # bytes read + bytes written


def fixed_block(fast: FastDiffusionGemma, steps: int) -> torch.Tensor:
    """One canvas denoised for exactly `steps` steps by the engine's sampler chain (stop steps off) over the
    fast path's decoder pass, as the server runs it (same seed every call)."""
    c = fast.config
    ids, _ = fixed_step_block(
        lambda canvas, self_cond: fast.denoise(canvas, self_cond, clone=False),
        length=fast.canvas_length,
        vocab_size=fast.vocab,
        eos_id=c.eos_token_id,
        pad_id=c.pad_token_id,
        steps=steps,
        generator=torch.Generator(device=fast.device).manual_seed(0),
    )
    return ids


def run_diffusion(fast: FastDiffusionGemma, context: torch.Tensor, steps_list, reps: int, tag: str) -> None:
    device = fast.device
    fast.reset()
    prefill = timed(lambda: (fast.reset(), fast.encode(context)), device, reps=1, warmup=1)
    log(f"[{tag}] prefill {context.shape[1]} tokens: {med(prefill) * 1e3:.1f} ms (eager, chunked)")
    for steps in steps_list:
        t0 = time.perf_counter()
        fixed_block(fast, steps)  # first call captures the graph
        sync(device)
        log(f"[{tag}] {steps} steps: warm-up/capture {time.perf_counter() - t0:.2f} s")
        times = timed(lambda steps=steps: fixed_block(fast, steps), device, reps=reps, warmup=0)
        ms = med(times) * 1e3
        RESULTS[f"{tag}_ms_step_{steps}"] = ms / steps
        RESULTS[f"{tag}_tok_s_{steps}"] = fast.canvas_length / (ms / 1e3)
        log(
            f"[{tag}] {steps} fixed steps: {ms:.1f} ms/block (median of {reps}), {ms / steps:.2f} ms/step, "
            f"{fast.canvas_length / (ms / 1e3):.0f} tok/s   all: {[round(t * 1e3, 1) for t in times]}"
        )
    # the decoder alone (no sampler), one graph replay: shows what the sampler chain costs
    canvas = torch.randint(0, fast.vocab, (1, fast.canvas_length), device=device)
    fast.denoise(canvas)
    key = ("denoise", fast._diffusion_window(fast.canvas_length)[0], fast.canvas_length)
    if fast.use_graphs and key in fast._graphs:
        graph = fast._graphs[key]
        times = timed(graph.replay, device, reps=10, warmup=2)
        RESULTS[f"{tag}_ms_decoder"] = med(times) * 1e3
        log(f"[{tag}] decoder pass alone (graph replay): {med(times) * 1e3:.2f} ms")


def run_ar(fast: FastDiffusionGemma, context: torch.Tensor, n: int, reps: int, tag: str) -> None:
    device = fast.device
    fast.reset()
    fast.encode(context[:, :-1])
    start = fast.length
    last = int(context[0, -1])
    t0 = time.perf_counter()
    fast.generate_ar(last, n)  # captures the graphs of the buckets it crosses
    sync(device)
    log(f"[{tag}] AR warm-up/capture of {n} tokens: {time.perf_counter() - t0:.2f} s")

    def decode():
        fast.truncate(start)
        fast.generate_ar(last, n)

    times = timed(decode, device, reps=reps, warmup=0)
    ms = med(times) * 1e3 / n
    RESULTS[f"{tag}_ms_ar"] = ms
    log(f"[{tag}] AR decode {n} tokens: {ms:.3f} ms/token, {1e3 / ms:.1f} tok/s (median of {reps})")


def run_check(shape: dict, device: torch.device, small: bool, skip_hf: bool) -> bool:
    """dfim.engine.model.fast_check on a four-layer fp32 model of `shape`; True when every comparison is
    within its tolerance. Its own model and fast path: the check's graphs record every layer's output."""
    model = fast_check.check_model(shape, device)
    window = model.config.sliding_window
    context = window + (8 if small else 100)  # past the window, and (below) past a prefill chunk
    chunk = 24 if small else 1024
    bucket = 16 if small else 256
    max_len = context + 2 * model.config.canvas_length + 2 * bucket
    fast = FastDiffusionGemma(model, max_len=max_len, bucket=bucket, prefill_chunk=chunk)
    log(
        f"check model: 4 layers {fast_check.CHECK_LAYER_TYPES}, fp32, experts {fast.moe}, graphs {fast.use_graphs}"
    )
    hf = None
    if not skip_hf:
        try:
            hf, _ = transformers_view(model)
        except ImportError:
            log("transformers not installed: the check compares the fast path with our network only")
    result = fast_check.check_fast(model, fast, context, hf)
    for line in result.lines:
        log(line)
    log(
        f"check {'PASSED' if result.ok else 'FAILED'}: {len(result.failures)} of {len(result.lines)} over tolerance"
    )
    return result.ok


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    global log
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--small", "--dry-run", action="store_true", help="tiny config on the CPU (pipeline check)"
    )
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--steps", type=int, nargs="+", default=[16, 48])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ar-tokens", type=int, default=128)
    parser.add_argument("--compile", choices=["off", "on", "both"], default="both")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--hf-reps", type=int, default=1)
    parser.add_argument(
        "--budget-s", type=float, default=420, help="start no torch.compile section past this"
    )
    parser.add_argument("--hard-limit-s", type=int, default=510, help="abort a running section past this")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_gpu.txt"))
    args = parser.parse_args()
    log = Tee(args.out)

    small = args.small or not torch.cuda.is_available()
    device = torch.device("cpu" if small else "cuda")
    dtype = torch.float32 if small else torch.bfloat16
    context_len = min(args.context, 256) if small else args.context
    if small:
        torch.set_num_threads(1)
        args.reps = 1
    config = ModelConfig(**(SMALL if small else BIG))

    with section("environment"):
        log(f"date {time.strftime('%Y-%m-%d %H:%M:%S')}  command: {' '.join(sys.argv)}")
        log(f"torch {torch.__version__}  device {device}  dtype {dtype}  small={small}")
        log(f"torch._grouped_mm available: {hasattr(torch, '_grouped_mm')}")
        if device.type == "cuda":
            p = torch.cuda.get_device_properties(0)
            log(f"GPU {p.name}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
        try:
            import transformers

            log(f"transformers {transformers.__version__}")
        except ImportError:
            log("transformers not installed: section (b) will be skipped")

    bandwidth = float("nan")
    with section("copy bandwidth"):
        bandwidth = copy_bandwidth(device, (1 << 24) if small else (4 << 30))
        log(f"device-to-device copy: {bandwidth / 1e12:.3f} TB/s (bytes read + written)")

    check_ok = False
    with section("check: fast path vs our network vs transformers, layer by layer, fp32"):
        check_ok = run_check(SMALL if small else BIG, device, small, args.skip_hf)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()

    model = None
    with section("build model (random weights on the device)"):
        t0 = time.time()
        model = build_model(config, device, dtype)
        sync(device)
        n, nbytes = model.num_parameters(), weight_bytes(model)
        log(f"built in {time.time() - t0:.1f} s: {n:,} parameters = {n / 1e9:.3f} B, {nbytes / 1e9:.2f} GB")
        if not small:
            log(
                f"DESIGN §2: {DESIGN_PARAMS / 1e9:.2f} B, {DESIGN_BYTES / 1e9:.1f} GB  -> ratio {n / DESIGN_PARAMS:.4f}"
            )
            log(f"GPU memory allocated: {torch.cuda.memory_allocated() / 1e9:.1f} GB")
    if model is None:
        return 1
    counts = byte_counts(model, context_len)
    g = torch.Generator(device="cpu").manual_seed(1)
    context = torch.randint(16, config.vocab_size, (1, context_len), generator=g).to(device)
    max_len = context_len + 2 * config.canvas_length + args.ar_tokens + 256

    fast = None
    with section("fast path over the benchmark model"):
        fast = FastDiffusionGemma(model, max_len=max_len, bucket=256 if not small else 16, compile=False)
        log(f"expert implementation: {fast.moe}; CUDA graphs: {fast.use_graphs}")

    if fast is not None:
        with section("(a) our engine: fixed-step denoising, CUDA graphs, eager kernels"):
            run_diffusion(fast, context, args.steps, args.reps, "ours")
        with section("(c) our engine: autoregressive decode, CUDA graphs, eager kernels"):
            run_ar(fast, context, args.ar_tokens if not small else 24, args.reps, "ours")
        if device.type == "cuda":
            log(f"GPU memory peak so far: {torch.cuda.max_memory_allocated() / 1e9:.1f} GB")

    if not args.skip_hf:
        with section("(b) transformers generate on the same weights"):
            hf, shared = transformers_view(model)
            log(f"transformers model shares our tensors: {shared}")
            hf_generate(hf, context, 2)  # warm-up
            times = {}
            for steps in sorted(set(args.steps)):
                times[steps] = med(
                    timed(lambda steps=steps: hf_generate(hf, context, steps), device, args.hf_reps, 0)
                )
                log(f"[hf] generate, {steps} fixed steps incl. prefill: {times[steps] * 1e3:.0f} ms")
            lo, hi = min(times), max(times)
            if hi > lo:
                ms_step = (times[hi] - times[lo]) / (hi - lo) * 1e3
                prefill = times[lo] * 1e3 - lo * ms_step
                RESULTS["hf_ms_step"] = ms_step
                log(
                    f"[hf] {ms_step:.1f} ms/step (difference of the two runs), prefill about {prefill:.0f} ms"
                )
                for steps in times:
                    tok_s = config.canvas_length / (steps * ms_step / 1e3)
                    RESULTS[f"hf_tok_s_{steps}"] = tok_s
                    log(f"[hf] {steps} steps: {tok_s:.0f} tok/s (denoising only)")
            del hf

    with section("summary (before the torch.compile sections)"):
        summarize(counts, bandwidth, config, args.steps)
    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(max(1, int(args.hard_limit_s - (time.time() - START))))

    if fast is not None and args.compile in ("on", "both") and time.time() - START < args.budget_s:
        del fast
        fast = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        with section("(a') our engine with torch.compile'd layers"):
            fast = FastDiffusionGemma(
                model, max_len=max_len, bucket=256 if not small else 16, compile=not small
            )
            run_diffusion(fast, context, args.steps, args.reps, "ours_compiled")
        if fast is not None and time.time() - START < args.budget_s:
            with section("(c') our AR decode with torch.compile'd layers"):
                run_ar(fast, context, args.ar_tokens if not small else 24, args.reps, "ours_compiled")
    elif args.compile != "off":
        log("\n(skipping the torch.compile sections: time budget)")

    signal.alarm(0)
    with section("summary"):
        log(f"correctness check (fp32, layer by layer): {'passed' if check_ok else 'FAILED'}")
        summarize(counts, bandwidth, config, args.steps)
    log(f"\ntotal wall time {time.time() - START:.0f} s")
    if not check_ok:
        log("the correctness check FAILED (see the check section): exit status 1")
        return 1
    return 0


def out_of_time(signum, frame) -> None:
    raise TimeoutError("hard time limit reached (--hard-limit-s)")


def summarize(counts: dict[str, float], bandwidth: float, config: ModelConfig, steps_list) -> None:
    length = config.canvas_length
    floor_w = counts["diff_weights"] / bandwidth * 1e3
    floor_d = counts["diff_all"] / bandwidth * 1e3
    floor_ar = counts["ar_all"] / bandwidth * 1e3
    log(f"measured copy bandwidth {bandwidth / 1e12:.3f} TB/s")
    log(f"experts a {length}-token canvas touches (uniform routing): {counts['touched'] * 100:.3f}%")
    log(
        f"diffusion step floor: {counts['diff_weights'] / 1e9:.2f} GB of weights -> {floor_w:.2f} ms "
        f"(DESIGN's definition); with the embedding read twice and the KV cache: "
        f"{counts['diff_all'] / 1e9:.2f} GB -> {floor_d:.2f} ms"
    )
    log(
        f"AR token floor: {counts['ar_all'] / 1e9:.2f} GB (top-{config.top_k_experts} experts, LM head, KV) -> {floor_ar:.3f} ms"
    )
    log("")
    log("| path | ms/step or ms/token | tok/s @16 | tok/s @48 | floor ms | share of floor |")
    log("|---|---|---|---|---|---|")
    for tag in ("ours", "ours_compiled"):
        s16 = RESULTS.get(f"{tag}_ms_step_16")
        if s16 is not None:
            t16 = RESULTS.get(f"{tag}_tok_s_16", float("nan"))
            t48 = RESULTS.get(f"{tag}_tok_s_48", float("nan"))
            log(f"| {tag} diffusion | {s16:.2f} | {t16:.0f} | {t48:.0f} | {floor_w:.2f} / {floor_d:.2f} | "
                f"{floor_w / s16 * 100:.0f}% / {floor_d / s16 * 100:.0f}% |")  # fmt: skip
        ar = RESULTS.get(f"{tag}_ms_ar")
        if ar is not None:
            log(
                f"| {tag} AR | {ar:.3f} | {1e3 / ar:.0f} tok/s | | {floor_ar:.3f} | {floor_ar / ar * 100:.0f}% |"
            )
    if "hf_ms_step" in RESULTS:
        hf = RESULTS["hf_ms_step"]
        log(f"| transformers generate | {hf:.1f} | {RESULTS.get('hf_tok_s_16', float('nan')):.0f} | "
            f"{RESULTS.get('hf_tok_s_48', float('nan')):.0f} | {floor_w:.2f} | {floor_w / hf * 100:.0f}% |")  # fmt: skip
    log("")
    for tag in ("ours", "ours_compiled"):
        ar = RESULTS.get(f"{tag}_ms_ar")
        for steps in steps_list:
            step = RESULTS.get(f"{tag}_ms_step_{steps}")
            if ar and step:
                ratio = (length / (steps * step)) / (1 / ar)
                bound = (length / (steps * floor_d)) / (1 / floor_ar)
                log(
                    f"{tag}: diffusion/AR at {steps} steps = {ratio:.2f}x (bandwidth-bound ratio {bound:.2f}x)"
                )
        if "hf_ms_step" in RESULTS and RESULTS.get(f"{tag}_ms_step_16"):
            log(
                f"{tag}: speed-up over transformers generate = {RESULTS['hf_ms_step'] / RESULTS[f'{tag}_ms_step_16']:.1f}x"
            )
    log(
        "why: a step of a 256-token canvas reads nearly every expert, an AR token only its top-k, so the "
        "bound ratio is (tokens per step / weight bytes per step) over (1 / bytes per AR token)"
    )


if __name__ == "__main__":
    sys.exit(main())
