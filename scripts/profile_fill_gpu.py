"""Where a single-line inline fill's wall time goes on the GPU: host work against decoder passes (issue 32).

    source scripts/device_env.sh; python3 scripts/profile_fill_gpu.py --out $OUT/profile_fill.txt
    python scripts/profile_fill_gpu.py --shape tiny --device cpu --fills 2     (the pipeline on the CPU)

The engine is loaded as `dfim serve --device cuda` loads it (random bf16 weights of the 26B-A4B shape made on
the device, the fast path with CUDA graphs) and runs the server's single-line inline request while typing: the
context cached, `inline.candidates` canvases of 32 tokens, `sampling.maxSteps` steps, a stop at the line's
end, and the trace recorder's `on_step` as the server installs it on every fill. Printed:

- a fill's wall time with the recorder and without it, and its steps;
- the decoder passes alone, the same canvas batch replayed from the fast path's graph as often: what the
  fill's passes cost with no host work between them;
- `--model`: a trained checkpoint instead (the shipped one: `default`), drafting single lines where it does;
- torch.profiler over a few fills: the host's ops by their own time, and the waits for the device
  (`cudaStreamSynchronize`, device-to-host copies);
- cProfile over a few fills: the Python functions by their own time;
- on CUDA, the host's reads of the device in one fill (torch's sync debug mode), by line;
- `--experts fp8`: the random shape's experts in FP8, as an FP8 checkpoint's load on a GPU.

The gap between the first two is the host work a fill adds to its passes.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gpu import Tee  # noqa: E402
from bench_gpu_server import write_folder  # noqa: E402

from dfim.engine.api import FillRequest  # noqa: E402
from dfim.engine.inference.fill import Engine  # noqa: E402
from dfim.engine.inference.trace import Recorder  # noqa: E402
from dfim.engine.model.fast import FastDiffusionGemma  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "scripts" / "data" / "typing.py.txt"
MAX_FRAMES = 256  # the server's trace keeps this many steps (server/trace_feature.py)


def load(shape: str, device: str, folder: Path, model: str | None, experts: str = "bf16") -> Engine:
    """The engine as `dfim serve` loads it: a trained checkpoint (`model`), else the benchmark's random folder
    of `shape` (`bench_gpu_server.write_folder`)."""
    if model is not None:
        return Engine.load(None if model == "default" else model, device=device)
    return Engine.load(write_folder(folder, shape, device, draft=False, experts=experts), device=device)


def typing_request(
    engine: Engine, candidates: int, steps: int, recorder: bool, typed: int = 0
) -> FillRequest:
    """The server's inline request in the middle of a line three quarters into the file, after `typed`
    more characters of it (0: the same context as the last request, all of it cached)."""
    text = SOURCE.read_text()
    lines = text.split("\n")
    row = 3 * len(lines) // 4
    while len(lines[row].strip()) < 12:
        row += 1
    cut = sum(len(line) + 1 for line in lines[:row]) + len(lines[row]) // 2
    start = max(0, cut - 3500)  # the context's start stays, as in the server
    # a single line is drafted where the checkpoint drafts (the server then asks for one canvas)
    drafted = engine.settings.draft and not engine.is_random
    settings = replace(engine.settings, max_steps=steps, draft=drafted)
    request = FillRequest(
        # about the server's context budget (~1,150 tokens); what is typed goes in before the same suffix
        prefix=text[start : cut + typed],
        suffix=text[cut : cut + 1000],
        max_tokens=32,
        settings=settings,
        stop=("\n",),
        candidates=1 if drafted else candidates,
        seed=0,
    )
    if recorder:
        tok = engine.tokenizer
        request.on_step = Recorder(tok.eos_id, tok.pad_id, MAX_FRAMES).on_step
    return request


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str, n: int, answered: bool = False) -> list[float]:
    """Wall times of `fn`, each started on an idle device. `answered`: stop the clock when `fn` returns (a
    fill's answer is on the host by then, which is what a user waits for), else when the device is done too."""
    out = []
    for _ in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn()
        if not answered:
            sync(device)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def host_reads(fn: Callable[[], object]) -> tuple[int, list[tuple[int, str]]]:
    """The device-to-host waits `fn` makes (torch's sync debug mode): how many, and where, by count."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = Counter(
        f"{Path(w.filename).relative_to(ROOT) if w.filename.startswith(str(ROOT)) else w.filename}:{w.lineno}"
        for w in caught
        if "synchroniz" in str(w.message)
    )
    return sum(sites.values()), [(n, site) for site, n in sites.most_common()]


def summary(ms: list[float]) -> str:
    return f"p50 {statistics.median(ms):.1f} ms  min {min(ms):.1f}  max {max(ms):.1f}  (n={len(ms)})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=("26b-a4b", "tiny"), default="26b-a4b")
    parser.add_argument(
        "--model", help="a checkpoint folder, or 'default' (the shipped model), instead of --shape"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--fills", type=int, default=12)
    parser.add_argument("--candidates", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--experts", choices=("bf16", "fp8"), default="bf16", help="the random shape's experts' weights"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = Tee(str(args.out) if args.out else None)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        engine = load(args.shape, args.device, Path(tmp) / "ckpt", args.model, args.experts)
        report(f"engine loaded in {time.perf_counter() - t0:.1f} s: {engine.path_info()}")

        def fill(recorder: bool) -> Callable[[], object]:
            return lambda: engine.fill(typing_request(engine, args.candidates, args.steps, recorder))

        first = engine.fill(typing_request(engine, args.candidates, args.steps, True))
        report(f"first fill {first.latency_ms:.0f} ms (graphs captured), {first.steps} steps, {first.text!r}")
        for _ in range(3):
            engine.fill(typing_request(engine, args.candidates, args.steps, True))
        result = engine.fill(typing_request(engine, args.candidates, args.steps, True))
        steps = result.steps
        report(
            f"fill: {result.context_tokens} context tokens, {result.encoded_tokens} encoded, {steps} steps"
        )
        report(f"  with the trace recorder   {summary(timed(fill(True), args.device, args.fills, True))}")
        report(f"  without it                {summary(timed(fill(False), args.device, args.fills, True))}")
        if args.device == "cuda":
            for recorder in (False, True):
                count, sites = host_reads(fill(recorder))
                report(f"  host reads of one fill {'with' if recorder else 'without'} the recorder: {count}")
                for n, site in sites:
                    report(f"    {n:4d}  {site}")
        typed = iter(range(3, 3 * (args.fills + 2), 3))

        def typing() -> None:
            request = typing_request(engine, args.candidates, args.steps, True, next(typed))
            encoded.append(engine.fill(request).encoded_tokens)

        encoded: list[int] = []
        typing_ms = timed(typing, args.device, args.fills, True)
        report(f"  typing 3 characters a fill {summary(typing_ms)}, tokens encoded {encoded}")
        with torch.inference_mode():
            cache = engine.cache_for("main")
            held = list(cache.ids)
            fast = engine.fast_backend().fast if engine.fast else None
            for n in (3, 16, 64, 1024):
                if n > len(held):
                    continue

                def encode(n: int = n) -> None:
                    runner, cache.runner = cache.runner, None  # the plain network's encoder
                    try:
                        cache.truncate(len(held) - n)
                        cache.prepare(held)
                    finally:
                        cache.runner = runner

                report(f"  plain encoder, {n:4d} new tokens: {summary(timed(encode, args.device, 5))}")
                if fast is not None:

                    def fast_encode(n: int = n, fast: FastDiffusionGemma = fast) -> None:
                        fast.truncate(len(held) - n)
                        fast.encode(torch.tensor([held[-n:]], device=engine.device))

                    report(f"  fast path's encode:        {summary(timed(fast_encode, args.device, 5))}")
                    engine.fast_backend().held = []  # its rows are no longer the plain encoder's

        # the decoder passes alone: the fill's canvas batch, replayed as often as the fill stepped
        def passes() -> None:
            for _ in range(steps):
                denoiser(canvas, cond)

        with torch.inference_mode():
            cache = engine.cache_for("main")
            denoiser = engine._denoiser(cache, 32)
            vocab = engine.tokenizer.vocab_size
            rows = typing_request(engine, args.candidates, args.steps, False).candidates
            canvas = torch.randint(0, vocab, (rows, 32), device=engine.device)
            logits = denoiser(canvas, None)
            cond = torch.softmax(logits.float(), dim=-1).to(logits.dtype)
            passes()
            report(f"  {steps} decoder passes alone {summary(timed(passes, args.device, args.fills))}")

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(3):
                fill(True)()
            sync(args.device)
        table = prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60
        )
        report("\n== torch.profiler, 3 fills, host ops by self time\n" + table)
        waits = [
            e
            for e in prof.key_averages()
            if "Synchronize" in e.key
            or "Memcpy" in e.key
            or e.key in ("aten::item", "aten::_local_scalar_dense", "aten::nonzero")
        ]
        for e in waits:
            report(f"  {e.key}: {e.count} calls, {e.cpu_time_total / 1000:.1f} ms host")

        stats = io.StringIO()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            fill(True)()
        sync(args.device)
        pr.disable()
        pstats.Stats(pr, stream=stats).sort_stats("tottime").print_stats(45)
        report("\n== cProfile, 3 fills, by own time\n" + stats.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
