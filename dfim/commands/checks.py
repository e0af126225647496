"""Checks of command-line input shared by the `dfim` commands (and `dfim data`).

Every command answers bad input as `dfim fill` does (dfim/commands/fill.py): one line on stderr,
`dfim COMMAND: what is wrong`, naming the flag or the file, and exit status 2; never a traceback, a
hang, or a run that does nothing and exits 0. The checks raise `InputError` (the class `dfim fill`
uses) with that line; a command's `run` catches it and returns `fail(prog, str(err))`.

No torch here: a command refuses bad options before it loads a model or reads its data.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from dfim.commands.fill import InputError, read_source

__all__ = [
    "InputError",
    "at_least",
    "existing_dir",
    "existing_file",
    "fail",
    "output_file",
    "output_folder",
    "positive",
    "read_text_file",
    "not_a_file",
    "sandbox_limits",
    "seed",
    "within",
]


def fail(prog: str, message: str) -> int:
    """Print `prog: message` on stderr; the exit status of bad input (2)."""
    print(f"{prog}: {message}", file=sys.stderr)
    return 2


# The largest values the sandbox options take: past them a limit is no limit (and `setrlimit` overflows).
MAX_TIMEOUT_S = 86400.0  # a day per test run
MAX_MEMORY_MB = 1 << 30  # 1 PiB of address space
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64: what torch's generator takes (it overflows past 2**64)


def _number(value: float) -> bool:
    """Finite: argparse's `type=float` reads "nan" and "inf", and neither is a usable option value."""
    return not (isinstance(value, float) and not math.isfinite(value))


def at_least(flag: str, value: float | None, minimum: float) -> None:
    """`flag` is unset (None) or >= minimum."""
    if value is not None and not (_number(value) and value >= minimum):
        raise InputError(f"{flag} must be at least {minimum} (got {value})")


def positive(flag: str, value: float | None) -> None:
    """`flag` is unset (None) or > 0."""
    if value is not None and not (_number(value) and value > 0):
        raise InputError(f"{flag} must be greater than 0 (got {value})")


def within(
    flag: str,
    value: float | None,
    low: float,
    high: float,
    *,
    open_low: bool = False,
    open_high: bool = False,
) -> None:
    """`flag` is unset (None) or in the interval [low, high] (either end open if asked)."""
    if value is None:
        return
    above = value > low if open_low else value >= low
    below = value < high if open_high else value <= high
    if not (_number(value) and above and below):
        interval = f"{'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
        raise InputError(f"{flag} must be in {interval} (got {value})")


def seed(flag: str, value: int | None) -> None:
    """`flag` is unset (None) or a 64-bit signed integer (torch refuses larger seeds with a traceback)."""
    low, high = SEED_RANGE
    if value is not None and not low <= value <= high:
        raise InputError(f"{flag} must be a 64-bit integer, in [{low}, {high}] (got {value})")


def not_a_file(flag: str, path: str | os.PathLike | None) -> None:
    """A checkpoint option (`--model`) that names a file, said as such (the engine would say "folder not
    found"); a missing folder is left for the engine to report."""
    if path and Path(path).is_file():
        raise InputError(f"{flag} {path}: is a file, not a folder (name the checkpoint folder)")


def sandbox_limits(timeout: float, memory_mb: int) -> None:
    """`--timeout` seconds and `--memory-mb` for the test sandbox: positive and finite, at most a day and
    1 PiB (larger values are no limit at all, and overflow `setrlimit`). 0 MiB would mean "no limit" to the
    sandbox: the commands keep the memory-bomb guard, 1 MiB or more."""
    within("--timeout", timeout, 0, MAX_TIMEOUT_S, open_low=True)
    within("--memory-mb", memory_mb, 1, MAX_MEMORY_MB)


def _label(path: str | os.PathLike, flag: str | None) -> str:
    return f"{flag} {path}" if flag else str(path)


