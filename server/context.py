"""What the model sees and what it must fill: the fill mode at a cursor, and the `FillContext` built from it
(windows from `dfim.server.windows`, holes from `dfim.server.holes`).

Everything here is a pure function of the document text and an offset (Python string indices). Languages
without a grammar fall back to line heuristics (blank lines and indentation).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from dfim.engine.layout import CLOSERS, indent_unit, leading_ws, opens_block, statement_indent
from dfim.server.holes import empty_body_at
from dfim.server.languages import Source
from dfim.server.lines import line_end, line_start, newline_of
from dfim.server.windows import CHARS_PER_TOKEN_GUESS, fit_window

MAX_TOKENS = {"line": 32, "multiline": 64, "block": 128}


@dataclass
class FillContext:
    prefix: str  # window text before the fill
    suffix: str  # window text after the fill
    start: int  # document offsets of the text the fill replaces (start == end: a pure insertion)
    end: int
    mode: str  # "line" | "multiline" | "block"
    indent: str  # indentation of the block the fill must stay inside (multiline/block)
    rest_of_line: str  # text after the cursor on its line (single-line fills must end before it)
    lang: str | None
    max_tokens: int
    newline: str = "\n"
    # A single-line fill in a line's indentation, before its code: the fill is a new line above that code
    # (joining two statements on one line is never what a fill there means), so the suggestion ends with a
    # line break and the indentation the code had.
    opens_line: bool = False
    # Indentation dfim typed for the user (`with_lead`): the model sees it at the end of the prefix and the
    # suggestion starts with it.
    lead: str = ""

    @property
    def before_on_line(self) -> str:
        """The cursor's line before the cursor, as the document has it (without `lead`)."""
        head = self.prefix[line_start(self.prefix, len(self.prefix)) :]
        return head[: len(head) - len(self.lead)]


def decide_mode(source: Source, cursor: int) -> tuple[str, int, int, str]:
    """(mode, start, end, indent): what to fill at the cursor.

    - cursor in an empty function body (or one holding only a hole): the whole body ("block");
    - on a blank line, or right after an opener at the end of a line: several lines ("multiline");
    - otherwise: the rest of the current line ("line").
    """
    text = source.text
    ls, le = line_start(text, cursor), line_end(text, cursor)
    before, after = text[ls:cursor], text[cursor:le]
    if not after.strip() or all(c in CLOSERS + ";,:\"'` \t" for c in after):
        body = empty_body_at(source, cursor)
        if body is not None and (not before.strip() or before.rstrip().endswith(("{", ":"))):
            return "block", body.start, body.end, body.indent
    if after.strip() and not all(c in CLOSERS + ";,:\"'` \t" for c in after):
        return "line", cursor, cursor, leading_ws(before)
    if not before.strip() and after.strip():  # only closing brackets after it: a new line above them
        return "line", cursor, cursor, leading_ws(before)
    if not before.strip():
        return "multiline", cursor, cursor, before
    if before.rstrip().endswith(("{", ":", "(", "[")) and not after.strip():
        return (
            "multiline",
            cursor,
            cursor,
            statement_indent(text[:cursor], source.lang) + indent_unit(text, source.lang),
        )
    return "line", cursor, cursor, leading_ws(before)


PARSE_MARGIN = 6000  # characters parsed beyond the windows: enough to see the enclosing definition


def region(text: str, start: int, end: int, before: int, after: int) -> tuple[int, int]:
    """Line-aligned [lo, hi) around [start, end): only this much of a big file is parsed per request (a full
    parse of a 300 KB file costs ~200 ms; a region of a few KB, a few ms). A line longer than the window is
    cut by characters (at most twice `before`/`after` from the span): a 5 MB single line parsed whole kept the
    message loop from reading anything, cancels included, for seconds (issue 34)."""
    lo = 0 if start - before <= 0 else max(line_start(text, start - before), start - 2 * before)
    hi = len(text) if end + after >= len(text) else min(line_end(text, end + after), end + 2 * after)
    return lo, hi


