"""A fill-in-the-middle benchmark from real code: a Python project and its own test suite (issue 5, item 2).

    dfim bench-realcode build PROJECT --out problems.jsonl [--test-command "python -m unittest ..."]
    dfim bench-realcode score problems.jsonl (--reference | --completions FILE | --model PATH) [--out DIR]

`build`
1. runs the project's tests once, in the sandbox (dfim.engine.evaluation.sandbox) on a temporary copy, under a line tracer
   (`sys.settrace`, no coverage package) that records which lines of the project's own files ran; the suite
   must pass unmodified, or there is nothing to compare against;
2. parses every non-test source file with tree-sitter and takes four kinds of spans inside functions:
   `line` (one whole simple statement line), `block` (the body of a def/if/for/while/with/try clause, 2+
   lines), `condition` (of if/elif/while) and `call` (an outermost single-line call expression);
3. keeps only the spans the tests exercised: the span's line ran (for a block: every statement directly in
   it ran). `--mutation-check` also drops spans whose replacement by a wrong middle still passes the tests;
4. writes HumanEval-infilling-like JSONL: `task_id, prompt, suffix, canonical_solution` plus `kind, project,
   path, line, entry_point, test_command`. `prompt + canonical_solution + suffix` is the file as it is.

`score` writes `prompt + completion + suffix` over the file in a fresh copy of the project and runs the
project's test command in the sandbox: pass = exit status 0 within the limits. Also exact match and edit
similarity (dfim.engine.evaluation.metrics). Line and block middles are whole lines (indentation and newline included, as
in HumanEval-infilling); condition and call middles are the exact expression text.

The test command runs under `python -I -S` like every sandboxed program: the standard library only (so
`unittest`), unless `--site-packages` puts this interpreter's site-packages on the path (for pytest suites).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfim.engine.evaluation import metrics, sandbox

DEFAULT_TEST_COMMAND = "python -m unittest discover -s tests -t ."
KINDS = ("line", "block", "condition", "call")
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".venv", "venv", "env", "build", "dist", "node_modules", ".tox"}
TEST_DIRS = {"tests", "test", "testing"}
SIMPLE_STATEMENTS = {
    "expression_statement", "return_statement", "raise_statement", "assert_statement", "delete_statement",
    "import_statement", "import_from_statement", "global_statement", "nonlocal_statement",
}  # fmt: skip
CLAUSE_TYPES = {
    "function_definition", "if_statement", "elif_clause", "else_clause", "for_statement", "while_statement",
    "with_statement", "try_statement", "except_clause", "finally_clause",
}  # fmt: skip
CONDITION_PARENTS = {"if_statement", "elif_clause", "while_statement"}
MAX_BLOCK_LINES = 15  # longer bodies are not what inline completion is asked for
MAX_CALL_CHARS = 100
# What `--mutation-check` puts in place of each kind of middle: valid Python that should break the tests.
WRONG_MIDDLE = {"line": "pass", "block": "pass", "condition": "False", "call": "None"}


class RealcodeError(Exception):
    """The project cannot be built into problems (no tests, failing tests, unreadable files)."""


# ----------------------------------------------------------------------------- running a project's tests


_DRIVER = """
import os, runpy, sys
ROOT, ARGV, TRACE, EXTRA = {root!r}, {argv!r}, {trace!r}, {extra!r}
sys.dont_write_bytecode = True  # a completion of the same size and mtime must never meet a stale .pyc
os.chdir(ROOT)
sys.path[:0] = [ROOT]
sys.path.extend(EXTRA)
executed = {{}}
if TRACE:
    import threading
    prefix = ROOT + os.sep

    def local(frame, event, arg):
        if event == "line":
            executed.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
        return local

    def tracer(frame, event, arg):
        # only frames of the project's own files are followed line by line: the stdlib runs untraced
        return local if frame.f_code.co_filename.startswith(prefix) else None

    sys.settrace(tracer)
    threading.settrace(tracer)
