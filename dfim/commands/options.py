"""The options every `dfim` command spells the same way: --model, --device, --seed, --out, --json,
--language and --max-tokens, with their checks, and the help formatter that shows every default.

A command adds them with the `add_*` helpers below instead of its own `parser.add_argument`, so the name,
the default, the help text and the refusal of bad values are the same everywhere. Values argparse can
check alone (a device, a language) are refused by argparse with the list of valid ones (exit status 2,
as for every bad option); limits that depend on one command (the --max-tokens cap) are checked by the
command before any model loads, with `checks.InputError`.

No torch here (`dfim eval --help` must not pay for it).
"""

from __future__ import annotations

import argparse
import re

from dfim.engine.inference.canvas import BUCKETS  # no torch

# --device: the engine runs on a CPU or a CUDA GPU (`cuda:N` names one GPU of several).
DEVICES = ("cpu", "cuda")
DEVICE_METAVAR = "{cpu,cuda,cuda:N}"

# --max-tokens: the longest fill a command takes. The engine's largest canvas (a fill may run over several
# canvases of a checkpoint's own length, up to this many tokens); more was capped without a word.
MAX_TOKENS_CAP = BUCKETS[-1]

SEED_HELP = "seed of the sampler: the same seed and input give the same output"


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in its help line, `(default: X)`, unless the help already says its default
    or there is none to say (None, a flag that is off, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        nothing = action.default is None or action.default is False or action.default in ([], "")
        if "default" in text.lower() or nothing or action.default == argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def device_type(value: str) -> str:
    """`cpu`, `cuda` or `cuda:N`; anything else is refused with the valid values."""
    if value in DEVICES or re.fullmatch(r"cuda:\d+", value):
        return value
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from cpu, cuda, cuda:N)")


def language_names() -> list[str]:
    """The languages `--language` takes: every language a file extension names (dfim.server.languages)."""
    from dfim.server.languages import EXTENSIONS, GRAMMARS

    return sorted(set(EXTENSIONS.values()) | set(GRAMMARS))


def language_type(value: str) -> str:
    """A language name of `language_names()` (or an alias: py, c++, ...), refused with the list otherwise."""
    from dfim.server.languages import LANGUAGE_ALIASES

    name = value.strip().lower()
    name = LANGUAGE_ALIASES.get(name, name)
    names = language_names()
    if name in names:
        return name
    raise argparse.ArgumentTypeError(f"invalid choice: {value!r} (choose from {', '.join(names)})")


def add_model(parser: argparse.ArgumentParser | argparse._ActionsContainer, **kwargs) -> argparse.Action:
    """--model FOLDER|NAME: a checkpoint folder or a shipped model's name; unset, the shipped model (dfim-base)."""
    kwargs.setdefault("default", None)
    kwargs.setdefault("metavar", "FOLDER|NAME")
    kwargs.setdefault(
        "help",
        "checkpoint folder, or a shipped model's name: dfim-base (the default), dfim-small (in the checkout)",
    )
    return parser.add_argument("--model", **kwargs)


def add_device(parser: argparse.ArgumentParser, default: str | None = "cpu", help: str | None = None) -> None:
    """--device cpu|cuda|cuda:N, where the model runs."""
    parser.add_argument(
        "--device",
        type=device_type,
        default=default,
        metavar=DEVICE_METAVAR,
        help=help or "where the model runs",
    )


def add_seed(parser: argparse.ArgumentParser, default: int | None = 0, help: str = SEED_HELP) -> None:
    """--seed N: the sampler's seed (checked with `checks.seed`: a 64-bit integer)."""
    parser.add_argument("--seed", type=int, default=default, metavar="N", help=help)


def add_out(parser: argparse.ArgumentParser, help: str, **kwargs) -> None:
    """--out PATH: where the command writes its results (the help says what and the default)."""
    kwargs.setdefault("default", None)
    kwargs.setdefault("metavar", "PATH")
    parser.add_argument("--out", help=help, **kwargs)


def add_json(parser: argparse.ArgumentParser, help: str = "print the result as one JSON object") -> None:
    parser.add_argument("--json", action="store_true", help=help)


def add_quiet(parser: argparse.ArgumentParser, help: str = "no progress on stderr") -> None:
    parser.add_argument("--quiet", action="store_true", help=help)


def add_language(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--language",
        type=language_type,
        default=None,
        metavar="NAME",
        help="language of the file, for an unknown extension (one of: "
        + ", ".join(language_names())
        + "; default: from the extension)",
    )


def add_max_tokens(parser: argparse.ArgumentParser, default: int | None, help: str) -> None:
    """--max-tokens N: checked with `check_max_tokens` (1 to MAX_TOKENS_CAP)."""
    parser.add_argument("--max-tokens", type=int, default=default, metavar="N", help=help)


def check_max_tokens(value: int | None, flag: str = "--max-tokens") -> None:
    """Unset, or 1 to MAX_TOKENS_CAP: a larger value is refused with the cap, not capped without a word."""
    from dfim.commands.checks import InputError

    if value is None:
        return
    if value < 1:
        raise InputError(f"{flag} must be at least 1 (got {value})")
    if value > MAX_TOKENS_CAP:
        raise InputError(f"{flag} must be at most {MAX_TOKENS_CAP}, the longest fill (got {value})")
