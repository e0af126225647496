"""`dfim eval DATA.jsonl[.gz]`: the command line of the fill-in-the-middle evaluation.

Options are checked before any model loads; the evaluation itself lives in `dfim.engine.evaluation.fim`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import shlex
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from dfim.commands import options
from dfim.commands.provenance import environment
from dfim.engine.api import EngineError, SamplerSettings
from dfim.engine.evaluation import sandbox
from dfim.engine.evaluation.fim import (
    DEFAULT_MAX_TOKENS,
    SWEEP_FLOORS,
    SWEEP_KEYS,
    DataError,
    build_configs,
    early_stop_checks,
    engine_filler,
    evaluate,
    load_problems,
    markdown_summary,
    parse_sweep,
    reference_filler,
    summarize,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("data", help="HumanEval-infilling-format JSONL (plain or .gz)")
    options.add_model(parser)
    options.add_device(parser)
    parser.add_argument("--limit", type=int, default=None, help="evaluate only the first N problems")
    parser.add_argument("--workers", type=int, default=4, help="test programs run in parallel (default: 4)")
    options.add_seed(parser, help="problem i is filled with seed N+i: the same seed gives the same fills")
    parser.add_argument("--steps", type=int, default=None, help="override max denoising steps")
    parser.add_argument("--entropy-bound", type=float, default=None, help="override the entropy bound")
    options.add_max_tokens(
        parser, DEFAULT_MAX_TOKENS, f"canvas size, rounded up to a bucket, at most {options.MAX_TOKENS_CAP}"
    )
    parser.add_argument("--no-early-stop", action="store_true", help="always run the maximum number of steps")
    parser.add_argument(
        "--overlap-tests",
        action="store_true",
        help="run tests while the model fills (faster; latencies then share the CPU with the tests)",
    )
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="wall-clock seconds per test (default: 10)"
    )
    parser.add_argument(
        "--memory-mb",
        type=int,
        default=1024,
        help="address-space limit per test, at least 1 (default: 1024)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="SPEC",
        help="compare settings in one run, e.g. 'steps=8,16,48;early_stop=on,off' (grid; join grids with |). "
        f"Keys: {', '.join(SWEEP_KEYS)}",
    )
    options.add_out(parser, "output folder (default: runs/eval/<timestamp>)")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="score the canonical solutions instead of a model (checks the harness: expect pass@1 = 100)",
    )
    options.add_quiet(parser, help="no progress bar")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def command_line(args: argparse.Namespace) -> str:
    """The `dfim eval` command that reproduces this run: the data file and every option not at its default."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([args.data])
    words = ["dfim", "eval", args.data]
    for action in parser._actions:  # argparse keeps no public list of options
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == getattr(defaults, action.dest):
            continue
        words.append(action.option_strings[-1])
        if not isinstance(action, argparse._StoreTrueAction):
            words.append(str(value))
    return shlex.join(words)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    if args.steps is not None:
        overrides["max_steps"] = args.steps
    if args.entropy_bound is not None:
        overrides["entropy_bound"] = args.entropy_bound
    if args.no_early_stop:
        overrides["early_stop"] = False
    return overrides