code = 0
try:
    if ARGV[0] == "-m":
        sys.argv = [ARGV[1], *ARGV[2:]]
        runpy.run_module(ARGV[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(ARGV)
        runpy.run_path(ARGV[0], run_name="__main__")
except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
finally:
    sys.settrace(None)
    if TRACE:
        import json
        with open(TRACE, "w") as f:
            json.dump({{k: sorted(v) for k, v in executed.items()}}, f)
sys.exit(code)
"""


def parse_test_command(command: str) -> list[str]:
    """`python -m unittest discover -s tests` -> ["-m", "unittest", "discover", "-s", "tests"].

    Only `python -m MODULE ...` and `python SCRIPT.py ...` are accepted: the sandbox supplies the interpreter,
    so anything else (`rm -rf /`, `pytest`) would be run as a Python script of that name."""
    form = f"test command must be `python -m MODULE ...` or `python SCRIPT.py ...`: {command!r}"
    try:
        argv = shlex.split(command)
    except ValueError as e:  # an unbalanced quote
        raise RealcodeError(f"{form} ({e})") from None
    if argv and Path(argv[0]).name.startswith("python") and not argv[0].endswith(".py"):
        argv = argv[1:]  # the interpreter (python, python3, /usr/bin/python3.12), not `python_tests.py`
    module = bool(argv) and argv[0] == "-m" and len(argv) >= 2
    script = bool(argv) and argv[0].endswith(".py")
    if not (module or script):
        raise RealcodeError(form)
    return argv


def site_paths() -> list[str]:
    """This interpreter's site-packages (for test suites that need pytest or the project's dependencies)."""
    import site

    return [p for p in [*site.getsitepackages(), site.getusersitepackages()] if os.path.isdir(p)]


def copy_project(project: Path, dest: Path) -> Path:
    """A copy without caches and VCS data (stale bytecode would hide a changed file)."""
    shutil.copytree(project, dest, ignore=shutil.ignore_patterns(*SKIP_DIRS, "*.pyc"), symlinks=True)
    return dest


def run_tests(
    project: Path,
    test_command: str,
    limits: sandbox.SandboxLimits,
    *,
    replace: tuple[str, str] | None = None,
    trace: bool = False,
    extra_paths: Sequence[str] = (),
) -> tuple[sandbox.SandboxResult, dict[str, list[int]] | None]:
    """Run the project's tests on a fresh copy, optionally with one file replaced ((relative path, text)).

    Returns the sandbox result and, with `trace`, the lines that ran: {path relative to the project: [line]}.
    """
    argv = parse_test_command(test_command)
    with tempfile.TemporaryDirectory(prefix="dfim-realcode-", ignore_cleanup_errors=True) as tmp:
        root = copy_project(project, Path(tmp) / "project")
        if replace is not None:
            (root / replace[0]).write_text(replace[1], encoding="utf-8")
        trace_path = str(Path(tmp) / "lines.json") if trace else None
        driver = _DRIVER.format(root=str(root), argv=argv, trace=trace_path, extra=list(extra_paths))
        result = sandbox.run_program(driver, limits)
        lines = None
        if trace_path and os.path.exists(trace_path):
            raw = json.loads(Path(trace_path).read_text(encoding="utf-8"))
            prefix = str(root) + os.sep
            lines = {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}
        return result, lines


# ----------------------------------------------------------------------------- spans


@dataclass(frozen=True)
class Span:
    kind: str
    start: int  # byte offsets of the middle in the file
    end: int
    line: int  # 1-based line where the middle starts
    column: int  # 1-based column (in bytes) where the middle starts
    check_lines: tuple[int, ...]  # 1-based lines that must have run for the span to count as exercised
    entry_point: str  # qualified name of the enclosing function


def _python_parser():
    import tree_sitter
    import tree_sitter_python

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))


def _line_start(data: bytes, offset: int) -> int:
    return data.rfind(b"\n", 0, offset) + 1


def _line_end_incl(data: bytes, offset: int) -> int:
    """Offset just past the newline of the line holding `offset` (or the end of the file)."""
    i = data.find(b"\n", offset)
    return len(data) if i < 0 else i + 1


def _is_docstring(node) -> bool:
    return (
        node.type == "expression_statement"
        and node.named_child_count == 1
        and node.named_children[0].type
        in (
            "string",
            "concatenated_string",
        )
    )


def _alone_on_line(data: bytes, node) -> bool:
    """The node is the only thing on its single line (apart from indentation and a trailing comment-free end)."""
    if node.start_point.row != node.end_point.row:
        return False
    start, end = _line_start(data, node.start_byte), _line_end_incl(data, node.start_byte)
    return data[start:end].strip() == data[node.start_byte : node.end_byte].strip()


def _statements(block) -> list:
    return [c for c in block.named_children if c.type != "comment" and not _is_docstring(c)]


def find_spans(text: str, kinds: Iterable[str] = KINDS) -> list[Span]:
    """Candidate FIM spans of a Python file (inside functions only: module-level code runs at import, so the
    tests "exercising" it would say nothing)."""
    kinds = set(kinds)
    data = text.encode("utf-8")
    tree = _python_parser().parse(data)
    spans: dict[tuple[int, int, str], Span] = {}

    def add(kind: str, start: int, end: int, check: Iterable[int], name: str) -> None:
        if kind in kinds and end > start and data[start:end].strip():
            line = data.count(b"\n", 0, start) + 1
            column = start - _line_start(data, start) + 1
            checks = tuple(sorted(set(check)))
            spans.setdefault((start, end, kind), Span(kind, start, end, line, column, checks, name))

    def visit(node, names: tuple[str, ...], inside_call: bool) -> None:
        if node.type == "function_definition":
            name_node = node.child_by_field_name("name")
            names = (*names, name_node.text.decode() if name_node else "?")
        elif node.type == "class_definition":
            name_node = node.child_by_field_name("name")
            names = (*names, name_node.text.decode() if name_node else "?")
        in_function = node.type == "function_definition" or _in_function(node)
        qual = ".".join(names)
        row = node.start_point.row + 1
        if in_function:
            if node.type in SIMPLE_STATEMENTS and not _is_docstring(node) and _alone_on_line(data, node):
                if node.parent is not None and node.parent.type == "block":
                    start = _line_start(data, node.start_byte)
                    add("line", start, _line_end_incl(data, node.start_byte), [row], qual)
            if node.type == "block" and node.parent is not None and node.parent.type in CLAUSE_TYPES:
                statements = _statements(node)
                first_row = statements[0].start_point.row if statements else -1
                if statements and first_row > node.parent.start_point.row:  # not `if x: y` on one line
                    start = _line_start(data, statements[0].start_byte)
                    end = _line_end_incl(data, node.end_byte - 1 if node.end_byte > 0 else 0)
                    n_lines = data.count(b"\n", start, end)
                    if 2 <= n_lines <= MAX_BLOCK_LINES:
                        add("block", start, end, [s.start_point.row + 1 for s in statements], qual)
            if node.type in CONDITION_PARENTS:
                condition = node.child_by_field_name("condition")
                if condition is not None and condition.start_point.row == condition.end_point.row:
                    add("condition", condition.start_byte, condition.end_byte, [row], qual)
            if (
                node.type == "call"
                and not inside_call
                and node.start_point.row == node.end_point.row
                and node.end_byte - node.start_byte <= MAX_CALL_CHARS
            ):
                add("call", node.start_byte, node.end_byte, [row], qual)
        inside = inside_call or node.type == "call"
        for child in node.children:
            visit(child, names, inside)

    visit(tree.root_node, (), False)
    return sorted(spans.values(), key=lambda s: (s.start, s.end, KINDS.index(s.kind)))


def _in_function(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            return True
        parent = parent.parent
    return False


def exercised(span: Span, ran: set[int]) -> bool:
    return all(line in ran for line in span.check_lines)


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


# ----------------------------------------------------------------------------- score


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
) -> list[dict[str, Any]]:
    limits = limits or sandbox.SandboxLimits(timeout_s=60.0)
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="dfim-realcode") as pool:
        futures = [
            pool.submit(score_one, p, c, limits, problems_file, extra_paths)
            for p, c in zip(problems, completions, strict=True)
        ]
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
    problems: Sequence[dict[str, Any]], model: str | None, device: str, max_tokens: int, seed: int
):
    """Fill every problem with the engine (one request at a time); returns (completions, per-problem info)."""
    from dfim.engine.api import EngineError, FillRequest
    from dfim.engine.inference.fill import Engine
    from dfim.server.rules import remove_suffix_overlap

    engine = Engine.load(model or None, device=device)
    completions, info = [], []
    for i, p in enumerate(problems):
        tokens = max_tokens * 4 if p["kind"] == "block" else max_tokens
        try:
            # the checkpoint's own sampler (dfim-small: the encoder's draft), as `dfim eval` and the editor
            # fill; one line for the kinds whose middle is one
            stop = () if p["kind"] == "block" else ("\n",)
            request = FillRequest(
                prefix=p["prompt"],
                suffix=p["suffix"],
                max_tokens=tokens,
                settings=engine.settings,
                seed=seed + i,
                stop=stop,
            )
            result = engine.fill(request)
            raw, extra = result.text, {"latency_ms": result.latency_ms, "steps": result.steps, "error": None}
            if p["kind"] in ("condition", "call"):  # the draft writes the line out: the editor cuts the rest
                raw = remove_suffix_overlap(raw.split("\n", 1)[0], p["suffix"])
        except EngineError as e:
            raw, extra = "", {"latency_ms": None, "steps": 0, "error": str(e)}
        completions.append(postprocess(p["kind"], raw))
        info.append({"raw": raw, **extra})
    name = {
        "name": getattr(engine, "model_name", model),
        "is_random": bool(getattr(engine, "is_random", False)),
    }
    return completions, info, name


# ----------------------------------------------------------------------------- command line
