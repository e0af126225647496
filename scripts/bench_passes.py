"""What one network pass costs on this CPU: the pieces a fill is made of, warm, on a ~1.1k-token cache.

    python scripts/bench_passes.py [--model DIR] [--threads 1] [--repeat 15]

Prints, in milliseconds (median over `--repeat` runs):
- a causal pass of 1 / 2 / 4 / 8 / 16 new tokens after the cache (one drafted token; verified guesses or
  typed characters), logits for the last only;
- one drafted token as the draft runs it (`ContextCache.step`, the cache growing);
- one denoising step over a canvas of 8 / 16 / 32 / 64 rows;
- encoding a new document's context of 256 / 512 / 768 tokens from an empty cache.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_model_sizes import median_ms  # noqa: E402 (this folder is on sys.path when run as a script)

from engine import Engine  # noqa: E402
from engine.cache import ContextCache  # noqa: E402

SOURCE = ROOT / "engine" / "sampler.py"
CONTEXT = 1100


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    engine = Engine.load(args.model, threads=args.threads)
    model = engine.model
    ids = engine.tokenizer.encode(SOURCE.read_text())
    if len(ids) < CONTEXT + 40:
        raise SystemExit(f"{SOURCE} is too short for a {CONTEXT}-token context")
    print(f"model {engine.model_name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
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
            print(
                f"causal pass, {n:2d} new tokens after {CONTEXT}: {median_ms(causal(n), args.repeat):6.1f} ms"
            )

        position = [CONTEXT]

        def drafted_token() -> object:
            out = cache.step([ids[position[0]]])
            position[0] += 1
            return out

        print(f"one drafted token (ContextCache.step):  {median_ms(drafted_token, 30):6.1f} ms")
        cache.prepare(ids[:CONTEXT])
        for rows in (8, 16, 32, 64):
            canvas = torch.randint(
                16, model.config.vocab_size, (1, rows), generator=torch.Generator().manual_seed(0)
            )
            ms = median_ms(lambda canvas=canvas: model.denoise(canvas, cache.kv), args.repeat)
            print(f"denoising step, canvas of {rows:2d} rows:   {ms:6.1f} ms")
        for n in (256, 512, 768):
            ms = median_ms(lambda n=n: model.encode(torch.tensor([ids[:n]]), model.new_cache()), 3)
            print(f"encode a new context of {n} tokens:   {ms:6.1f} ms")


if __name__ == "__main__":
    main()
