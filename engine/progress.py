"""Progress of a long command on stderr: a live tqdm bar on a terminal, a few plain lines in a log.

tqdm redraws one line with carriage returns, which a log file or a CI page keeps as dozens of copies. So
tqdm draws only when the stream is a terminal; otherwise a line is written when the count crosses the next
`every` share of the total or `interval` seconds have passed, and never twice for the same count. One phase
of work is one `Progress` (eval fills, then tests: two), each with its own rate and ETA.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO


def format_duration(seconds: float) -> str:
    """`3m10s`: how progress lines write an elapsed time or an ETA."""
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """Counts `total` units of one phase (`desc`): `update(n, note)` advances, `close()` ends the phase."""

    def __init__(
        self,
        total: int,
        desc: str,
        *,
        unit: str = "it",
        stream: TextIO | None = None,
        enabled: bool = True,
        every: float = 0.1,
        interval: float = 30.0,
    ) -> None:
        self.total = max(int(total), 0)
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and self.total > 0
        self.every = max(1, round(self.total * every)) if self.total else 1
        self.interval = interval
        self.done = 0
        self.note = ""
        self.start = time.perf_counter()
        self._bar: Any = None
        self._last_line_done = -1
        self._last_line_time = self.start
        self._next_step = 0
        self._ended = False
        if not self.enabled:
            return
        if _is_tty(self.stream):
            from tqdm import tqdm

            self._bar = tqdm(
                total=self.total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True, leave=True
            )
        else:
            self._line()

    def update(self, n: int = 1, note: str = "") -> None:
        """Advance by `n` units; `note` (a pass rate, the current item) goes at the end of the line."""
        self.done = min(self.total, self.done + n)
        if note:
            self.note = note
        if not self.enabled:
            return
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
            return
        now = time.perf_counter()
        if (
            self.done >= self._next_step
            or self.done >= self.total
            or now - self._last_line_time >= self.interval
        ):
            self._line()

    def _line(self) -> None:
        if self.done == self._last_line_done:  # a log never gets the same line twice
            return
        now = time.perf_counter()
        elapsed = now - self.start
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        line = f"{self.desc}: {self.done}/{self.total} {self.unit} ({100 * self.done // self.total}%)"
        line += f", {format_duration(elapsed)} elapsed"
        if eta is not None and self.done < self.total and not self._ended:
            line += f", ETA {format_duration(eta)}"
        if self.note:
            line += f"  {self.note}"
        self.stream.write(line + "\n")
        self.stream.flush()
        self._last_line_done, self._last_line_time = self.done, now
        self._next_step = (self.done // self.every + 1) * self.every

    def close(self, note: str = "") -> None:
        """End the phase: the bar stays on screen; a log gets the last count if it was not written yet, or
        again with `note` (why a phase ended before its total)."""
        if not self.enabled:
            return
        self._ended = True
        if note:
            self.note = note
            self._last_line_done = -1
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note)
            self._bar.close()
            self._bar = None
        else:
            self._line()
        self.enabled = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
