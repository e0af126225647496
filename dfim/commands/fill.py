"""`dfim fill FILE --line L --col C`: print the code that belongs at a position of a file.

Line and column are 1-based as editors show them; the column counts characters. An empty file is filled
from nothing, as the server fills an empty document; a file without a known extension takes the language its
`#!` line names. Bad input (missing or binary file, position out of range, unknown file type, unusable
checkpoint) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import codecs
import json
import sys
from pathlib import Path

from dfim.commands import options
from dfim.cursor_fill import fill_at_cursor
from dfim.engine.progress import Progress
from dfim.server.languages import language_of_path, language_of_shebang


class InputError(Exception):
    """Bad command-line input; the message is the one line printed."""


def add_fill_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of one fill at a file position (shared by `dfim fill` and `dfim trace`); the model,
    device, seed, language and --max-tokens options are dfim.commands.options'."""
    parser.add_argument("file", help="source file")
    parser.add_argument("--line", type=int, required=True, help="1-based line of the cursor")
    parser.add_argument("--col", type=int, required=True, help="1-based column of the cursor, in characters")
    options.add_model(parser)
    options.add_device(parser)
    options.add_max_tokens(
        parser,
        None,
        f"most tokens to fill, at most {options.MAX_TOKENS_CAP} (default: 32, 64 with --multiline)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        metavar="N",
        help="most denoising steps (default: 8 for a line, as the editor's inline fills; the model's "
        "with --multiline)",
    )
    # 0 by default, as the editor's fills (server sampling.seed): the same file and position, the same fill
    options.add_seed(parser, default=0)
    options.add_language(parser)
    parser.add_argument(
        "--multiline",
        action="store_true",
        help="let the fill run over several lines (default: one line, as the server's inline completions)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_fill_arguments(parser)
    parser.add_argument(
        "--candidates",
        type=int,
        default=None,
        metavar="N",
        help="canvases denoised at once; the model's ranking picks one (dfim-base: by likelihood). "
        "Default as the editor asks: 1 for a line the model drafts (dfim-base does), else 2",
    )
    options.add_json(parser, help="print text, steps, tokens, latency, seed ... as one JSON object")
    options.add_quiet(parser, help="no progress on stderr (a --multiline fill shows its denoising steps)")


def read_source(path: Path) -> str:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err})") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError(f"{path}: UTF-16 text; dfim fill reads UTF-8 files")
    if b"\x00" in data:
        raise InputError(f"{path}: binary file (contains NUL bytes)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        at = err.start + (3 if data.startswith(codecs.BOM_UTF8) else 0)  # utf-8-sig counts after the BOM
        raise InputError(
            f"{path}: not UTF-8 text (byte {at}); dfim fill reads UTF-8 files, binary files are refused"
        ) from None


def detect_language(path: Path, override: str | None, text: str = "") -> str:
    """--language, else the file's extension, else the interpreter its `#!` line names."""
    if override:
        return override
    language = language_of_path(path.name) or language_of_shebang(text)
    if language is None:
        kind = f"'{path.suffix}'" if path.suffix else "without an extension"
        raise InputError(f"{path}: unknown file type {kind} (pass --language NAME to fill it anyway)")
    return language


def split_at(text: str, line: int, col: int) -> tuple[str, str]:
    """(prefix, suffix) around a 1-based line/column; the column may sit just after the line's end."""
    lines = text.split("\n")
    if not 1 <= line <= len(lines):
        raise InputError(
            f"line {line} is out of range (the file has {len(lines)} line{'' if len(lines) == 1 else 's'})"
        )
    content = lines[line - 1].removesuffix("\r")
    if not 1 <= col <= len(content) + 1:
        raise InputError(f"column {col} is out of range (line {line} has {len(content)} characters)")
    offset = sum(len(s) + 1 for s in lines[: line - 1]) + col - 1
    return text[:offset], text[offset:]


class StepProgress:
    """A multiline fill's denoising steps as `dfim.engine.progress.Progress`, one phase per canvas (block):
    such a fill can take seconds on a CPU. Single-line fills are too quick to need it."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.block = -1
        self.bar = None

    def on_step(self, info) -> None:  # StepInfo; step 0 is the draft, before any denoising
        if not self.enabled or info.step == 0:
            return
        if info.block != self.block or self.bar is None:
            self.close()
            self.block = info.block
            self.bar = Progress(info.max_steps, f"dfim fill: canvas {info.block + 1}", unit="steps")
        self.bar.update(
            info.step - self.bar.done, f"{info.accepted}/{info.canvas_length} canvas tokens settled"
        )

    def close(self, finished: bool = True) -> None:
        """End the bar; `finished`: the fill returned (not an error or Ctrl-C), so a bar short of its total
        means the sampler stopped early, the canvas stable and confident."""
        if self.bar is not None:
            bar = self.bar
            early = finished and bar.done < bar.total
            bar.close(f"{bar.note}; stopped after {bar.done} of {bar.total} steps" if early else "")
            self.bar = None


def empty_fill_reason(raw: str, suffix: str) -> str:
    """Why a fill shows nothing: the model wrote nothing, wrote the rest of the line again (which the editor
    cuts), or wrote something the server's post-processing drops."""
    text, rest = raw.strip(), suffix.split("\n", 1)[0].strip()
    if not text:
        return "wrote nothing here"
    if rest and (rest.startswith(text) or text.endswith(rest)):
        return "only repeated the rest of the line"
    return "wrote nothing the editor would show here (--json has its raw text)"


def fail(message: str) -> int:
    print(f"dfim fill: {message}", file=sys.stderr)
    return 2


def read_fill_input(args: argparse.Namespace) -> tuple[str, str, str]:
    """(prefix, suffix, language) for the arguments of `add_fill_arguments`; InputError when bad."""
    options.check_max_tokens(args.max_tokens)
    if args.steps is not None and args.steps < 1:
        raise InputError(f"--steps must be at least 1 (got {args.steps})")
    candidates = getattr(args, "candidates", 1)
    if candidates is not None and not 1 <= candidates <= 16:
        raise InputError(f"--candidates must be between 1 and 16 (got {args.candidates})")
    from dfim.commands.checks import not_a_file, seed  # (cli_checks imports this module: a late import)

    seed("--seed", args.seed)
    not_a_file("--model", args.model)
    path = Path(args.file)
    # The model reads and writes "\n"; a CRLF file would leave a stray "\r" before every stop.
    text = read_source(path).replace("\r\n", "\n")
    language = detect_language(path, args.language, text)
    prefix, suffix = split_at(text, args.line, args.col)
    return prefix, suffix, language


def run(args: argparse.Namespace) -> int:
    try:
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
            print(
                f"dfim fill: note: {engine.path} is an untrained (random) checkpoint; its fills are noise",
                file=sys.stderr,
            )
        steps = StepProgress(enabled=args.multiline and not args.quiet)
        try:
            filled = fill_at_cursor(
                engine,
                prefix,
                suffix,
                language,
                multiline=args.multiline,
                max_tokens=args.max_tokens,
                seed=args.seed,
                steps=args.steps,
                candidates=args.candidates,
                on_step=steps.on_step,
            )
            steps.close(finished=True)
        finally:
            steps.close(finished=False)  # an error or Ctrl-C: no word of an early stop
        result, raw = filled.result, filled.raw
    except EngineError as err:
        return fail(str(err))
    except KeyboardInterrupt:  # Ctrl-C while torch loads or the model fills: a line, not a traceback
        print("dfim fill: interrupted", file=sys.stderr)
        return 130

    if args.json:
        out = {
            "text": result.text,
            "raw_text": raw,  # the model's, before the server's post-processing
            # the other candidates (--candidates), as the model wrote them
            "alternatives": list(result.alternatives),
            "steps": result.steps,
            "tokens": result.tokens,
            "canvas_length": result.canvas_length,
            "blocks": result.blocks,
            "latency_ms": round(result.latency_ms, 1),
            "stop_reason": result.stop_reason,
            "context_tokens": result.context_tokens,
            "language": language,
            "seed": args.seed,
            "model": engine.model_name,
            "random_model": engine.is_random,
        }
        print(json.dumps(out, ensure_ascii=False))
    else:
        if not result.text.strip():
            print(
                f"dfim fill: note: the model {empty_fill_reason(raw, suffix)} (try another --seed)",
                file=sys.stderr,
            )
        sys.stdout.write(result.text if result.text.endswith("\n") else result.text + "\n")
    return 0
