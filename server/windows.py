"""Context windows on a grid: how much of the document before and after the cursor the model reads.

The budgets are in tokens; without the model's tokenizer the windows take a conservative guess of characters
per token (`CHARS_PER_TOKEN`), with it they are checked and stepped inward until they fit.
"""

from __future__ import annotations

from collections.abc import Callable

from dfim.engine.model.tokenizer import FIM_SPECIALS, head_within, tail_within
from dfim.server.languages import Source
from dfim.server.lines import indent_width, line_end, line_start, next_line_start

# The windows are cut on a grid so that they stay put while the user types (decision 43). The engine keeps
# the previous request's context in a KV cache and re-encodes from the first token that differs; the
# suffix comes first in the FIM layout, so a suffix that moves costs the whole context, a prefix start that
# moves costs the whole prefix (~300 tokens: ~150 ms on a laptop core). Cut points that depend on the cursor
# or on the parse of the half-typed line (statement boundaries did: an open bracket swallows the statements
# after it) move on most lines. On the grid the prefix start is the first whole line after a grid point
# counted from the document's start, the suffix end the last whole line before a grid point counted from the
# document's end; typing at the cursor shifts neither, so both stay until the budget overflows one cell.
CHARS_PER_TOKEN = 3.0  # a conservative guess for code BPE; refined with the real tokenizer when given
GRID_CELLS = 8  # cells per window: the window moves once per 1/8 of its size and keeps >= 7/8 of the budget
MAX_GRID_STEPS = 24  # cells tried inward before falling back to a ratio cut (one huge line, dense text)


CHARS_PER_TOKEN_GUESS = 4.0  # the first window tried when a tokenizer checks it: generous, stepped in to fit


