"""Running a project's test suite on a fresh copy in the sandbox, optionally under a line tracer.

The tracer (`sys.settrace`, no coverage package) follows only the project's own files and records which of
their lines ran; with one file replaced, the same run scores a completion.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dfim.engine.evaluation import sandbox

DEFAULT_TEST_COMMAND = "python -m unittest discover -s tests -t ."
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".venv", "venv", "env", "build", "dist", "node_modules", ".tox"}


class RealcodeError(Exception):
    """The project cannot be built into problems (no tests, failing tests, unreadable files)."""


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
        result = sandbox.run_program(driver, limits, writable=[tmp])  # the copy and the trace file
        lines = None
        if trace_path and os.path.exists(trace_path):
            raw = json.loads(Path(trace_path).read_text(encoding="utf-8"))
            prefix = str(root) + os.sep
            lines = {k[len(prefix) :]: v for k, v in raw.items() if k.startswith(prefix)}
        return result, lines
