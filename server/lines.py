"""Lines, indentation and brackets of a document's text, by offset (Python string indices). Quotes and
comments are read by the engine's one scanner (`dfim.engine.layout.scan_code`).

Line ends are \n, \r\n or a lone \r, as LSP counts them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from dfim.engine.layout import MATCH, OPENERS, scan_brackets


def split_lines(text: str) -> list[str]:
    """Lines without their ends (`\\r\\n`, `\\r`, `\\n` all count)."""
    return re.split(r"\r\n|\r|\n", text)


def is_word_char(c: str) -> bool:
    return len(c) == 1 and (c.isalnum() or c == "_")


def line_start(text: str, offset: int) -> int:
    nl = text.rfind("\n", 0, offset)
    return max(nl, text.rfind("\r", nl + 1, offset)) + 1  # look for a lone \r only after the last \n


def line_end(text: str, offset: int) -> int:
    nl = text.find("\n", offset)
    if nl < 0:
        nl = len(text)
    cr = text.find("\r", offset, nl)  # only up to the next \n: never scan the rest of the file
    return cr if cr >= 0 else nl


def next_line_start(text: str, offset: int) -> int:
    end = line_end(text, offset)
    if text.startswith("\r\n", end):
        return end + 2
    return min(end + 1, len(text))


def indent_width(line: str) -> int:
    """Visual width of a line's leading whitespace (tabs count 4)."""
    stripped = line[: len(line) - len(line.lstrip(" \t"))]
    return len(stripped.expandtabs(4))


def newline_of(text: str) -> str:
    """The document's line end (CRLF documents get CRLF completions)."""
    crlf = text.count("\r\n")
    return "\r\n" if crlf and crlf >= text.count("\n") - crlf else "\n"


def open_brackets(prefix: str, limit: int = 2000, opened: Sequence[str] = ()) -> list[str]:
    """Brackets opened in the tail of `prefix` and not yet closed (strings and comments roughly skipped),
    after `opened` (those open before it, innermost last)."""
    stack = list(opened)
    for _, c in scan_brackets(prefix[-limit:], skip_comments=True):
        if c in OPENERS:
            stack.append(c)
        elif stack and stack[-1] == MATCH[c]:
            stack.pop()
    return stack


# A triple-quoted string (a docstring), its contents blanked: the line-by-line scan of quotes would read its
# second line on as code.
_TRIPLE_QUOTED = re.compile(r"(\"\"\"|\'\'\')(.*?)\1", re.S)


def closers_provided(suffix: str, outer: list[str]) -> int:
    """How many of the `outer` open brackets (innermost last) the suffix closes, reading the rest of the line
    and a few lines more; brackets in comments and docstrings close nothing (`(at once)` in prose)."""
    own: list[str] = []
    closed = 0
    remaining = list(outer)
    text = _TRIPLE_QUOTED.sub(lambda m: m[1] + re.sub(r"\S", " ", m[2]) + m[1], suffix[:400])
    for _, c in scan_brackets(text, skip_comments=True):
        if c in OPENERS:
            own.append(c)
        elif own and own[-1] == MATCH[c]:
            own.pop()
        elif remaining and remaining[-1] == MATCH[c]:
            remaining.pop()
            closed += 1
        else:
            break
    return closed