def guess_tokens(text: str) -> int:
    """Tokens of `text` before a tokenizer is at hand: the conservative `CHARS_PER_TOKEN` guess, at least 1."""
    return max(1, int(len(text) // CHARS_PER_TOKEN))


def _line_starts(text: str, lo: int, hi: int) -> list[int]:
    """Offsets in [lo, hi] where a line starts."""
    if lo >= len(text):
        return []
    pos = lo if lo <= 0 or text[lo - 1] in "\r\n" else next_line_start(text, lo)
    starts = []
    while pos <= hi and pos < len(text):
        starts.append(pos)
        nxt = next_line_start(text, pos)
        if nxt <= pos:
            break
        pos = nxt
    return starts


def _opens_unit(text: str, pos: int) -> bool:
    """Whether the line at `pos` is where a reader would start: not indented, or the first after a blank
    line. Windows prefer to start at one and to end just before one (fewer cut statements)."""
    line = text[pos : line_end(text, pos)]
    if pos == 0:
        return bool(line.strip())
    end = pos - 2 if text.startswith("\r\n", pos - 2) else pos - 1  # the previous line's end (CRLF too)
    before = text[line_start(text, end) : end]
    return bool(line.strip()) and (indent_width(line) == 0 or not before.strip())


def prefix_window(text: str, cursor: int, budget_chars: int, origin: int, cell: int) -> int:
    """Start offset of a prefix window of at most `budget_chars` before `cursor`: a line start in the first
    grid cell at or after `cursor - budget_chars`, the grid counted from the document's start (`text` starts
    at offset `origin` in it), which typing at the cursor does not move."""
    if cursor + origin <= budget_chars:
        return 0  # the window reaches the document's start
    lo = -(-(cursor - budget_chars + origin) // cell) * cell - origin  # rounded up onto the grid
    if lo >= cursor:
        return cursor  # a budget under one cell: nothing before the cursor
    lo = max(lo, 0)  # the parsed region is smaller than the window (it is sized not to be)
    starts = _line_starts(text, lo, min(cursor, lo + cell - 1))
    if starts:
        return next((pos for pos in starts if _opens_unit(text, pos)), starts[0])
    nxt = next_line_start(text, lo)  # no line starts in the cell: the next one before the cursor's line
    return nxt if nxt <= line_start(text, cursor) else min(lo, cursor)


def suffix_window(text: str, end: int, budget_chars: int, total: int, cell: int) -> int:
    """End offset of a suffix window of at most `budget_chars` after `end`: a line start in the last grid cell
    before `end + budget_chars`, the grid counted back from the document's end (the document is `total`
    characters long counted from `text`'s start), which typing before `end` does not move."""
    if end + budget_chars >= len(text):
        return len(text)
    hi = total - -(-(total - end - budget_chars) // cell) * cell  # rounded down onto the grid
    cuts = [pos for pos in _line_starts(text, max(end, hi - cell + 1), hi) if pos > end]
    if cuts:
        return max(
            (pos for pos in cuts if _opens_unit(text, pos) or not text[pos : line_end(text, pos)].strip()),
            default=cuts[-1],
        )
    start = line_start(text, hi)  # no line starts in the cell: the last one after `end`, else mid-line
    return start if start > end else max(hi, end)


def fit_context_budget(prefix_tokens: int, suffix_tokens: int, trained: int | None) -> tuple[int, int]:
    """The (prefix, suffix) token budgets cut down to the context a checkpoint was trained with.

    Past its training length a small model's full-attention layers see positions they never learnt,
    and every extra token costs encoding time: dfim-small was trained on 512 context tokens with the
    suffix at most a third of them, so the windows keep that shape. Unchanged when the checkpoint
    declares no length (the released DiffusionGemma) or the budgets already fit."""
    if not trained or prefix_tokens + suffix_tokens + FIM_SPECIALS <= trained:
        return prefix_tokens, suffix_tokens
    room = max(2, trained - FIM_SPECIALS)
    suffix = min(suffix_tokens, room // 3)
    return min(prefix_tokens, room - suffix), suffix


def fit_window(
    source: Source,
    start: int,
    end: int,
    prefix_tokens: int,
    suffix_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    origin: int = 0,
    total: int | None = None,
) -> tuple[int, int]:
    """(start, end) of the prefix window before `start` and the suffix window after `end`, on the grid, within
    the token budgets. Without a tokenizer the windows take a conservative CHARS_PER_TOKEN guess; with one,
    they start from a generous guess and step in a cell at a time until they fit (each step keeps them on
    the grid), and only past MAX_GRID_STEPS cut by the measured ratio."""
    text = source.text
    total = len(text) if total is None else total
    # the cells follow from the budgets alone (a measured ratio would move the grid as the user types)
    pcell = max(16, int(prefix_tokens * CHARS_PER_TOKEN) // GRID_CELLS)
    scell = max(16, int(suffix_tokens * CHARS_PER_TOKEN) // GRID_CELLS)
    ratio = CHARS_PER_TOKEN if count_tokens is None else CHARS_PER_TOKEN_GUESS
    pchars, schars = int(prefix_tokens * ratio), int(suffix_tokens * ratio)
    w_start = prefix_window(text, start, pchars, origin, pcell)
    w_end = suffix_window(text, end, schars, total, scell)
    if count_tokens is None:
        return w_start, w_end
    # Step in while the window is over budget. Where a cell is too coarse for the text (dense text: CJK, emoji,
    # a minified line; the cells assume ~3 characters a token), the window is cut by the measured ratio from
    # the last one over budget instead, off the grid: when the next step would leave less than a cell, or
    # when the window that fits holds less than 3/4 of the budget.
    over = None
    for _ in range(MAX_GRID_STEPS):
        if w_start >= start or (used := count_tokens(text[w_start:start])) <= prefix_tokens:
            if over is not None and w_start < start and used < prefix_tokens * 3 / 4:
                w_start = start - len(tail_within(text[over:start], prefix_tokens, count_tokens))
            break
        over = w_start
        if pchars - pcell < pcell:
            w_start = start - len(tail_within(text[w_start:start], prefix_tokens, count_tokens))
            break
        pchars -= pcell  # one cell in: the grid stays the same
        w_start = prefix_window(text, start, pchars, origin, pcell)
    else:
        w_start = start - len(tail_within(text[w_start:start], prefix_tokens, count_tokens))
    over = None
    for _ in range(MAX_GRID_STEPS):
        if w_end <= end or (used := count_tokens(text[end:w_end])) <= suffix_tokens:
            if over is not None and w_end > end and used < suffix_tokens * 3 / 4:
                w_end = end + len(head_within(text[end:over], suffix_tokens, count_tokens))
            break
        over = w_end
        if schars - scell < scell:
            w_end = end + len(head_within(text[end:w_end], suffix_tokens, count_tokens))
            break
        schars -= scell
        w_end = suffix_window(text, end, schars, total, scell)
    else:
        w_end = end + len(head_within(text[end:w_end], suffix_tokens, count_tokens))
    return w_start, w_end