def _validate(args: argparse.Namespace) -> str | None:
    """The one line to print for bad options (checked before any model loads), or None."""
    from dfim.commands.checks import InputError, at_least, not_a_file, output_folder, sandbox_limits, seed
    from dfim.commands.options import check_max_tokens

    try:
        at_least("--limit", args.limit, 1)
        at_least("--workers", args.workers, 1)
        at_least("--steps", args.steps, 1)
        at_least("--entropy-bound", args.entropy_bound, 0)
        check_max_tokens(args.max_tokens)
        sandbox_limits(args.timeout, args.memory_mb)
        seed("--seed", args.seed)  # problem i gets seed + i: torch takes up to 2**64 - 1, room enough
        not_a_file("--model", args.model)
        if args.out:
            output_folder(args.out, "--out")
    except InputError as e:
        return str(e)
    if args.sweep:
        try:
            points = parse_sweep(args.sweep)
        except ValueError as e:
            return f"--sweep: {e}"
        for point in points:
            for field, value in point.items():
                # `not value >= floor`: NaN compares False both ways; a number must also be finite, as the
                # command-line options must (cli_checks)
                bad = isinstance(value, float) and not math.isfinite(value)
                if field in SWEEP_FLOORS and (bad or not value >= SWEEP_FLOORS[field]):
                    name = "steps" if field == "max_steps" else field
                    return f"--sweep: {name} must be at least {SWEEP_FLOORS[field]} (got {value})"
    return None


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    stdout = stdout or sys.stdout
    problem = _validate(args)
    if problem:
        print(f"dfim eval: {problem}", file=sys.stderr)
        return 2
    try:
        problems = load_problems(args.data, args.limit)
    except DataError as e:
        print(f"dfim eval: {e}", file=sys.stderr)
        return 2
    limits = sandbox.SandboxLimits(timeout_s=args.timeout, memory_bytes=args.memory_mb << 20)
    if not args.reference:  # (a reference run is itself the harness check, reported below)
        from dfim.commands.checks import sandbox_problem

        problem = sandbox_problem(limits)
        if problem:
            print(f"dfim eval: {problem}", file=sys.stderr)
            return 2

    isolation = sandbox.probe(limits)  # what the tests run under here, for the user and the result file
    if sandbox.warning(isolation):
        print(f"dfim eval: warning: {sandbox.warning(isolation)}", file=sys.stderr)

    if args.reference:
        base, fill = SamplerSettings(), reference_filler
        model_info: dict[str, Any] = {
            "name": "reference (canonical solutions)",
            "path": None,
            "is_random": False,
        }
    else:
        from dfim.engine.inference.fill import (
            Engine,  # imported here so `dfim eval --help` works without loading torch
        )

        try:
            engine = Engine.load(args.model, device=args.device)
        except EngineError as e:
            print(f"dfim eval: {e}", file=sys.stderr)
            return 2
        base, fill = engine.settings, engine_filler(engine)
        model_info = {
            "name": getattr(engine, "model_name", str(args.model)),
            "path": str(args.model) if args.model else "default",
            "is_random": bool(getattr(engine, "is_random", False)),
        }
    try:
        configs = build_configs(base, args.max_tokens, _overrides(args), args.sweep)
    except (ValueError, TypeError) as e:
        print(f"dfim eval: --sweep: {e}", file=sys.stderr)
        return 2

    if not args.reference:  # warm-up: the first call pays one-time costs (allocation, kernel selection)
        try:
            fill(problems[0], configs[0], args.seed)
        except EngineError:
            pass
        for cache in engine.caches.values():  # the timed fill of problem 0 meets no context cached by it
            cache.reset()

    # Made only now, once nothing before the run can fail (no empty run folder left behind), and before the
    # run, so a folder that cannot be made costs nothing (`output_folder` checked only its nearest parent).
    out = Path(args.out) if args.out else Path("runs/eval") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    try:
        out.mkdir(parents=True, exist_ok=True)
        fills_log = open(out / "fills.jsonl", "w", encoding="utf-8")  # streamed: survives a killed run
    except OSError as e:
        print(f"dfim eval: --out {out}: cannot create ({e.strerror or e})", file=sys.stderr)
        return 2
    started = time.perf_counter()

    def log_fill(record: dict[str, Any]) -> None:
        fills_log.write(json.dumps(_finite(record), allow_nan=False) + "\n")
        fills_log.flush()

    try:
        records = evaluate(
            problems,
            configs,
            fill,
            seed=args.seed,
            workers=args.workers,
            limits=limits,
            progress=None if args.quiet else sys.stderr,
            overlap=args.overlap_tests,
            on_fill=log_fill,
        )
    except KeyboardInterrupt:
        print("dfim eval: interrupted", file=sys.stderr)
        return 130
    finally:
        fills_log.close()
    wall_s = time.perf_counter() - started

    summary = summarize(records, configs)
    checks = early_stop_checks(summary)
    data_path = Path(args.data)
    meta = {
        "command": command_line(args),
        "data": str(data_path),
        "data_name": data_path.name,
        "data_sha256": _sha256(data_path),
        "limit": args.limit,
        "model": model_info,
        "device": args.device,
        "seed": args.seed,
        "workers": args.workers,
        "tests_overlap_fills": args.overlap_tests,
        "sandbox": {**limits.record(), "isolation": isolation},
        "completion_postprocess": "first line",
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 2),
        "environment": environment(args.device if not args.reference else None),
    }
    results = {"meta": meta, "summary": summary, "early_stop_checks": checks, "problems": records}
    table = markdown_summary(meta, summary, checks)
    try:
        with open(out / "results.json", "w", encoding="utf-8") as f:
            json.dump(_finite(results), f, indent=1, allow_nan=False)
            f.write("\n")
        (out / "summary.md").write_text(table, encoding="utf-8")
    except OSError as e:  # (fills.jsonl has every fill so far)
        print(f"dfim eval: --out {out}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    stdout.write(table + f"\nwritten: {out / 'results.json'}, {out / 'summary.md'}\n")
    if args.reference:
        from dfim.commands.checks import reference_warning

        passed = sum(row["passed"] for row in summary)
        return reference_warning("dfim eval", passed, sum(row["n"] for row in summary), out / "results.json")
    return 0


def _finite(value: Any) -> Any:
    """NaN/inf (an empty config's mean, say) become null: strict JSON readers reject NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dfim eval")
    add_arguments(parser)
    return run(parser.parse_args(list(argv) if argv is not None else None))


if __name__ == "__main__":
    sys.exit(main())