def existing_file(path: str | os.PathLike, flag: str | None = None) -> Path:
    """A file that exists (not a folder)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{_label(path, flag)}: no such file")
    if p.is_dir():
        raise InputError(f"{_label(path, flag)}: is a folder, not a file")
    return p


def model_folder(value: str, flag: str = "--model") -> None:
    """A model option: a checkpoint folder, or the bare name of a shipped one (`dfim-small`), as the engine
    resolves it (`shipped.resolve_checkpoint`)."""
    from dfim.engine.model.shipped import names_note, resolve_checkpoint

    folder = resolve_checkpoint(value)
    if not folder.exists():
        raise InputError(f"{flag} {value}: no such folder{names_note(folder)}")
    existing_dir(folder, flag)


def existing_dir(path: str | os.PathLike, flag: str | None = None) -> Path:
    """A folder that exists."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{_label(path, flag)}: no such folder")
    if not p.is_dir():
        raise InputError(f"{_label(path, flag)}: is a file, not a folder")
    return p


def _creatable(p: Path, label: str) -> None:
    """The first existing folder above `p` is a folder this process may write into."""
    ancestor = p.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(f"{label}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise InputError(f"{label}: cannot write in {ancestor} (permission denied)")


def output_folder(path: str | os.PathLike, flag: str = "--out") -> Path:
    """A run folder to create (or write into): refused when it is a file or cannot be made."""
    p = Path(path)
    label = _label(path, flag)
    if p.exists():
        if not p.is_dir():
            raise InputError(f"{label}: exists and is not a folder (name a folder to write into)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise InputError(f"{label}: cannot write in this folder (permission denied)")
        return p
    _creatable(p, label)
    return p


def output_file(path: str | os.PathLike, flag: str = "--out") -> Path:
    """A file to (over)write: refused when it is a folder or its folder cannot be made."""
    p = Path(path)
    label = _label(path, flag)
    if p.is_dir():
        raise InputError(f"{label}: is a folder (name the file to write)")
    if p.exists():
        if not os.access(p, os.W_OK):
            raise InputError(f"{label}: cannot overwrite this file (permission denied)")
        return p
    _creatable(p, label)
    return p


def read_text_file(path: str | os.PathLike, prog: str) -> str:
    """A UTF-8 source file's text; missing, empty, binary (NUL bytes) and non-UTF-8 files are refused with
    `dfim fill`'s messages (`prog` names the command in them)."""
    p = Path(path)
    if p.is_file() and p.stat().st_size == 0:
        raise InputError(f"{path}: empty file")
    try:
        return read_source(p)
    except InputError as err:
        raise InputError(str(err).replace("dfim fill", prog)) from None


def sandbox_problem(limits) -> str | None:
    """Why the test sandbox (dfim.engine.evaluation.sandbox) cannot run even an empty program under `limits`, or None.

    Every test would fail the same way, so a benchmark would report pass@1 0 for a broken harness."""
    from dfim.engine.evaluation import sandbox

    result = sandbox.run_program("pass\n", limits)
    if result.passed:
        return None
    how = "timed out" if result.timed_out else f"exit status {result.returncode}"
    last = (result.stderr.strip().splitlines() or [""])[-1][:200]
    return (
        f"the test sandbox cannot run an empty program under these limits ({how}"
        f"{': ' + last if last else ''}); raise --memory-mb or --timeout"
    )


def reference_warning(
    prog: str, passed: int, total: int, results: str | os.PathLike, causes: str = "sandbox limits or bad data"
) -> int:
    """The exit status of a `--reference` run: 0 when every canonical solution passed; otherwise a warning
    line (the harness or the data is broken: the numbers mean nothing) and 1."""
    if total and passed == total:
        return 0
    share = 100.0 * passed / total if total else 0.0
    print(
        f"{prog}: warning: only {passed}/{total} reference solutions pass ({share:.1f}%, expected 100%): "
        f"the test harness is broken ({causes}); see {results}",
        file=sys.stderr,
    )
    return 1
