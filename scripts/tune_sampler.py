"""Sweep sampler settings of a checkpoint on a development set (never on the shared evaluation set).

Prints exact match, edit similarity, mean steps and mean latency per setting. The default dev set is
our own fixture project's problems (`fixtures/realcode/problems.jsonl`), single-line ones only.

    python scripts/tune_sampler.py [--model DIR] [--kinds line] [--limit 40]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dfim.engine import Engine
from dfim.engine.api import FillRequest, SamplerSettings
from dfim.engine.evaluation.metrics import edit_similarity, exact_match

GRID = [
    # (label, settings)
    ("released 0.8->0.4 bound 0.1", SamplerSettings()),
    ("T 0.3->0.1 bound 0.1", SamplerSettings(t_max=0.3, t_min=0.1)),
    ("T 0.3->0.1 bound 0.5", SamplerSettings(t_max=0.3, t_min=0.1, entropy_bound=0.5)),
    ("T 0.3->0.1 bound 1.0", SamplerSettings(t_max=0.3, t_min=0.1, entropy_bound=1.0)),
    ("T 0.2->0.05 bound 2.0", SamplerSettings(t_max=0.2, t_min=0.05, entropy_bound=2.0)),
    ("T 0.5->0.2 bound 0.5", SamplerSettings(t_max=0.5, t_min=0.2, entropy_bound=0.5)),
]


def first_line(text: str) -> str:
    return text.split("\n", 1)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=None)
    parser.add_argument("--data", default="fixtures/realcode/problems.jsonl")
    parser.add_argument("--kinds", default="line")
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(args.model)
    kinds = set(args.kinds.split(","))
    rows = [json.loads(line) for line in open(args.data, encoding="utf-8")]
    rows = [r for r in rows if r["task_id"].rsplit(":", 1)[-1] in kinds][: args.limit]
    print(f"{len(rows)} problems from {args.data} ({args.kinds}); model {engine.model_name}")
    print("| settings | exact match % | edit sim | mean steps | mean ms |")
    print("|---|---|---|---|---|")
    for label, settings in GRID:
        em, es, steps, ms = [], [], [], []
        for i, row in enumerate(rows):
            start = time.perf_counter()
            result = engine.fill(
                FillRequest(
                    row["prompt"], row["suffix"], max_tokens=args.max_tokens, seed=i, settings=settings
                )
            )
            ms.append((time.perf_counter() - start) * 1000)
            want = row["canonical_solution"]
            got = first_line(result.text) if "\n" not in want.strip("\n") else result.text
            em.append(exact_match(got, want))
            es.append(edit_similarity(got, want))
            steps.append(result.steps)
        print(
            f"| {label} | {100 * statistics.mean(em):.1f} | {statistics.mean(es):.1f} | "
            f"{statistics.mean(steps):.1f} | {statistics.mean(ms):.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
