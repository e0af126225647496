"""What post-processing reads around a fill, worked out once per request (`post_context`).

A `FillContext` holds the windows; the rules of `dfim.server.postprocess` also need what follows from them:
the brackets open before the fill and how many of those the suffix closes, the line above and whether it
opens something, the next line of code, whether the cursor is inside a word, syntax errors of the code with
a fill in place. Each is computed here once, and every candidate of the request (and every retry with the
same context) reads it; no rule goes back to the context's code.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from dfim.engine.layout import MATCH, OPENERS, code_of_line, open_placeholder, open_quote, scan_brackets
from dfim.server.context import FillContext
from dfim.server.languages import error_count
from dfim.server.lines import closers_provided, indent_width, is_word_char, open_brackets, split_lines

# A name that fills an expression or type slot in every language served: what "parses with the slot filled"
# is measured with
SLOT_NAME = "x"


@dataclass(frozen=True)
class PostContext:
    # from the FillContext (see there)
    prefix: str
    suffix: str
    mode: str
    indent: str
    rest_of_line: str
    lang: str | None
    newline: str
    opens_line: bool
    lead: str
    before_on_line: str  # the cursor's line before the cursor, as the document has it (without `lead`)
    # worked out from it
    outer: tuple[str, ...]  # brackets the prefix leaves open (innermost last)
    may_close: int  # how many of `outer` a fill may close: the suffix closes the others
    line_opened: int  # how many of `outer` (the innermost) the cursor's line opened before the cursor
    ends_line: bool  # a single-line fill that ends its line: it closes the brackets it opens...
    body_follows: bool  # ...unless the next line of code is indented deeper: what it opens goes on there
    in_string: str  # the quote the cursor's line leaves open before the cursor ("": the cursor is in code)
    in_placeholder: bool  # ...and a `{` in that string that nothing closed yet (`f"{▮}"`, `` `${▮}` ``)
    in_word: bool  # the cursor is inside a word (`BUCK▮ETS`)
    line_above: str  # the last line of code above the cursor's (`\n` line ends, as the document has it)
    line_above_opens: bool  # its code (a comment aside) ends with `:`, a bracket, a comma or a backslash
    repeat_above: (
        str  # a blank line's fill must not be this: the last line of code above, stripped ("": none)
    )
    following: str  # the suffix's first line of code (any line end), as it is
    # syntax errors of the code around the fill (`parse_window`) with a given fill in its place; cached
    errors: Callable[[str], int] = field(compare=False, repr=False)

    def baseline_errors(self) -> int:
        """The syntax errors around the fill before it: with nothing in its place, or with a name there where
        that parses better. The cursor often sits in a slot that must be filled (`"a" + ▮)`, `=> ▮;`,
        `Vec<▮>`), where the empty fill is an error of its own that a broken fill would hide behind."""
        return min(self.errors(""), self.errors(SLOT_NAME))


def post_context(ctx: FillContext) -> PostContext:
    """Everything the post-processing rules read, from a fill's context."""
    outer = open_brackets(ctx.prefix)
    above = next((line for line in reversed(ctx.prefix.split("\n")[:-1]) if line.strip()), "")
    code_above = code_of_line(above.rstrip("\r"), ctx.lang).rstrip()
    prefix_lines = split_lines(ctx.prefix)
    previous = next((s.strip() for s in reversed(prefix_lines) if s.strip()), "")
    following = next((line for line in split_lines(ctx.suffix) if line.strip()), "")
    # the fill's own line: a new one after `lead` where the fill opens a line, else the cursor's
    own_line = ctx.lead.rsplit("\n", 1)[-1] if "\n" in ctx.lead else ctx.before_on_line
    return PostContext(
        prefix=ctx.prefix,
        suffix=ctx.suffix,
        mode=ctx.mode,
        indent=ctx.indent,
        rest_of_line=ctx.rest_of_line,
        lang=ctx.lang,
        newline=ctx.newline,
        opens_line=ctx.opens_line,
        lead=ctx.lead,
        before_on_line=ctx.before_on_line,
        outer=tuple(outer),
        may_close=len(outer) - closers_provided(ctx.suffix, outer),
        line_opened=min(len(outer), len(open_brackets(ctx.before_on_line))),
        ends_line=ctx.mode == "line" and (ctx.opens_line or not ctx.rest_of_line.strip()),
        body_follows=bool(following) and indent_width(following) > indent_width(own_line),
        in_string=open_quote(ctx.before_on_line, ctx.lang) if not ctx.lead else "",
        in_placeholder=not ctx.lead and open_placeholder(ctx.before_on_line, ctx.lang),
        in_word=is_word_char(ctx.prefix[-1:]) and is_word_char(ctx.rest_of_line[:1]),
        line_above=above,
        line_above_opens=code_above.endswith((":", "{", "(", "[", ",", "\\")),
        repeat_above=previous if prefix_lines[-1].strip() == "" else "",
        following=following,
        errors=error_counter(ctx.prefix, ctx.suffix, ctx.lang),
    )


def parse_window(prefix: str, suffix: str, before: int = 4000, after: int = 2000) -> tuple[str, str]:
    """The end of `prefix` from a line that starts at column 0 (a top-level statement) and the start of
    `suffix` to a line end: enough code around a fill to parse, at a bounded cost."""
    if len(prefix) > before:
        cut = prefix.find("\n", len(prefix) - before) + 1
        top = re.compile(r"^\S", re.M).search(prefix, cut)
        prefix = prefix[top.start() if top else cut :]
    if len(suffix) > after:
        end = suffix.find("\n", after)
        suffix = suffix if end < 0 else suffix[:end]
    return prefix, suffix


def error_counter(prefix: str, suffix: str, lang: str | None) -> Callable[[str], int]:
    """Syntax errors of the code with a given fill in the fill's place, parsed in `parse_window` around it;
    remembered per fill text, so the rules never parse the same document twice. The window ends where the
    file goes on, so the blocks still open at its end are closed before parsing: otherwise a fill that
    completes a block (its `}` in the suffix) would leave the window's outer `namespace {` unclosed, and
    count an error the file does not have."""
    before, after = parse_window(prefix, suffix)
    open_before = open_brackets(before, limit=len(before))
    after_closes, after_opens = _net_brackets(after)

    @functools.cache
    def errors(fill: str) -> int:
        stack = open_brackets(fill, limit=len(fill), opened=open_before)
        for c in after_closes:
            if stack and stack[-1] == MATCH[c]:
                stack.pop()
        stack += after_opens
        # blocks only: a call left open (`total = foo(xs,` while typing) is the document's own error,
        # and closing it at the window's end would pull the code below into its arguments
        closers = "}" * len(stack) if set(stack) == {"{"} else ""
        return error_count(before + fill + after + ("\n" + closers if closers else ""), lang)

    return errors


def _net_brackets(text: str) -> tuple[list[str], list[str]]:
    """What `text` does to the brackets open before it: the closers it has for them, in order (those its
    own openers do not take), and the openers it leaves open at its end."""
    own: list[str] = []
    closes: list[str] = []
    for _, c in scan_brackets(text, skip_comments=True):
        if c in OPENERS:
            own.append(c)
        elif own:
            if own[-1] == MATCH[c]:
                own.pop()
        else:
            closes.append(c)
    return closes, own
