"""Problems from a project: `build`, one problem per exercised span, and reading and writing problem and
completion files (JSONL).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dfim.bench.realcode.spans import KINDS, Span, exercised, find_spans
from dfim.bench.realcode.tracing import (
    DEFAULT_TEST_COMMAND,
    SKIP_DIRS,
    RealcodeError,
    parse_test_command,
    run_tests,
)
from dfim.engine.evaluation import sandbox

TEST_DIRS = {"tests", "test", "testing"}
# What `--mutation-check` puts in place of each kind of middle: valid Python that should break the tests.
WRONG_MIDDLE = {"line": "pass", "block": "pass", "condition": "False", "call": "None"}


def is_test_file(relative: Path) -> bool:
    name = relative.name
    return (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name in ("conftest.py", "setup.py")
        or any(part in TEST_DIRS for part in relative.parts[:-1])
    )


def source_files(project: Path) -> list[Path]:
    """The project's own non-test Python files, relative to the project."""
    out = []
    for path in sorted(project.rglob("*.py")):
        relative = path.relative_to(project)
        if any(part in SKIP_DIRS or part.startswith(".") for part in relative.parts[:-1]):
            continue
        if not is_test_file(relative):
            out.append(relative)
    return out


# ----------------------------------------------------------------------------- build


def make_problem(
    project_field: str, relative: Path, text: str, span: Span, test_command: str
) -> dict[str, Any]:
    data = text.encode("utf-8")
    return {
        "task_id": f"{relative.as_posix()}:{span.line}:{span.column}:{span.kind}",
        "prompt": data[: span.start].decode("utf-8"),
        "suffix": data[span.end :].decode("utf-8"),
        "canonical_solution": data[span.start : span.end].decode("utf-8"),
        "kind": span.kind,
        "project": project_field,
        "path": relative.as_posix(),
        "line": span.line,
        "entry_point": span.entry_point,
        "test_command": test_command,
    }


def wrong_middle(problem: dict[str, Any]) -> str:
    """A syntactically valid middle that differs from the canonical one (for `--mutation-check`)."""
    canonical = problem["canonical_solution"]
    filler = WRONG_MIDDLE[problem["kind"]]
    if problem["kind"] in ("line", "block"):
        indent = canonical[: len(canonical) - len(canonical.lstrip(" \t"))]
        return f"{indent}{filler}\n"
    return filler


