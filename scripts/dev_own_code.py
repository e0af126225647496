"""A development set from this repository's own code: single-line fills, scored by EM and edit similarity.

Our code was never in the embedded model's training data (that was the GPU machine's Python packages)
and is not the shared evaluation set, so settings may be tried on it. Lines of 12-70 characters, no
comments or strings, at least 20 lines into a file; the cursor sits after the line's indentation
(`--kind midline`: after a random part of the line's code, the rest of the line is missing).

`--kind multiline` asks as the server does on a blank line (its "multiline" mode: 64-token canvas, no stop
string): the lines from there to the next blank line or dedent (1-3 of them) are missing, and the fill is
scored on its first line (what a user takes first) and on as many lines as are missing.

`--kind block` (through the server: `scripts/eval_through_server.py --dev --kind block`): the cursor at the
end of a line that opens a block, the block's first 2-6 lines missing, scored on all of them.

    python scripts/dev_own_code.py [--model DIR] [--limit 100] [--prefix-chars 1200 --suffix-chars 500]
                                   [--kind line|midline|multiline] [--set window=8 --set entropy_bound=0.3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from dfim.engine import Engine
from dfim.engine.api import FillRequest, SamplerSettings
from dfim.engine.evaluation.fim import SWEEP_KEYS
from dfim.engine.evaluation.metrics import edit_similarity, exact_match

ROOT = Path(__file__).resolve().parents[1]
# The files lines are drawn from (globs under the source root): our own Python.
OWN_CODE = ("engine/**/*.py", "server/*.py", "dfim/**/*.py")
# Lines never asked: comments and strings (Python; other languages also C-like comments).
PYTHON_SKIP = ("#", '"', "'")
OTHER_SKIP = (*PYTHON_SKIP, "//", "/*", "*")


def problems(
    seed: int = 7,
    per_file: int = 6,
    kind: str = "line",
    root: Path = ROOT,
    patterns: tuple[str, ...] = OWN_CODE,
) -> list[dict[str, str]]:
    if kind == "block":
        return block_problems(seed, per_file, root, patterns)
    if kind == "closed":
        return closed_problems(seed, per_file, root, patterns)
    rng = random.Random(seed)
    files = sorted({path for pattern in patterns for path in root.glob(pattern) if path.is_file()})
    out = []
    for path in files:
        lines = path.read_text(encoding="utf-8").split("\n")
        skip = PYTHON_SKIP if path.suffix == ".py" else OTHER_SKIP
        candidates = [
            i
            for i, line in enumerate(lines)
            if i > 20 and 12 <= len(line.strip()) <= 70 and not line.strip().startswith(skip)
        ]
        for i in rng.sample(candidates, min(per_file, len(candidates))):
            line = lines[i]
            indent = len(line) - len(line.lstrip())
            end = i + 1
            if kind == "multiline":  # the lines after it at its indentation or deeper, up to 3 in all
                while end < min(i + 3, len(lines)) and lines[end].strip() and _indent(lines[end]) >= indent:
                    end += 1
            # The cursor: after the indentation, or for "midline" after some of the line's code (a user who
            # typed part of the line; the cut may fall inside a name, as when typing).
            cut = rng.randrange(indent + 1, len(line)) if kind == "midline" else indent
            prefix = "\n".join(lines[:i]) + "\n" + line[:cut]
            suffix = "\n" + "\n".join(lines[end:])
            out.append({"prefix": prefix, "suffix": suffix, "want": "\n".join(lines[i:end])[cut:]})
    rng.shuffle(out)
    return out


CLOSERS = ")]}\"';,:"


def closed_problems(
    seed: int = 7, per_file: int = 6, root: Path = ROOT, patterns: tuple[str, ...] = OWN_CODE
) -> list[dict[str, str]]:
    """As "midline", on lines whose code ends with closers or punctuation (`)`, `");`, `],`): those stay after
    the cursor, as an editor that closes brackets leaves them; missing is the code between."""
    rng = random.Random(seed)
    files = sorted({path for pattern in patterns for path in root.glob(pattern) if path.is_file()})
    out = []
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        skip = PYTHON_SKIP if path.suffix == ".py" else OTHER_SKIP
        candidates = []
        for i, line in enumerate(lines):
            code = line.rstrip()
            closers = len(code) - len(code.rstrip(CLOSERS))
            start = len(line) - len(line.lstrip())
            if i > 20 and 12 <= len(line.strip()) <= 70 and not line.strip().startswith(skip):
                if closers and len(code) - closers - start >= 2:
                    candidates.append((i, len(code) - closers))
        for i, close_at in rng.sample(candidates, min(per_file, len(candidates))):
            line = lines[i]
            cut = rng.randrange(len(line) - len(line.lstrip()) + 1, close_at)
            prefix = "\n".join(lines[:i]) + "\n" + line[:cut]
            suffix = line[close_at:] + "\n" + "\n".join(lines[i + 1 :])
            out.append({"prefix": prefix, "suffix": suffix, "want": line[cut:close_at]})
    rng.shuffle(out)
    return out


def block_problems(
    seed: int = 7,
    per_file: int = 6,
    root: Path = ROOT,
    patterns: tuple[str, ...] = OWN_CODE,
    max_lines: int = 6,
    max_chars: int = 200,
) -> list[dict[str, str]]:
    """The cursor at the end of a line that opens a block (`{` or `:` ends it); missing: the block's first
    lines (2 to `max_lines` lines deeper than it, at most `max_chars`, up to its end or the first blank line).
    The code after them (the block's closer, say) stays, as where an editor closed the brace."""
    rng = random.Random(seed)
    files = sorted({path for pattern in patterns for path in root.glob(pattern) if path.is_file()})
    out = []
    for path in files:
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        candidates = []
        for i, line in enumerate(lines[:-2]):
            code = line.strip()
            if i <= 20 or len(line) > 120 or not code.endswith(("{", ":")) or code.startswith(OTHER_SKIP):
                continue
            end = i + 1
            while (
                end < len(lines)
                and end - i <= max_lines
                and lines[end].strip()
                and _indent(lines[end]) > _indent(line)
                and sum(len(x) + 1 for x in lines[i + 1 : end + 1]) <= max_chars
            ):
                end += 1
            if end - i >= 3:
                candidates.append((i, end))
        for i, end in rng.sample(candidates, min(per_file, len(candidates))):
            out.append(
                {
                    "prefix": "\n".join(lines[: i + 1]),
                    "suffix": "\n" + "\n".join(lines[end:]),
                    "want": "\n" + "\n".join(lines[i + 1 : end]),
                }
            )
    rng.shuffle(out)
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--steps", type=int, default=16, help="max denoising steps (the server's inline cap)")
    parser.add_argument("--prefix-chars", type=int, default=4000)
    parser.add_argument("--suffix-chars", type=int, default=1500)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kind", default="line", choices=("line", "midline", "multiline"))
    parser.add_argument(
        "--source",
        type=Path,
        default=ROOT,
        help="checkout the problems are drawn from (default: this one); an A/B that edits the code must "
        "draw both sides from one frozen copy (e.g. a `git worktree` of the base commit), or the sets differ",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=None, help="canvas (default: the server's, 32 line / 64 multiline)"
    )
    parser.add_argument(
        "--one-line",
        action="store_true",
        help="multiline kind: ask for one line (32-token canvas, newline stop)",
    )
    parser.add_argument(
        "--dump", type=Path, help="write each problem's fill (text, token scores) here, JSONL"
    )
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
    multiline = args.kind == "multiline" and not args.one_line  # a fill of several lines
    max_tokens = args.max_tokens or (64 if multiline else 32)
    em, es, es_all, steps, ms = [], [], [], [], []
    dump = args.dump.open("w", encoding="utf-8") if args.dump else None
    for i, p in enumerate(problems(kind=args.kind, root=args.source)[: args.limit]):
        request = FillRequest(
            p["prefix"][-args.prefix_chars :],
            p["suffix"][: args.suffix_chars],
            max_tokens=max_tokens,
            seed=i,
            settings=settings,
            stop=() if multiline else ("\n",),
        )
        start = time.perf_counter()
        result = engine.fill(request)
        ms.append((time.perf_counter() - start) * 1000)
        want_lines = p["want"].split("\n")
        got_lines = result.text.split("\n")
        em.append(exact_match(got_lines[0], want_lines[0]))
        es.append(edit_similarity(got_lines[0], want_lines[0]))
        es_all.append(edit_similarity("\n".join(got_lines[: len(want_lines)]), p["want"]))
        steps.append(result.steps)
        if dump is not None:
            scores = [(s.text, round(s.confidence, 4)) for s in result.token_scores]
            row = {"want": p["want"], "text": result.text, "steps": result.steps, "scores": scores}
            dump.write(json.dumps(row) + "\n")
    lines = f"ES of {args.kind} {statistics.mean(es_all):.1f} " if args.kind == "multiline" else ""
    print(
        f"{engine.model_name} {args.kind}{' one line' if args.one_line else ''} {' '.join(args.set) or 'model defaults'}, max {args.steps} steps: "
        f"{len(em)} problems, EM {100 * statistics.mean(em):.1f}% ES {statistics.mean(es):.1f} {lines}"
        f"steps {statistics.mean(steps):.1f} median ms {statistics.median(ms):.0f}"
    )


if __name__ == "__main__":
    main()
