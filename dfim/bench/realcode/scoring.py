"""Scoring completions by the project's own tests (pass@1, exact match, edit similarity), the summary table,
and getting the completions from the engine.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, TextIO

from dfim.bench.realcode.problems import project_dir
from dfim.bench.realcode.spans import KINDS
from dfim.bench.realcode.tracing import RealcodeError, run_tests
from dfim.engine.evaluation import metrics, sandbox
from dfim.engine.progress import Progress


def postprocess(kind: str, raw: str) -> str:
    """What the model's raw middle becomes for each kind: whole lines for `line`/`block`, one line for the
    expression kinds (their middle never holds a newline)."""
    if kind == "line":
        return raw.split("\n", 1)[0] + "\n"
    if kind == "block":
        return raw if raw.endswith("\n") else raw + "\n"
    return raw.split("\n", 1)[0].rstrip()


def score_one(
    problem: dict[str, Any],
    completion: str,
    limits: sandbox.SandboxLimits,
    problems_file: str | os.PathLike | None = None,
    extra_paths: Sequence[str] = (),
) -> dict[str, Any]:
    filled = problem["prompt"] + completion + problem["suffix"]
    try:
        result, _ = run_tests(
            project_dir(problem, problems_file),
            problem["test_command"],
            limits,
            replace=(problem["path"], filled),
            extra_paths=extra_paths,
        )
    except (OSError, RealcodeError) as e:  # the harness failed for this problem: it fails, the run goes on
        result = sandbox.SandboxResult(False, False, None, f"harness error: {e!r}", "", 0.0)
    record = {
        "task_id": problem["task_id"],
        "kind": problem["kind"],
        "completion": completion,
        "passed": result.passed,
        "timed_out": result.timed_out,
        "returncode": result.returncode,
        "exec_ms": round(result.duration_ms, 1),
        "exact_match": metrics.exact_match(completion, problem["canonical_solution"]),
        "edit_similarity": round(metrics.edit_similarity(completion, problem["canonical_solution"]), 2),
    }
    if not result.passed:
        record["stderr"] = result.stderr[-500:]
    return record


def score(
    problems: Sequence[dict[str, Any]],
    completions: Sequence[str],
    *,
    limits: sandbox.SandboxLimits | None = None,
    workers: int = 2,
    problems_file: str | os.PathLike | None = None,
    extra_paths: Sequence[str] = (),
    progress: TextIO | None = None,
    stream: TextIO | None = None,
) -> list[dict[str, Any]]:
    """Run every problem's tests with its completion; `progress` (a stream) counts the suites as they end,
    and `stream` gets each problem's record as one JSONL line the moment its suite ends (flushed), so a
    long or interrupted run shows and keeps what it has."""
    limits = limits or sandbox.SandboxLimits(timeout_s=60.0)
    bar = Progress(len(problems), "testing", unit="problems", stream=progress, enabled=progress is not None)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dfim-realcode") as pool:
        futures = [
            pool.submit(score_one, p, c, limits, problems_file, extra_paths)
            for p, c in zip(problems, completions, strict=True)
        ]
        passed = 0
        for done, future in enumerate(as_completed(futures), 1):
            record = future.result()
            passed += bool(record["passed"])
            if stream is not None:
                stream.write(json.dumps(record, ensure_ascii=False) + "\n")
                stream.flush()
            bar.update(1, f"pass {100.0 * passed / done:.1f}%")
        bar.close()
        return [f.result() for f in futures]


def summarize(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per kind and one for all."""
    rows = []
    for kind in [*KINDS, "all"]:
        mine = [r for r in records if kind == "all" or r["kind"] == kind]
        if not mine:
            continue
        latencies = [r["latency_ms"] for r in mine if r.get("latency_ms") is not None]
        rows.append(
            {
                "kind": kind,
                "n": len(mine),
                "pass_at_1": 100.0 * metrics.mean([float(r["passed"]) for r in mine]),
                "exact_match": 100.0 * metrics.mean([float(r["exact_match"]) for r in mine]),
                "edit_similarity": metrics.mean([r["edit_similarity"] for r in mine]),
                "latency_p50_ms": metrics.percentile(latencies, 50) if latencies else None,
                "timeouts": sum(r["timed_out"] for r in mine),
            }
        )
    return rows


def markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    out = [
        f"# real-code FIM: {meta['problems_file']} ({meta['source']})",
        "",
        "| kind | n | pass@1 | EM | ES | p50 ms | timeouts |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        out.append(
            f"| {r['kind']} | {r['n']} | {f(r['pass_at_1'])} | {f(r['exact_match'])} | {f(r['edit_similarity'])} "
            f"| {f(r['latency_p50_ms'])} | {r['timeouts']} |"
        )
    out += ["", f"command: `{meta['command']}`", ""]
    return "\n".join(out)


def model_completions(
    problems: Sequence[dict[str, Any]],
    model: str | None,
    device: str,
    max_tokens: int,
    seed: int,
    progress: TextIO | None = None,
    stream: TextIO | None = None,
):
    """Fill every problem with the engine (one request at a time); returns (completions, per-problem info).

    Each problem is filled as `dfim fill` fills a cursor (`dfim.cursor_fill`): the file cut around the hole
    to the checkpoint's trained context, the same sampler and candidates, and the server's post-processing. `progress` (a
    stream, normally stderr) counts the fills: a bar on a terminal, a few lines in a log. `stream` gets one
    JSONL line per filled problem, flushed as it comes ({task_id, completion, ...}, which `--completions`
    reads back), so an interrupted run keeps what it filled."""
    from dfim.cursor_fill import fill_at_cursor
    from dfim.engine.api import EngineError
    from dfim.engine.inference.fill import Engine
    from dfim.server.languages import language_of_path

    engine = Engine.load(model or None, device=device)
    completions, info = [], []
    bar = Progress(len(problems), "filling", unit="problems", stream=progress, enabled=progress is not None)
    for i, p in enumerate(problems):
        # as the editor fills: a block is a multiline fill (the selection rewritten), every other kind one line
        # after the server's post-processing (which cuts what repeats the rest of the line)
        block = p["kind"] == "block"
        try:
            filled = fill_at_cursor(
                engine,
                p["prompt"],
                p["suffix"],
                language_of_path(p.get("path", "")) or "python",  # the problems are Python projects
                multiline=block,
                max_tokens=min(256, max_tokens * 4) if block else max_tokens,
                seed=seed + i,
                candidates=None,  # the server's inline choice
            )
            raw = filled.result.text
            extra = {
                "latency_ms": filled.result.latency_ms,
                "steps": filled.result.steps,
                "context_tokens": filled.result.context_tokens,
                "error": None,
            }
        except EngineError as e:
            raw, extra = "", {"latency_ms": None, "steps": 0, "context_tokens": None, "error": str(e)}
        completions.append(postprocess(p["kind"], raw))
        info.append({"raw": raw, **extra})
        if stream is not None:
            line = {"task_id": p["task_id"], "kind": p["kind"], "completion": completions[-1], **info[-1]}
            stream.write(json.dumps(line, ensure_ascii=False) + "\n")
            stream.flush()
        bar.update(1, p["task_id"])
    bar.close()
    name = {
        "name": getattr(engine, "model_name", model),
        "is_random": bool(getattr(engine, "is_random", False)),
    }
    return completions, info, name