def build_context(
    text: str,
    cursor: int,
    lang: str | None,
    prefix_tokens: int = 1024,
    suffix_tokens: int = 256,
    max_canvas: int = 128,
    count_tokens: Callable[[str], int] | None = None,
    mode: str | None = None,
    span: tuple[int, int] | None = None,
) -> FillContext:
    """Everything a fill at `cursor` needs. `mode`/`span` force a decision (code actions)."""
    s_start, s_end = span if span is not None else (cursor, cursor)
    lo, hi = region(
        text,
        min(cursor, s_start),
        max(cursor, s_end),
        int(prefix_tokens * CHARS_PER_TOKEN_GUESS) + PARSE_MARGIN,  # the windows' first, widest try
        int(suffix_tokens * CHARS_PER_TOKEN_GUESS) + PARSE_MARGIN,
    )
    ctx = _build_context(
        text[lo:hi],
        cursor - lo,
        lang,
        prefix_tokens,
        suffix_tokens,
        max_canvas,
        count_tokens,
        mode,
        (s_start - lo, s_end - lo) if span is not None else None,
        origin=lo,
        total=len(text) - lo,
    )
    ctx.start += lo
    ctx.end += lo
    ctx.newline = newline_of(text[max(0, cursor - 20000) : cursor + 20000])
    return ctx


def _build_context(
    text: str,
    cursor: int,
    lang: str | None,
    prefix_tokens: int,
    suffix_tokens: int,
    max_canvas: int,
    count_tokens: Callable[[str], int] | None,
    mode: str | None,
    span: tuple[int, int] | None,
    origin: int = 0,  # `text` is the document from this offset (the parsed region)
    total: int | None = None,  # the document's length counted from `origin`
) -> FillContext:
    source = Source(text, lang)
    decided, start, end, indent = decide_mode(source, cursor)
    if mode is not None:
        decided = mode
    if span is not None:
        start, end = span
        indent = leading_ws(text[line_start(text, start) : start + 1]) if mode != "block" else indent
    w_start, w_end = fit_window(source, start, end, prefix_tokens, suffix_tokens, count_tokens, origin, total)
    return FillContext(
        prefix=text[w_start:start],
        suffix=text[end:w_end],
        start=start,
        end=end,
        mode=decided,
        indent=indent,
        rest_of_line=text[end : line_end(text, end)],
        lang=source.lang,
        max_tokens=min(MAX_TOKENS[decided], max_canvas),
        newline="\n",
        opens_line=opens_line(text, start, end, decided),
    )


def guess_indent(text: str, at: int) -> str:
    """The indentation a new line at line start `at` most likely has: the previous non-blank line's, one unit
    deeper after a line that opens a block (`:`, `{`, `(`, `[`)."""
    end = at
    while end > 0:
        start = line_start(text, end - 1)
        line = text[start:end].rstrip("\r\n")
        if line.strip():
            deeper = line.split("#", 1)[0].split("//", 1)[0].rstrip().endswith((":", "{", "(", "["))
            return leading_ws(line) + (indent_unit(text) if deeper else "")
        end = start
    return ""


def with_lead(ctx: FillContext, text: str) -> FillContext | None:
    """The context with the indentation typed for the user, for a cursor at column 0 of a blank line (where a
    FIM harness cuts; an editor would have indented); None elsewhere or when the guess is no indentation.
    Only a last try (decision 37): the model, seeing the code after the cursor, chooses the indentation
    better than this guess, but there it sometimes writes nothing or a copy of the next line."""
    if (
        ctx.mode not in ("line", "multiline")
        or ctx.start != ctx.end
        or ctx.start != line_start(text, ctx.start)
        or ctx.rest_of_line.strip()
    ):
        return None
    lead = guess_indent(text, ctx.start)
    if not lead:
        return None
    indent = lead if ctx.mode == "multiline" else ctx.indent
    return replace(ctx, prefix=ctx.prefix + lead, lead=lead, indent=indent)


