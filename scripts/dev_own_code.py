"""A development set from this repository's own code: single-line fills, scored by EM and edit similarity.

Our code was never in the embedded model's training data (that was the GPU machine's Python packages)
and is not the shared evaluation set, so settings may be tried on it. Lines of 12-70 characters, no
comments or strings, at least 20 lines into a file; the cursor sits after the line's indentation.

    python scripts/dev_own_code.py [--model DIR] [--limit 100] [--prefix-chars 1200 --suffix-chars 500]
                                   [--set window=8 --set entropy_bound=0.3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine import Engine
from engine.api import FillRequest, SamplerSettings
from engine.evaluate import SWEEP_KEYS
from engine.metrics import edit_similarity, exact_match

ROOT = Path(__file__).resolve().parents[1]


def problems(seed: int = 7, per_file: int = 6) -> list[dict[str, str]]:
    rng = random.Random(seed)
    files = sorted([*ROOT.glob("engine/*.py"), *ROOT.glob("server/*.py"), *ROOT.glob("dfim/**/*.py")])
    out = []
    for path in files:
        lines = path.read_text(encoding="utf-8").split("\n")
        candidates = [
            i
            for i, line in enumerate(lines)
            if i > 20 and 12 <= len(line.strip()) <= 70 and not line.strip().startswith(("#", '"', "'"))
        ]
        for i in rng.sample(candidates, min(per_file, len(candidates))):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            prefix = "\n".join(lines[:i]) + "\n" + line[:indent]
            suffix = "\n" + "\n".join(lines[i + 1 :])
            out.append({"prefix": prefix, "suffix": suffix, "want": line[indent:]})
    rng.shuffle(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--steps", type=int, default=16, help="max denoising steps (the server's inline cap)")
    parser.add_argument("--prefix-chars", type=int, default=4000)
    parser.add_argument("--suffix-chars", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=32, help="canvas (the server's single-line one)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="sampler setting over the model's defaults (keys as in `dfim eval --sweep`), repeatable",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(args.model)
    changes: dict[str, object] = {"max_steps": args.steps}
    known = {k: v for k, v in SWEEP_KEYS.items() if v[0] in SamplerSettings.__dataclass_fields__}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in known:
            parser.error(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(known)}")
        field, parse = known[key.strip()]
        try:
            changes[field] = parse(value)
        except ValueError as err:
            parser.error(f"--set {item!r}: {err}")
    settings = replace(engine.settings, **changes)
    em, es, steps, ms = [], [], [], []
    for i, p in enumerate(problems()[: args.limit]):
        request = FillRequest(
            p["prefix"][-args.prefix_chars :],
            p["suffix"][: args.suffix_chars],
            max_tokens=args.max_tokens,
            seed=i,
            settings=settings,
            stop=("\n",),
        )
        start = time.perf_counter()
        result = engine.fill(request)
        ms.append((time.perf_counter() - start) * 1000)
        em.append(exact_match(result.text, p["want"]))
        es.append(edit_similarity(result.text, p["want"]))
        steps.append(result.steps)
    print(
        f"{engine.model_name} {' '.join(args.set) or 'model defaults'}, max {args.steps} steps: {len(em)} problems, EM {100 * statistics.mean(em):.1f}% "
        f"ES {statistics.mean(es):.1f} steps {statistics.mean(steps):.1f} median ms {statistics.median(ms):.0f}"
    )


if __name__ == "__main__":
    main()
