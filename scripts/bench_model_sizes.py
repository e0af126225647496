"""Print CPU latency of candidate model sizes (random weights): encode a context, denoise a canvas.

Used to choose the size of the shipped model: a single-line fill must answer in <= 100 ms p50 on
2 CPU cores with the context already cached. Usage: python scripts/bench_model_sizes.py [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from dfim.engine.model.config import ModelConfig
from dfim.engine.model.network import DiffusionGemma

CANDIDATES = {
    "h256-l6": dict(hidden_size=256, num_hidden_layers=6, intermediate_size=768, moe_intermediate_size=256),
    "h256-l8": dict(hidden_size=256, num_hidden_layers=8, intermediate_size=768, moe_intermediate_size=256),
    "h320-l8": dict(
        hidden_size=320,
        num_hidden_layers=8,
        intermediate_size=960,
        moe_intermediate_size=320,
        num_attention_heads=5,
        num_key_value_heads=1,
    ),
    "h384-l8": dict(
        hidden_size=384,
        num_hidden_layers=8,
        intermediate_size=1024,
        moe_intermediate_size=384,
        num_attention_heads=6,
    ),
}


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads={args.threads} context={args.context} torch={torch.__version__}")
    print(
        "| model | params (M) | bf16 MB | encode ctx ms | encode +8 tok ms | step L=16 ms | step L=32 ms | step L=64 ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, overrides in CANDIDATES.items():
        config = ModelConfig(**overrides)
        params, enc, more, steps = measure(config, args.context)
        print(
            f"| {name} | {params / 1e6:.1f} | {params * 2 / 1e6:.1f} | {enc:.0f} | {more:.1f} | "
            f"{steps[16]:.1f} | {steps[32]:.1f} | {steps[64]:.1f} |"
        )


@torch.inference_mode()
def measure(config: ModelConfig, context: int) -> tuple[int, float, float, dict[int, float]]:
    """(parameters, ms to encode the context, ms to encode 8 more tokens, ms per step by canvas length)."""
    model = DiffusionGemma(config).eval()
    model.init_weights()
    ids = torch.randint(0, config.vocab_size, (1, context))
    cache = model.new_cache()
    model.encode(ids, cache)

    def encode_more() -> None:
        cache.truncate(context)
        model.encode(ids[:, :8], cache)

    steps = {}
    for length in (16, 32, 64):
        canvas = torch.randint(0, config.vocab_size, (1, length))
        cache.truncate(context)
        steps[length] = median_ms(lambda c=canvas: model.denoise(c, cache, None), 10)
    enc = median_ms(lambda: model.encode(ids, model.new_cache()), 3)
    return model.num_parameters(), enc, median_ms(encode_more, 10), steps


if __name__ == "__main__":
    main()
