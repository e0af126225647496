"""HumanEval-style infilling through the real language server: what an editor (or a harness that speaks
LSP) gets, context windows, post-processing and all, not the engine alone (`dfim eval`).

For each problem the document is `prompt + suffix` and the cursor sits at `len(prompt)`, where a harness
that splits a file into prefix and suffix asks (for the single-line set: column 0 of the line after the
hole). The first inline item is applied as an editor would; the completion is what it inserted between
prompt and suffix, and the problem's tests run on the result in the sandbox.

    python scripts/eval_through_server.py ../shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz \
        --limit 100 [--model DIR] [--settings '{"inline": {"multiline": true}}'] [--out runs/through-server]

`--dev` takes the development set of `scripts/dev_own_code.py` instead (single lines of this repository's own
code, the cursor after the line's indentation; scored by EM and ES only, there are no tests): the set to
choose server settings on. `--kind midline` puts the cursor after a random part of the line's code
(the rest of the line is missing), as when a user has typed some of it; `--kind block` puts it at the
end of a line that opens a block and leaves out the block's first 2-6 lines (a several-line fill).

`--action fillHole` asks the code action instead of an inline completion: the missing line is written as
`pass` (indented as the line it replaces, as a user marks a hole) and `dfim.fillHole` runs on it; the
completion is what the action's edit put in its place.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dfim.bench.lsp_client import Client, get_field, utf16_offset  # noqa: E402
from dfim.engine.evaluation import sandbox  # noqa: E402
from dfim.engine.evaluation.fim import Problem, load_problems  # noqa: E402
from dfim.engine.evaluation.metrics import edit_similarity, exact_match  # noqa: E402
from dfim.server.languages import EXTENSIONS  # noqa: E402


def between(problem: Problem, new: str) -> str | None:
    """What the edited document `new` holds between prompt and suffix, or None if the edit reached into either."""
    p, s = problem.prompt, problem.suffix
    if not (new.startswith(p) and new.endswith(s)) or len(new) < len(p) + len(s):
        return None
    return new[len(p) : len(new) - len(s)]


def completion_of(problem: Problem, doc: str, item) -> str | None:
    """What the item inserts between prompt and suffix, or None if its edit reaches into either."""
    if item is None:
        return ""
    rng = get_field(item, "range")
    insert = get_field(item, "insert_text")
    insert = insert if isinstance(insert, str) else get_field(insert, "value")
    start = utf16_offset(doc, rng.start.line, rng.start.character)
    end = utf16_offset(doc, rng.end.line, rng.end.character)
    return between(problem, doc[:start] + insert + doc[end:])


def with_hole(problem: Problem) -> tuple[str, int, int]:
    """The document with the missing line written as an indented `pass`, and that statement's span."""
    want = problem.canonical_solution
    indent = want[: len(want) - len(want.lstrip(" \t"))]
    start = len(problem.prompt) + len(indent)
    doc = problem.prompt + indent + "pass" + ("\n" if want.endswith("\n") else "") + problem.suffix
    return doc, start, start + len("pass")


def apply_workspace_edit(doc: str, reply) -> str:
    """`doc` with the edits of an action's reply ({applied, edit}) applied, last edit first."""
    edits = []
    for change in get_field(get_field(reply, "edit"), "documentChanges") or []:
        for edit in get_field(change, "edits") or []:
            rng = get_field(edit, "range")
            start = utf16_offset(doc, rng["start"]["line"], rng["start"]["character"])
            end = utf16_offset(doc, rng["end"]["line"], rng["end"]["character"])
            edits.append((start, end, get_field(edit, "newText")))
    for start, end, text in sorted(edits, reverse=True):
        doc = doc[:start] + text + doc[end:]
    return doc


