"""What one network pass costs on this CPU: the pieces a fill is made of, warm, on a ~1.1k-token cache.

    python scripts/bench_passes.py [--model DIR] [--threads 1] [--repeat 15] [--ab]

Prints, in milliseconds (median over `--repeat` runs):
- a causal pass of 1 / 2 / 4 / 8 / 16 new tokens after the cache (one drafted token; verified guesses or
  typed characters), logits for the last only;
- one drafted token as the draft runs it (`ContextCache.step`, the cache growing);
- one denoising step over a canvas of 8 / 16 / 32 / 64 / 128 rows;
- encoding a new document's context of 256 / 512 / 768 tokens from an empty cache.

`--ab` times every piece twice, interleaved: with fp32 products only, then with the fp16 weight copies the
engine uses for products of a few rows (`dfim.engine.model.network.PACKED_MAX_ROWS`, session 19).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_model_sizes import median_ms  # noqa: E402 (this folder is on sys.path when run as a script)

from dfim.engine import Engine  # noqa: E402
from dfim.engine.inference.cache import ContextCache  # noqa: E402
from dfim.engine.model import network as network  # noqa: E402

SOURCE = ROOT / "engine" / "inference" / "sampler.py"
CONTEXT = 1100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument(
        "--ab",
        action="store_true",
        help="each piece also with fp32 products only (no fp16 weight copies), interleaved: fp32 / fp16 ms",
    )
    args = parser.parse_args()
    engine = Engine.load(args.model, threads=args.threads)
    model = engine.model
    ids = engine.tokenizer.encode(SOURCE.read_text())
    if len(ids) < CONTEXT + 160:  # the drafted tokens of up to four rounds
        raise SystemExit(f"{SOURCE} is too short for a {CONTEXT}-token context")
    print(f"model {engine.model_name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    packed_rows = network.PACKED_MAX_ROWS
    modes = [0, packed_rows] if args.ab else [packed_rows]

    def timed(label: str, fn: Callable[[], object], repeat: int) -> None:
        # --ab: fp32, fp16, fp32, fp16, the median of each mode's two rounds (a shared machine drifts)
        rounds = {mode: [] for mode in modes}
        for _ in range(2 if args.ab else 1):
            for mode in modes:
                network.PACKED_MAX_ROWS = mode
                rounds[mode].append(median_ms(fn, repeat))
        network.PACKED_MAX_ROWS = packed_rows
        print(f"{label:44s}" + " / ".join(f"{statistics.median(rounds[m]):6.1f}" for m in modes) + " ms")

    with torch.inference_mode():
        cache = ContextCache(model)
        cache.prepare(ids[:CONTEXT])

        def causal(n: int) -> Callable[[], object]:
            def run() -> object:
                out = model.context_lm(torch.tensor([ids[CONTEXT : CONTEXT + n]]), cache.kv, last=1)
                cache.kv.truncate(CONTEXT)
                return out

            return run

        for n in (1, 2, 4, 8, 16):
            timed(f"causal pass, {n:2d} new tokens after {CONTEXT}:", causal(n), args.repeat)

        position = [CONTEXT]

        def drafted_token() -> object:
            out = cache.step([ids[position[0]]])
            position[0] += 1
            return out

        timed("one drafted token (ContextCache.step):", drafted_token, 30)
        cache.prepare(ids[:CONTEXT])
        for rows in (8, 16, 32, 64, 128):
            canvas = torch.randint(
                16, model.config.vocab_size, (1, rows), generator=torch.Generator().manual_seed(0)
            )
            timed(
                f"denoising step, canvas of {rows:3d} rows:",
                lambda c=canvas: model.denoise(c, cache.kv),
                args.repeat,
            )
        for n in (256, 512, 768):
            timed(
                f"encode a new context of {n} tokens:",
                lambda n=n: model.encode(torch.tensor([ids[:n]]), model.new_cache()),
                3,
            )


if __name__ == "__main__":
    main()
