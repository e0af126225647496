"""Does the engine alone keep native memory? Fills in a loop, without the server, with glibc's heap sampled.

    python scripts/leak_probe.py [--model PATH] [--fills 3000] [--every 100] [--mode inline|action|mixed]

Types the fixture files one character at a time (as scripts/soak.py does) and runs the fill an inline
request would (one line, `\\n` stop, the server's step budget) at each cursor; `--mode action` runs block
fills from a warm start in their own cache slot instead, `mixed` alternates (one action fill in ten, its
inline fills nested at its step boundaries as the server runs them). Every `--every` fills it prints the
fills done, RSS, and glibc's heap in use / free / mmapped (`dfim.server.engine_host.heap_usage`), and at
the end the slope of "in use" over the second half. A slope near zero says the soak's growth comes from
the server's side; a steady slope says the engine keeps memory.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfim.engine.api import FillRequest, SamplerSettings  # noqa: E402
from dfim.engine.inference.fill import Engine  # noqa: E402
from dfim.server.engine_host import heap_usage  # noqa: E402

MB = 2**20


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope, per 1,000 fills (nan with fewer than 2 points)."""
    if len(points) < 2:
        return float("nan")
    return statistics.linear_regression([x for x, _ in points], [y for _, y in points]).slope * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--fills", type=int, default=3000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--mode", choices=("inline", "action", "mixed"), default="mixed")
    parser.add_argument("--steps", type=int, default=8, help="max denoising steps of an inline fill")
    args = parser.parse_args(argv)

    engine = Engine.load(args.model)
    sources = [p.read_text(encoding="utf-8") for p in sorted((ROOT / "fixtures").glob("example.*"))]
    docs = ["" for _ in sources]
    pos = [0 for _ in sources]
    inline_settings = SamplerSettings(max_steps=args.steps, window=8)
    action_settings = SamplerSettings(max_steps=16, window=8)
    samples: list[tuple[int, float]] = []
    started = time.perf_counter()

    def inline_fill(i: int) -> None:
        d = i % len(sources)
        src = sources[d]
        docs[d] += src[pos[d] % len(src)]
        pos[d] += 1
        if len(docs[d]) > 400:  # the soak's revert: documents stay the same size
            docs[d] = ""
        text = src + "\n" + docs[d]
        engine.fill(
            FillRequest(
                prefix=text, suffix="\n", max_tokens=32, settings=inline_settings, stop=("\n",), seed=i
            )
        )

    done = 0
    for i in range(args.fills):
        if args.mode == "inline" or (args.mode == "mixed" and i % 10):
            inline_fill(i)
        else:
            src = sources[i % len(sources)]
            cut = (i * 37) % max(1, len(src) - 40)
            nested = [0]

            def between(i: int = i, nested: list[int] = nested) -> None:
                # the server's urgent inline fills, at the action's step boundaries
                if args.mode == "mixed" and nested[0] < 3:
                    nested[0] += 1
                    inline_fill(i * 7 + nested[0])

            engine.fill(
                FillRequest(
                    prefix=src[:cut],
                    suffix=src[cut + 40 :],
                    warm_start=src[cut : cut + 40],
                    max_tokens=64,
                    settings=action_settings,
                    seed=i,
                    cache_slot="action",
                    between_steps=between,
                )
            )
        done += 1
        if done % args.every == 0:
            heap = heap_usage() or {}
            samples.append((done, heap.get("in_use", float("nan"))))
            print(
                f"{done:6d} fills {time.perf_counter() - started:7.0f} s  RSS {rss_mb():7.1f} MB  heap in use "
                f"{heap.get('in_use')} free {heap.get('free')} mmapped {heap.get('mmapped')} MB",
                flush=True,
            )
    half = samples[len(samples) // 2 :]
    print(f"heap in use, slope over the second half: {slope(half):+.2f} MB per 1,000 fills")
    return 0


if __name__ == "__main__":
    sys.exit(main())
