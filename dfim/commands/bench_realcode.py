"""`dfim bench-realcode build|score`: the command line of the real-code benchmark (`dfim.bench.realcode`)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from dfim.bench.realcode.problems import build, read_completions, read_problems, write_jsonl
from dfim.bench.realcode.scoring import markdown, model_completions, score, summarize
from dfim.bench.realcode.spans import KINDS
from dfim.bench.realcode.tracing import DEFAULT_TEST_COMMAND, RealcodeError, parse_test_command, site_paths
from dfim.commands import options
from dfim.commands.provenance import environment
from dfim.engine.evaluation import sandbox


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    b = sub.add_parser(
        "build",
        help="turn a Python project with tests into FIM problems",
        formatter_class=options.HelpFormatter,
    )
    b.add_argument("project", help="project folder (the test command runs in it)")
    options.add_out(b, "problems JSONL to write", required=True)
    b.add_argument(
        "--test-command",
        default=DEFAULT_TEST_COMMAND,
        help="`python -m MODULE ...` or `python SCRIPT.py ...` run in the project",
    )
    b.add_argument("--kinds", default=",".join(KINDS), help="comma-separated span kinds to make")
    b.add_argument(
        "--mutation-check", action="store_true", help="drop spans the tests do not notice breaking"
    )
    b.add_argument(
        "--relative", action="store_true", help="record the project path relative to --out's folder"
    )
    s = sub.add_parser(
        "score",
        help="score completions by running the project's tests",
        formatter_class=options.HelpFormatter,
    )
    s.add_argument("problems", help="problems JSONL from `build`")
    how = s.add_mutually_exclusive_group()
    how.add_argument("--reference", action="store_true", help="score the canonical middles (harness check)")
    how.add_argument("--completions", metavar="FILE", help="JSONL of {task_id, completion}")
    options.add_model(
        how, help="fill with this checkpoint (default, or 'default': the shipped model, dfim-base)"
    )
    options.add_device(s)
    options.add_max_tokens(
        s, 32, f"canvas for line/condition/call, at most {options.MAX_TOKENS_CAP} (blocks get 4x)"
    )
    options.add_seed(s, help="problem i is filled with seed N+i: the same seed gives the same fills")
    s.add_argument("--limit", type=int, default=None, metavar="N", help="score only the first N problems")
    options.add_out(
        s,
        "folder for results.json and summary.md, and with --model completions.jsonl, written a line per "
        "problem as it is filled (default: runs/realcode/<timestamp>)",
    )
    options.add_quiet(s)
    for p in (b, s):
        p.add_argument("--timeout", type=float, default=60.0, help="seconds per test-suite run")
        p.add_argument("--memory-mb", type=int, default=2048, help="address-space limit per test-suite run")
        p.add_argument("--workers", type=int, default=2, help="test-suite runs in parallel")
        p.add_argument("--site-packages", action="store_true", help="let the tests import installed packages")


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any test suite runs or model loads (InputError: the line to print)."""
    from dfim.commands.checks import (
        InputError,
        at_least,
        existing_dir,
        output_file,
        output_folder,
        sandbox_limits,
        seed,
    )
    from dfim.commands.options import check_max_tokens

    sandbox_limits(args.timeout, args.memory_mb)
    at_least("--workers", args.workers, 1)
    if args.action == "build":
        project = existing_dir(args.project, "project")
        output_file(args.out, "--out")
        try:  # a command the sandbox cannot run is refused before the suite is copied and run
            argv = parse_test_command(args.test_command)
        except RealcodeError as e:
            raise InputError(f"--test-command: {e}") from None
        if argv[0] != "-m" and not (project / argv[0]).is_file():
            raise InputError(f"--test-command: {argv[0]}: no such script in the project {project}")
    else:
        at_least("--limit", args.limit, 1)
        check_max_tokens(args.max_tokens)
        seed("--seed", args.seed)  # problem i gets seed + i: torch takes up to 2**64 - 1, room enough
        if args.out:
            output_folder(args.out, "--out")


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    from dfim.commands.checks import InputError, fail, reference_warning, sandbox_problem

    stdout = stdout or sys.stdout
    prog = "dfim bench-realcode"
    try:
        check_args(args)
    except InputError as e:
        return fail(prog, str(e))
    limits = sandbox.SandboxLimits(timeout_s=args.timeout, memory_bytes=args.memory_mb << 20, open_files=256)
    extra = site_paths() if args.site_packages else []
    rest = sys.argv[sys.argv.index("bench-realcode") + 1 :] if "bench-realcode" in sys.argv else sys.argv[1:]
    command = "dfim bench-realcode " + " ".join(shlex.quote(a) for a in rest)
    if args.action == "build":
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not kinds or any(k not in KINDS for k in kinds):
            print(f"dfim bench-realcode: --kinds must be among {', '.join(KINDS)}", file=sys.stderr)
            return 2
        out = Path(args.out)
        field = os.path.relpath(Path(args.project).resolve(), out.resolve().parent) if args.relative else None
        try:  # before the suite runs: a folder that cannot be made must not cost the build
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return fail(prog, f"--out {out}: cannot create {out.parent} ({e.strerror or e})")
        try:
            problems, info = build(
                args.project,
                test_command=args.test_command,
                kinds=kinds,
                limits=limits,
                extra_paths=extra,
                project_field=field,
                mutation_check=args.mutation_check,
                workers=args.workers,
                log=lambda m: print(m, file=sys.stderr),
            )
        except RealcodeError as e:
            print(f"dfim bench-realcode: {e}", file=sys.stderr)
            return 2
        try:
            write_jsonl(problems, out)
        except OSError as e:
            return fail(prog, f"--out {out}: cannot write ({e.strerror or e})")
        stdout.write(json.dumps(info, indent=1) + f"\nwritten: {out}\n")
        return 0

    progress = None if args.quiet else sys.stderr
    try:
        problems = read_problems(args.problems, args.limit)
        by_id = read_completions(args.completions) if args.completions else {}
    except InputError as e:
        return fail(prog, str(e))
    if not args.reference:  # (a reference run is itself the harness check, reported below)
        problem = sandbox_problem(limits)
        if problem:
            return fail(prog, problem)
    isolation = sandbox.probe(limits)  # what the suites run under here, for the user and the result file
    if sandbox.warning(isolation):
        print(f"{prog}: warning: {sandbox.warning(isolation)}", file=sys.stderr)
    if args.completions:
        missing = [p["task_id"] for p in problems if p["task_id"] not in by_id]
        if missing:
            return fail(prog, f"no completion for {missing[0]} (+{len(missing) - 1})")
    out = Path(args.out) if args.out else Path("runs/realcode") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    made = not out.exists()
    try:  # before the model fills and the suites run: a folder that cannot be made must not cost the run
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail(prog, f"--out {out}: cannot create ({e.strerror or e})")
    info: list[dict[str, Any]] = [{} for _ in problems]
    if args.reference:
        completions, source = [p["canonical_solution"] for p in problems], "reference"
    elif args.completions:
        completions, source = [by_id[p["task_id"]] for p in problems], f"completions {args.completions}"
    else:
        from dfim.engine.api import EngineError

        streamed = out / "completions.jsonl"
        try:  # one line per filled problem, flushed: an interrupted run keeps its fills
            with streamed.open("w", encoding="utf-8") as stream:
                model = None if args.model == "default" else args.model
                completions, info, name = model_completions(
                    problems, model, args.device, args.max_tokens, args.seed, progress=progress, stream=stream
                )
        except OSError as e:
            return fail(prog, f"--out {out}: cannot write ({e.strerror or e})")
        except EngineError as e:
            streamed.unlink(missing_ok=True)
            if made:  # nothing was written: no empty folder left behind
                out.rmdir()
            print(f"dfim bench-realcode: {e}", file=sys.stderr)
            return 2
        source = f"model {name['name']}{' (random weights)' if name['is_random'] else ''}"
    started = time.perf_counter()
    try:  # one line per tested problem as its suite ends, in the order they end
        with (out / "tests.jsonl").open("w", encoding="utf-8") as tested:
            records = score(
                problems,
                completions,
                limits=limits,
                workers=args.workers,
                problems_file=args.problems,
                extra_paths=extra,
                progress=progress,
                stream=tested,
            )
    except OSError as e:
        return fail(prog, f"--out {out}: cannot write ({e.strerror or e})")
    for record, extra_info in zip(records, info, strict=True):
        record.update(extra_info)
    meta = {
        "command": command,
        "problems_file": args.problems,
        "source": source,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 2),
        "sandbox": {**limits.record(), "isolation": isolation},
        "environment": environment(args.device if source.startswith("model") else None),
    }
    if source.startswith("model"):  # the sampling that made the completions
        meta.update(seed=args.seed, max_tokens=args.max_tokens, device=args.device)
    rows = summarize(records)
    table = markdown(rows, meta)
    try:
        (out / "results.json").write_text(
            json.dumps({"meta": meta, "summary": rows, "problems": records}, indent=1) + "\n",
            encoding="utf-8",
        )
        (out / "summary.md").write_text(table, encoding="utf-8")
    except OSError as e:
        return fail(prog, f"--out {out}: cannot write ({e.strerror or e})")
    written = [out / "results.json", out / "summary.md", out / "tests.jsonl"]
    if source.startswith("model"):
        written.append(out / "completions.jsonl")
    stdout.write(table + f"\nwritten: {', '.join(map(str, written))}\n")
    if args.reference:
        passed = sum(r["passed"] for r in records)
        causes = "sandbox limits, the test command, or problems built from another version of the project"
        return reference_warning(prog, passed, len(records), out / "results.json", causes)
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dfim bench-realcode")
    add_arguments(parser)
    return run(parser.parse_args(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
