"""`dfim trace FILE --line L --col C`: record one fill step by step and write a self-contained HTML replay.

Input checks are `dfim fill`'s (dfim/commands/fill.py); bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dfim.commands import options
from dfim.commands.fill import InputError, add_fill_arguments, read_fill_input
from dfim.cursor_fill import fill_request, fit_to_model, window
from dfim.engine.inference.trace import build_html, plural, record
from dfim.engine.layout import block_lead


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fill_arguments(parser)
    options.add_out(parser, "HTML file to write", default="trace.html")


def fail(message: str) -> int:
    print(f"dfim trace: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    try:
        if out.is_dir():
            raise InputError(f"{out}: is a directory")
        if not out.parent.is_dir():
            raise InputError(f"{out.parent}: no such directory for --out")
        prefix, suffix, language = read_fill_input(args)
    except InputError as err:
        return fail(str(err))

    from dfim.engine.api import (
        EngineError,  # torch loads (dfim.engine.inference.fill) only once the input is known good
    )

    try:
        from dfim.engine.inference.fill import Engine

        engine = Engine.load(args.model, device=args.device)
        if engine.is_random:
            print(f"dfim trace: note: {engine.path} is an untrained (random) checkpoint", file=sys.stderr)
        prefix, suffix = fit_to_model(*window(prefix, suffix), engine)
        # at a block opener the model reads the line break and indentation first, as `dfim fill`'s does
        lead = "" if args.multiline else block_lead(prefix, suffix, language)
        request = fill_request(
            prefix + lead,
            suffix,
            engine.settings,
            multiline=args.multiline,
            max_tokens=args.max_tokens,
            seed=args.seed,
            steps=args.steps,
        )
        trace = record(engine, request)
    except EngineError as err:
        return fail(str(err))
    except KeyboardInterrupt:  # Ctrl-C while torch loads or the model fills: a line, not a traceback
        print("dfim trace: interrupted", file=sys.stderr)
        return 130
    try:
        out.write_text(build_html(trace), encoding="utf-8")
    except OSError as err:
        return fail(f"{out}: cannot write ({err.strerror or err})")
    drafted = " (after the encoder's draft)" if trace.frames and trace.frames[0].step == 0 else ""
    print(
        f"{out}: {plural(trace.steps, 'step')}{drafted}, {trace.latency_ms:.0f} ms, stop: {trace.stop_reason}"
    )
    return 0
