"""One core vs adaptive threads (dfim.engine.model.threads) for server-like single-line fills on this CPU.

Each request is filled twice in one process, interleaved: with the engine's base thread count and with
`AdaptiveThreads` (every core while the other processes are idle). "cold" requests cut a different place of
a file, so the whole context (~512 tokens after the window) is encoded; "warm" requests type on at one
place, so the context comes from the cache. Run it on a quiet machine, then with a busy neighbour
(`python3 -c 'while True: pass' &`): the adaptive side should then fall back to the base count.

    python scripts/bench_threads.py [--requests 12] [--file engine/inference/sampler.py]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

from dfim.engine import Engine
from dfim.engine.api import FillRequest
from dfim.engine.model.threads import AdaptiveThreads, usable_cores

ROOT = Path(__file__).resolve().parents[1]


def make_request(text: str, at: int, typed: int, seed: int, settings) -> FillRequest:
    """The rest of the line at `at` is missing (a line being typed); `typed` more characters of it are in."""
    end = text.index("\n", at)
    return FillRequest(
        text[max(0, at - 1800) : at + typed],
        text[end : end + 600],
        max_tokens=32,
        seed=seed,
        settings=settings,
        stop=("\n",),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--file", type=Path, default=ROOT / "engine" / "inference" / "sampler.py")
    parser.add_argument("--steps", type=int, default=16, help="max denoising steps (the server's inline cap)")
    args = parser.parse_args()
    engine = Engine.load(None)
    if engine.threads is None:
        raise SystemExit("no adaptive threads here (one core, or DFIM_THREADS / OMP_NUM_THREADS set)")
    adaptive: AdaptiveThreads = engine.threads
    settings = dataclasses.replace(engine.settings, max_steps=args.steps)
    text = args.file.read_text(encoding="utf-8")
    lines = text.split("\n")
    rows: dict[tuple[str, str], list[float]] = {}
    used: list[int] = []
    encoded: dict[str, list[int]] = {}
    for i in range(args.requests):
        line = 40 + i * max(1, (len(lines) - 80) // args.requests)
        at = sum(len(x) + 1 for x in lines[:line]) + len(lines[line]) - len(lines[line].lstrip()) + 3
        for kind in ("cold", "warm"):
            for side in ("base", "adaptive"):
                engine.threads = adaptive if side == "adaptive" else None
                engine.cache.reset()
                if kind == "warm":  # the place's context in the cache first, then three characters typed
                    engine.fill(make_request(text, at, 0, i, settings))
                request = make_request(text, at, 3 if kind == "warm" else 0, i, settings)
                start = time.perf_counter()
                result = engine.fill(request)
                rows.setdefault((kind, side), []).append((time.perf_counter() - start) * 1000)
                if side == "adaptive":
                    used.append(result.threads)
                encoded.setdefault(kind, []).append(result.encoded_tokens)
            time.sleep(0.6)  # a look needs half a second since the previous one
    print(
        f"{usable_cores()} cores, base {adaptive.base} thread(s), adaptive up to {adaptive.wide}; "
        f"adaptive fills ran with {statistics.mean(used):.2f} threads on average"
    )
    print("| requests | base p50 / p95 ms | adaptive p50 / p95 ms | speed-up (p50) |")
    print("|---|---|---|---|")
    for kind in ("cold", "warm"):
        b, a = sorted(rows[(kind, "base")]), sorted(rows[(kind, "adaptive")])
        p95 = lambda xs: xs[min(len(xs) - 1, int(len(xs) * 0.95))]  # noqa: E731
        print(
            f"| {kind} ({len(b)}, {statistics.mean(encoded[kind]):.0f} tokens encoded) | {statistics.median(b):.0f} / {p95(b):.0f} | "
            f"{statistics.median(a):.0f} / {p95(a):.0f} | {statistics.median(b) / statistics.median(a):.2f}x |"
        )


if __name__ == "__main__":
    main()