def build(
    project: str | os.PathLike,
    *,
    test_command: str = DEFAULT_TEST_COMMAND,
    kinds: Iterable[str] = KINDS,
    limits: sandbox.SandboxLimits | None = None,
    extra_paths: Sequence[str] = (),
    project_field: str | None = None,
    mutation_check: bool = False,
    workers: int = 2,
    log: Callable[[str], None] = lambda _: None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Problems from `project` and build statistics. `project_field` is what the problems record as the
    project's path (default: the absolute path)."""
    project = Path(project).resolve()
    if not project.is_dir():
        raise RealcodeError(f"{project}: not a directory")
    limits = limits or sandbox.SandboxLimits(timeout_s=60.0)
    result, ran = run_tests(project, test_command, limits, trace=True, extra_paths=extra_paths)
    if not result.passed:
        raise RealcodeError(
            f"{project}: the tests do not pass as they are (`{test_command}`, exit {result.returncode}"
            f"{', timed out' if result.timed_out else ''}):\n{result.stderr[-1500:]}"
        )
    ran = ran or {}
    log(f"baseline tests pass in {result.duration_ms:.0f} ms; {sum(map(len, ran.values()))} lines ran")
    field = project_field if project_field is not None else str(project)
    problems: list[dict[str, Any]] = []
    stats: Counter[str] = Counter()
    for relative in source_files(project):
        try:
            text = (project / relative).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            log(f"{relative}: skipped ({'not UTF-8' if isinstance(e, UnicodeDecodeError) else e})")
            continue
        lines_ran = set(ran.get(str(relative), ()))
        for span in find_spans(text, kinds):
            stats[f"candidates_{span.kind}"] += 1
            if exercised(span, lines_ran):
                stats[f"exercised_{span.kind}"] += 1
                problems.append(make_problem(field, relative, text, span, test_command))
    if mutation_check and problems:
        log(f"mutation check: running the tests {len(problems)} times")

        def still_passes(problem: dict[str, Any]) -> bool:
            filled = problem["prompt"] + wrong_middle(problem) + problem["suffix"]
            res, _ = run_tests(
                project, test_command, limits, replace=(problem["path"], filled), extra_paths=extra_paths
            )
            return res.passed

        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            survived = list(pool.map(still_passes, problems))
        problems = [p for p, s in zip(problems, survived, strict=True) if not s]
        stats.update(f"sensitive_{p['kind']}" for p in problems)
    info = {
        "project": str(project),
        "test_command": test_command,
        "baseline_ms": round(result.duration_ms, 1),
        "files": len(source_files(project)),
        "problems": len(problems),
        "kinds": dict(Counter(p["kind"] for p in problems)),
        "counts": dict(stats),
        "mutation_check": mutation_check,
    }
    return problems, info


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def load_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


PROBLEM_FIELDS = (
    "task_id",
    "prompt",
    "suffix",
    "canonical_solution",
    "kind",
    "project",
    "path",
    "test_command",
)


def read_problems(path: str | os.PathLike, limit: int | None = None) -> list[dict[str, Any]]:
    """The problems `score` runs (the first `limit`), checked: a JSONL of `build`'s objects whose project
    folders and files exist. InputError (the one line `dfim bench-realcode` prints) otherwise."""
    from dfim.commands.checks import InputError, existing_file

    existing_file(path)
    rows: list[tuple[int, dict[str, Any]]] = []
    for number, row in _jsonl(path, f"{path}", "expected the JSONL that `build` writes"):
        if not isinstance(row, dict):
            raise InputError(f"{path}:{number}: not a JSON object")
        missing = [k for k in PROBLEM_FIELDS if not isinstance(row.get(k), str)]
        if missing:
            hint = (
                " (a `dfim eval` file? score reads what `dfim bench-realcode build` writes)"
                if "test" in row
                else ""
            )
            raise InputError(f"{path}:{number}: missing or non-string fields {', '.join(missing)}{hint}")
        if row["kind"] not in KINDS:
            raise InputError(f"{path}:{number}: unknown kind {row['kind']!r} (one of {', '.join(KINDS)})")
        rows.append((number, row))
    if not rows:
        raise InputError(f"{path}: no problems")
    rows = rows[:limit] if limit is not None else rows
    for number, row in rows:
        project = project_dir(row, path)
        if not project.is_dir():
            how = (
                " (a relative project is read from the problems file's folder)"
                if not Path(row["project"]).is_absolute()
                else ""
            )
            raise InputError(f"{path}:{number}: project folder {project} does not exist{how}")
        if not (project / row["path"]).is_file():
            raise InputError(f"{path}:{number}: {row['path']}: no such file in the project {project}")
        try:
            parse_test_command(row["test_command"])
        except RealcodeError as e:
            raise InputError(f"{path}:{number}: {e}") from None
    return [row for _, row in rows]


def read_completions(path: str | os.PathLike) -> dict[str, str]:
    """{task_id: completion} from a JSONL of {task_id, completion}; InputError when it is not one."""
    from dfim.commands.checks import InputError, existing_file

    existing_file(path, "--completions")
    out: dict[str, str] = {}
    for number, row in _jsonl(path, f"--completions {path}"):
        if not isinstance(row, dict) or not all(
            isinstance(row.get(k), str) for k in ("task_id", "completion")
        ):
            raise InputError(f'--completions {path}:{number}: expected {{"task_id": ..., "completion": ...}}')
        out[row["task_id"]] = row["completion"]
    return out


def _jsonl(path: str | os.PathLike, label: str, expected: str = "") -> list[tuple[int, Any]]:
    """(line number, parsed value) of every non-blank line; InputError naming `label` when unreadable."""
    from dfim.commands.checks import InputError

    hint = f" ({expected})" if expected else ""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        raise InputError(f"{label}: not UTF-8 text{hint}") from None
    except OSError as e:
        raise InputError(f"{label}: cannot read ({e.strerror or e})") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as e:
                raise InputError(f"{label}:{number}: not JSON ({e.msg})") from None
    return rows


def project_dir(problem: dict[str, Any], problems_file: str | os.PathLike | None = None) -> Path:
    """A relative `project` is relative to the problems file's folder (so fixtures move with the repo)."""
    path = Path(problem["project"])
    if not path.is_absolute() and problems_file is not None:
        path = Path(problems_file).resolve().parent / path
    return path
