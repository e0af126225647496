"""Single-line fill latency of a checkpoint on this CPU, warm, with a ~1k-token context (issue 3).

Simulates typing lines in a frozen copy of one of our files: each request adds the next few characters
of the real line, so the context comes from the KV cache except the newly typed tokens. Prints p50/p95
latency, mean denoising steps and encoded tokens per request for the released sampler defaults (16
positions, no stop), and for what the server asks for a single line (32 positions, its step cap, a
stop at the newline): two canvases from noise ranked by the model, and the checkpoint's draft on one
canvas (decision 38; where its sampler drafts). Until session 15 the server rows asked for 16 positions,
fewer than the server does: lines longer than that were drafted only in part and rewritten.

Every request runs the engine, as in earlier sessions, but the server would not: where the characters just
typed are the start of the previous request's line, it answers from that suggestion (`dfim.server.inline.
typed_ahead`, no fill). The last two columns split those off: how many there were, and the p50 of the
requests that do reach the engine (the user typed something else), the harder half.

    python scripts/bench_latency.py [--model DIR] [--threads N] [--requests 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from dfim.engine import Engine
from dfim.engine.api import FillRequest
from dfim.engine.evaluation.metrics import percentile
from dfim.server.context import MAX_TOKENS
from dfim.server.inline_plan import ShownSuggestion, typed_ahead
from dfim.server.options import SamplingOptions

# The file typed into: a frozen copy of engine/inference/sampler.py (as of 79e2a05), ~1k tokens before the cursor.
# Frozen because the workload must not change with the code under test (typing into the live
# sampler.py, a docstring edit once turned 2.6 mean steps into 8.3). Named .txt: it is data, not code to
# lint or deduplicate.
SOURCE = Path(__file__).resolve().parent / "data" / "typing.py.txt"


def typing_points(text: str, requests: int, prefix_chars: int) -> list[tuple[str, str]]:
    """(prefix, suffix) pairs of someone typing lines in the middle of the file, 3 characters at a time:
    the prefix grows at its end, the suffix (the text after the line being typed) stays the same, and the
    prefix window starts at a fixed line, as the server's does while the user types."""
    cut = text.index("\n", len(text) // 2) + 1
    start = text.index("\n", max(0, cut - prefix_chars)) + 1
    points: list[tuple[str, str]] = []
    while len(points) < requests and cut < len(text):
        end = text.index("\n", cut) + 1
        line = text[cut:end]
        for k in range(3, len(line), 3):
            points.append((text[start:cut] + line[:k], text[end:]))
        cut = end
    return points[:requests]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--threads", type=int, default=None, help="default: the engine's choice")
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--prefix-chars", type=int, default=3600, help="about 1k tokens of context")
    parser.add_argument(
        "--source", type=Path, default=SOURCE, help="the file typed into (default scripts/data/typing.py.txt)"
    )
    args = parser.parse_args()
    engine = Engine.load(args.model, threads=args.threads)
    text = args.source.read_text()
    points = typing_points(text, args.requests + 1, args.prefix_chars)
    print(f"model {engine.model_name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(
        "| sampler | requests | p50 ms | p95 ms | mean steps | mean encoded tokens | context tokens "
        "| answered from the shown line | p50 ms of the rest |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    inline = replace(engine.settings, max_steps=SamplingOptions().max_steps, draft=False)  # the server's cap
    line = MAX_TOKENS["line"]  # the positions the server asks for a single line
    configs = [
        ("released defaults (max 48 steps)", replace(engine.settings, draft=False), (), 1, 16),
        ("server inline, 2 canvases from noise", inline, ("\n",), 2, line),
    ]
    if engine.settings.draft:
        configs.append(
            ("server inline, the draft on 1 canvas", replace(inline, draft=True), ("\n",), 1, line)
        )
    for label, settings, stop, candidates, max_tokens in configs:
        times, steps, encoded, context, reach = [], [], [], [], []
        shown: ShownSuggestion | None = None
        for i, (prefix, suffix) in enumerate(points):
            request = FillRequest(
                prefix=prefix,
                suffix=suffix[:400],
                max_tokens=max_tokens,
                settings=settings,
                seed=i,
                stop=stop,
                candidates=candidates,
            )
            start = time.perf_counter()
            result = engine.fill(request)
            elapsed = (time.perf_counter() - start) * 1000
            from_shown = typed_ahead(shown, prefix, suffix) is not None
            shown = ShownSuggestion("", prefix, suffix, result.text.split("\n")[0])
            if i == 0:
                continue  # the cold request encodes the whole context
            times.append(elapsed)
            if not from_shown:
                reach.append(elapsed)
            steps.append(result.steps)
            encoded.append(result.encoded_tokens)
            context.append(result.context_tokens)
        print(
            f"| {label} | {len(times)} | {percentile(times, 50):.0f} | {percentile(times, 95):.0f} | "
            f"{statistics.mean(steps):.1f} | {statistics.mean(encoded):.1f} | {statistics.mean(context):.0f} | "
            f"{len(times) - len(reach)} | {percentile(reach, 50):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
