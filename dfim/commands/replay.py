"""`dfim replay FILE...`: the command line of the typing replay (`dfim.bench.replay`)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import shlex
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from dfim.bench.replay import (
    TRIGGERS,
    GitError,
    ReplayOptions,
    cancelled_by_sigterm,
    check_git,
    file_region,
    git_regions,
    markdown,
    replay,
)
from dfim.commands import options
from dfim.commands.provenance import environment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="*", metavar="PATH", help="files to type from an empty document")
    parser.add_argument(
        "--git", metavar="REPO", help="also replay the added lines of commits of this repository"
    )
    parser.add_argument(
        "--commits", type=int, default=None, help="how many recent non-merge commits (with --git; default 10)"
    )
    parser.add_argument("--rev", default=None, help="the newest commit to look at (with --git; default HEAD)")
    options.add_model(parser)
    options.add_device(parser)
    # the server's own default (sampling.seed 0): what the editor would have shown
    options.add_seed(parser, help="the server's sampling.seed: the same seed and files give the same report")
    parser.add_argument("--trigger", default="word", choices=TRIGGERS, help="when the client asks")
    parser.add_argument(
        "--every", type=int, default=8, help="characters between requests for --trigger chars"
    )
    parser.add_argument(
        "--min-partial",
        type=int,
        default=3,
        help="characters besides whitespace a common prefix needs to count as accepted",
    )
    parser.add_argument(
        "--max-chars", type=int, default=2000, help="characters replayed per file or added run"
    )
    parser.add_argument("--steps", type=int, default=None, help="server sampling.maxSteps")
    parser.add_argument("--max-canvas", type=int, default=None, help="server sampling.maxCanvas")
    parser.add_argument(
        "--settings",
        metavar="JSON",
        default=None,
        help='server settings, as an editor sends them, under the flags above (e.g. \'{"inline": '
        '{"multiline": true}}\'); the gate flags decide inline.gate',
    )
    add_gate_arguments(parser)
    options.add_out(parser, "folder for report.json and summary.md (default: runs/replay/<timestamp>)")
    options.add_quiet(parser, help="no per-region progress lines")


def add_gate_arguments(parser: argparse.ArgumentParser, live: bool = True) -> None:
    """The confidence gate's flags (dfim.server.gate); their defaults are the server's. `live`: also
    --live-gate (a replay's server may run its gate; `dfim stats` only reads what was recorded)."""
    from dfim.server.options import GateOptions

    gate = GateOptions()
    if live:
        parser.add_argument(
            "--live-gate",
            action="store_true",
            help="the server hides unsure suggestions as for a user (default: its gate is off, every "
            "suggestion is scored, and the report gives the numbers with and without the gate from one run)",
        )
    measures = {f.name: f.metadata for f in dataclasses.fields(GateOptions)}["measure"]["choices"]
    parser.add_argument("--gate-measure", default=gate.measure, choices=measures, help="inline.gate.measure")
    parser.add_argument(
        "--gate-threshold", type=float, default=gate.threshold, help="inline.gate.threshold (0 to 1)"
    )


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before a server starts (InputError: the line `dfim replay` prints). The sampling
    overrides are checked against the server's own bounds: it would refuse them and keep its defaults."""
    from dfim.commands.checks import InputError, at_least, model_folder, output_folder, within
    from dfim.server.options import SamplingOptions

    at_least("--min-partial", args.min_partial, 1)
    at_least("--every", args.every, 1)
    at_least("--max-chars", args.max_chars, 1)
    within("--gate-threshold", args.gate_threshold, 0.0, 1.0)
    if not args.git:
        given = [
            flag for flag, value in (("--commits", args.commits), ("--rev", args.rev)) if value is not None
        ]
        if given:  # silently ignored before: the user meant to replay commits
            raise InputError(
                f"{' and '.join(given)} need --git REPO (the repository whose commits to replay)"
            )
    args.server_settings = settings_object(args.settings)
    args.commits = 10 if args.commits is None else args.commits
    args.rev = args.rev or "HEAD"
    at_least("--commits", args.commits, 1)
    bounds = {f.name: f.metadata for f in dataclasses.fields(SamplingOptions)}
    for flag, value, name in (
        ("--steps", args.steps, "max_steps"),
        ("--max-canvas", args.max_canvas, "max_canvas"),
        ("--seed", args.seed, "seed"),
    ):
        within(flag, value, bounds[name]["min"], bounds[name]["max"])
    if args.model:
        model_folder(args.model)
    if args.out:
        output_folder(args.out, "--out")
    if args.git:
        check_git(args.git, args.rev)


def settings_object(text: str | None) -> dict:
    """--settings: a JSON object of server settings ({} when not given); InputError for anything else."""
    from dfim.commands.checks import InputError

    if text is None:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"--settings: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, dict):
        raise InputError(
            '--settings: a JSON object of server settings, e.g. \'{"inline": {"multiline": true}}\''
        )
    from dfim.server.options import Options, merge_options

    _, errors = merge_options(Options(), value)  # the server would drop these with a message: refuse them
    if errors:
        raise InputError("--settings: " + "; ".join(e.removesuffix(" (ignored)") for e in errors))
    return value


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    from dfim.commands.checks import InputError, fail

    stdout = stdout or sys.stdout
    options = ReplayOptions(
        args.trigger,
        args.every,
        args.min_partial,
        args.max_chars,
        gate_live=args.live_gate,
        gate_measure=args.gate_measure,
        gate_threshold=args.gate_threshold,
    )
    try:
        check_args(args)
        regions = [file_region(p) for p in args.paths]
        if args.git:
            regions += git_regions(args.git, args.commits, args.rev, args.max_chars)
    except InputError as e:
        return fail("dfim replay", str(e))
    except GitError as e:
        return fail("dfim replay", str(e))
    except OSError as e:
        return fail("dfim replay", str(e))
    for r in regions:
        r.typed = r.typed[: args.max_chars]
    regions = [r for r in regions if r.typed]
    if not regions:
        print("dfim replay: nothing to replay (give files or --git REPO)", file=sys.stderr)
        return 2
    sampling = {
        k: v
        for k, v in (("maxSteps", args.steps), ("maxCanvas", args.max_canvas), ("seed", args.seed))
        if v is not None
    }
    # The server runs in the repository root (so no `dfim` folder in the user's cwd shadows the package):
    # a relative --model must be resolved here, against the cwd it was checked in (a shipped model's bare
    # name, which is no folder here, goes as it is).
    model = str(Path(args.model).resolve()) if args.model and Path(args.model).exists() else args.model or ""
    out = Path(args.out) if args.out else Path("runs/replay") / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    made = not out.exists()
    try:  # made before the replay runs: a folder that cannot be made must not cost the whole replay
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return fail("dfim replay", f"--out {out}: cannot create ({e.strerror or e})")
    started = time.perf_counter()
    work = replay(
        regions,
        model=model,
        device=args.device,
        options=options,
        server_settings={
            **args.server_settings,
            "sampling": {**args.server_settings.get("sampling", {}), **sampling},
        },
        progress=None if args.quiet else sys.stderr,
    )
    try:
        # signal handlers can only be set from the main thread (tests call run() from others)
        on_main = threading.current_thread() is threading.main_thread()
        report = asyncio.run(cancelled_by_sigterm(work) if on_main else work)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("dfim replay: interrupted", file=sys.stderr)
        return 130
    except (RuntimeError, TimeoutError) as e:
        if made:  # nothing was written: no empty folder left behind
            out.rmdir()
        print(f"dfim replay: {e}", file=sys.stderr)
        return 2
    rest = sys.argv[sys.argv.index("replay") + 1 :] if "replay" in sys.argv else sys.argv[1:]
    report["meta"] = {
        "command": "dfim replay " + " ".join(shlex.quote(a) for a in rest),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - started, 2),
        "sources": [r.source for r in regions],
        "seed": args.seed,
        "environment": environment(args.device),
    }
    table = markdown(report)
    try:
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        (out / "summary.md").write_text(table, encoding="utf-8")
    except OSError as e:
        return fail("dfim replay", f"--out {out}: cannot write ({e.strerror or e})")
    stdout.write(table + f"\nwritten: {out / 'report.json'}, {out / 'summary.md'}\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dfim replay")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