async def fill_all(
    problems: list[Problem], model: str, settings: dict, action: str = "", language: str = "python"
) -> list[dict]:
    client = Client()
    extension = next((ext for ext, lang in EXTENSIONS.items() if lang == language), ".txt")
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        status = await client.start(model, "cpu", {"telemetry": {"enabled": False}, **settings}, data_dir)
        if get_field(status, "state") != "ready":
            raise SystemExit(f"the server did not start: {get_field(status, 'message')}")
        try:
            for i, problem in enumerate(problems):
                uri = f"file:///eval/problem_{i}{extension}"
                if action:
                    doc, start, end = with_hole(problem)
                else:
                    doc = problem.prompt + problem.suffix
                client.open(uri, doc, language)
                started = time.perf_counter()
                if action:
                    try:
                        reply = await client.action(uri, doc, action, start, end)
                    except Exception as exc:  # the server refused (e.g. nothing to fill): nothing shown
                        print(f"{problem.task_id}: {exc}", file=sys.stderr)
                        reply = None
                    shown = reply is not None
                    completion = between(problem, apply_workspace_edit(doc, reply)) if shown else ""
                else:
                    result = await client.inline(uri, doc, len(problem.prompt))
                    items = list(get_field(result, "items") or []) if result is not None else []
                    shown = bool(items)
                    completion = completion_of(problem, doc, items[0] if items else None)
                ms = (time.perf_counter() - started) * 1000.0
                client.close(uri)
                rows.append({"task_id": problem.task_id, "shown": shown, "completion": completion, "ms": ms})
        finally:
            await client.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", nargs="?", help="HumanEval-infilling JSONL(.gz)")
    parser.add_argument("--dev", action="store_true", help="the development set of scripts/dev_own_code.py")
    parser.add_argument(
        "--kind",
        default="line",
        choices=("line", "midline", "closed", "block"),
        help="--dev: where the cursor sits in the line (closed: as midline, before the closers the line ends "
        "with, which stay; block: at the end of a line that opens a block, its first lines missing)",
    )
    parser.add_argument("--source", type=Path, default=ROOT, help="--dev: the checkout to draw lines from")
    parser.add_argument(
        "--glob",
        action="append",
        help="--dev: files to draw lines from, under --source (repeatable; default: our own Python)",
    )
    parser.add_argument("--language", default="python", help="the documents' languageId (default python)")
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--model", default="", help="checkpoint folder (default: the shipped model)")
    parser.add_argument("--settings", default="{}", help="server settings (JSON, as initializationOptions)")
    parser.add_argument("--action", default="", choices=("", "fillHole"), help="run this code action instead")
    parser.add_argument("--out", type=Path, help="write per-problem results here (JSONL)")
    args = parser.parse_args()
    if args.dev:
        sys.path.insert(0, str(ROOT / "scripts"))
        import dev_own_code

        problems = [
            Problem(f"dev/{i}", p["prefix"], p["suffix"], p["want"], "", "")
            for i, p in enumerate(
                dev_own_code.problems(
                    kind=args.kind, root=args.source, patterns=tuple(args.glob or dev_own_code.OWN_CODE)
                )[: args.limit]
            )
        ]
    elif args.data:
        problems = load_problems(args.data, args.limit)
    else:
        parser.error("give a HumanEval-infilling file or --dev")
    rows = asyncio.run(fill_all(problems, args.model, json.loads(args.settings), args.action, args.language))
    for problem, row in zip(problems, rows, strict=True):
        completion = row["completion"]
        if completion is None:  # an edit outside the hole: counts as a wrong answer
            row.update(passed=False, em=0.0, es=0.0)
            continue
        row["em"] = float(exact_match(completion, problem.canonical_solution))
        row["es"] = edit_similarity(completion, problem.canonical_solution)
        if args.dev:
            row["passed"] = False
            continue
        program = sandbox.humaneval_program(
            problem.prompt, completion, problem.suffix, problem.test, problem.entry_point
        )
        row["passed"] = sandbox.run_program(program, sandbox.SandboxLimits()).passed
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ms = sorted(r["ms"] for r in rows)
    passed = "" if args.dev else f"pass@1 {100 * statistics.mean(r['passed'] for r in rows):.1f}% "
    print(
        f"{len(rows)} problems through the server: {passed}"
        f"EM {100 * statistics.mean(r['em'] for r in rows):.1f}% ES {statistics.mean(r['es'] for r in rows):.1f} "
        f"shown {100 * statistics.mean(r['shown'] for r in rows):.0f}% "
        f"p50 {ms[len(ms) // 2]:.0f} ms p95 {ms[int(len(ms) * 0.95)]:.0f} ms"
    )


if __name__ == "__main__":
    main()