def one_line(ctx: FillContext) -> FillContext:
    """A blank line's several-line fill asked as a single-line one (the server's `inline.multiline` off):
    the line mode's canvas, newline stop and post-processing. Other fills are returned as they are: an
    empty body is filled whole, and after an opener the first line of the fill is the break itself."""
    blank_line = (
        not ctx.rest_of_line.strip() and not ctx.prefix[line_start(ctx.prefix, len(ctx.prefix)) :].strip()
    )
    if ctx.mode != "multiline" or not blank_line:
        return ctx
    return replace(ctx, mode="line", max_tokens=min(MAX_TOKENS["line"], ctx.max_tokens))


def single_line(ctx: FillContext, text: str, cursor: int) -> FillContext:
    """The fill the server asks while `inline.multiline` is off: one line at a time (decisions 25 and 49).

    - a blank line (several lines otherwise): that line, as a single-line fill (`one_line`);
    - a blank line of an empty body (the whole body otherwise): that line;
    - the end of a line that opens a block (`if x:▮`, `def f():▮`, `{▮`): the block's first line, on a new
      line: the model reads the line break and the block's indentation at the end of its prefix, and the
      suggestion starts with them (`lead`);
    - the end of a line after `(`, `[` or another colon: the rest of that line (arguments mostly go on it).

    Each is then the line mode's canvas, drafted by the encoder, with a newline stop and the line
    post-processing. The windows stay where the first decision put them; only the text between it and the
    cursor moves into them. Anything else is returned as it is."""
    if ctx.mode == "multiline" and ctx.start == ctx.end == cursor:
        ctx = one_line(ctx)
        if ctx.mode == "line":
            return ctx
    if ctx.mode not in ("multiline", "block") or not ctx.start <= cursor <= ctx.end:
        return ctx
    ls, le = line_start(text, cursor), line_end(text, cursor)
    before, after = text[ls:cursor], text[cursor:le]
    opener = before.rstrip()[-1:]
    if after.strip() or (before.strip() and opener not in ":{(["):
        return ctx
    line = replace(
        ctx,
        prefix=ctx.prefix + text[ctx.start : cursor],
        suffix=text[cursor : ctx.end] + ctx.suffix,
        start=cursor,
        end=cursor,
        mode="line",
        indent=leading_ws(before),
        rest_of_line=after,
        max_tokens=min(MAX_TOKENS["line"], ctx.max_tokens),
        opens_line=False,
    )
    if opens_block(before, ctx.lang):
        lead = ctx.newline + ctx.indent
        return replace(line, prefix=line.prefix + lead, lead=lead, indent=ctx.indent)
    return line


# C++ lines whose block may start with an access specifier, or that are one (` public:`, one space in):
# the block's indentation is not theirs plus a step
CLASS_HEAD = re.compile(r"\s*((template\s*<.*>\s*)?(class|struct)\b|(public|private|protected)\s*:)")
# a switch: `case` often stands at the switch's own depth (gofmt)
SWITCH_HEAD = re.compile(r"\s*(\}\s*)?(switch|select)\b")


def block_lead_for(ctx: FillContext, text: str, cursor: int) -> FillContext:
    """A several-line fill (`inline.multiline` on) at the end of a line that opens a block: the line break
    and the block's indentation typed for the model, as `single_line` types them for the block's first line.
    Without them the model reads `{` straight before the suffix and mostly writes nothing: 26 of 30 held-out
    C++ blocks came back empty, 1 of 30 with them (docs/bench/postprocess-2026-11-29/). Anything else is
    returned as it is."""
    if ctx.mode != "multiline" or not ctx.start == ctx.end == cursor or ctx.lead:
        return ctx
    ls, le = line_start(text, cursor), line_end(text, cursor)
    if text[cursor:le].strip() or not opens_block(text[ls:cursor], ctx.lang):
        return ctx
    if (ctx.lang == "cpp" and CLASS_HEAD.match(text[ls:cursor])) or SWITCH_HEAD.match(text[ls:cursor]):
        return ctx
    lead = ctx.newline + ctx.indent
    return replace(ctx, prefix=ctx.prefix + lead, lead=lead)


def opens_line(text: str, start: int, end: int, mode: str) -> bool:
    """A pure insertion on the line's indentation with code after it (see `FillContext.opens_line`)."""
    if mode != "line" or start != end:
        return False
    return not text[line_start(text, start) : start].strip() and bool(text[end : line_end(text, end)].strip())
