"""Milliseconds per denoising step of a checkpoint on this CPU, with a ~1,100-token cached context.

One step is what `Engine.fill` repeats: one `model.denoise` pass over [cached context ; canvas] with
self-conditioning, then the sampler chain on its logits. Both halves are timed apart and together, for
canvas lengths 16/32/64 and 1 and 2 torch threads, median of `--repeats` steps after warm-up. The load
average is printed with every row because the development machine's 2 cores are shared: a row measured
under load says more about the neighbours than about the code.

    python scripts/bench_step_cpu.py [--model DIR] [--threads 1 2] [--canvas 16 32 64] [--repeats 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from dfim.engine import Engine
from dfim.engine.api import SamplerSettings
from dfim.engine.inference import sampler as sampler_mod
from dfim.engine.inference.sampler_state import Constraints
from dfim.engine.inference.sampler_steps import build_chain

SOURCE = (
    Path(__file__).resolve().parents[1] / "engine" / "inference" / "sampler.py"
)  # real code as the context


def median_ms(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(wall ms, process CPU ms), medians over `repeats` calls. On a shared machine the CPU time of a
    1-thread run is the steadier number (it does not count time spent waiting for a core); with 2 threads
    it adds both threads' time, spinning included."""
    for _ in range(3):  # warm-up: allocator, oneDNN primitive caches, thread pool start
        fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
    return statistics.median(walls), statistics.median(cpus)


def context_ids(engine: Engine, tokens: int) -> list[int]:
    ids = engine.tokenizer.encode(SOURCE.read_text())
    while len(ids) < tokens:  # repeat the file if it is short: only the length matters here
        ids = ids + ids
    return ids[:tokens]


def measure(engine: Engine, length: int, repeats: int) -> list[tuple[float, float]]:
    """(wall ms, CPU ms) of the model pass, the sampler chain and the whole step, one canvas row."""
    model, kv = engine.model, engine.cache.kv
    chain = build_chain(
        SamplerSettings(max_steps=10**6, early_stop=False)
    )  # never stops: every step is alike
    generator = torch.Generator().manual_seed(0)
    pinned = torch.zeros(length, dtype=torch.bool)
    rules = Constraints.build(
        pinned,
        torch.zeros(length, dtype=torch.long),
        vocab_size=engine.vocab_size,
        eos_id=engine.tokenizer.eos_id,
        pad_id=engine.tokenizer.pad_id,
        banned=engine.banned,
        no_end=torch.zeros(length, dtype=torch.bool),
    )
    state = sampler_mod.new_state(1, rules, generator=generator)
    logits = model.denoise(state.canvas, kv, None)
    sampler_mod.denoise_step(state, chain, logits)  # now state.self_cond is set, as in a fill

    def model_only() -> None:
        model.denoise(state.canvas, kv, state.self_cond)

    def sampler_only() -> None:
        sampler_mod.denoise_step(state, chain, logits)

    def step() -> None:
        sampler_mod.denoise_step(state, chain, model.denoise(state.canvas, kv, state.self_cond))

    return [median_ms(fn, repeats) for fn in (model_only, sampler_only, step)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--canvas", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--context", type=int, default=1100)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    engine = Engine.load(args.model)
    dtype = next(engine.model.parameters()).dtype
    print(f"model {engine.model_name}, torch {torch.__version__}, weights {dtype}, context {args.context}")
    print("| threads | canvas | model ms | sampler ms | step ms | step CPU ms | load avg |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        engine.cache.prepare(context_ids(engine, args.context))
        for threads in args.threads:
            torch.set_num_threads(threads)
            for length in args.canvas:
                (model_ms, _), (sampler_ms, _), (step_ms, step_cpu) = measure(engine, length, args.repeats)
                load = os.getloadavg()[0]
                print(
                    f"| {threads} | {length} | {model_ms:.1f} | {sampler_ms:.1f} | {step_ms:.1f} | {step_cpu:.1f} "
                    f"| {load:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
