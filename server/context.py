"""What the model sees and what it must fill: syntax-aware context windows, fill modes, holes.

Everything here is a pure function of the document text and an offset (Python string indices). Tree-sitter
works on UTF-8 bytes, so `Source` converts between the two. Languages without a grammar fall back to line
heuristics (blank lines and indentation).
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from dfim.engine.layout import indent_unit, leading_ws, opens_block, statement_indent
from dfim.engine.model.tokenizer import FIM_SPECIALS, head_within, tail_within

# LSP languageId -> (grammar module, language function)
GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "tsx": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "java": ("tree_sitter_java", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
}
LANGUAGE_ALIASES = {"javascriptreact": "javascript", "typescriptreact": "tsx", "c++": "cpp", "py": "python"}
EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java", ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp",
    ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
}  # fmt: skip

FUNCTION_TYPES = {
    "function_definition", "function_declaration", "method_definition", "arrow_function",
    "function_expression", "function", "generator_function_declaration", "method_declaration",
    "constructor_declaration", "function_item", "func_literal",
}  # fmt: skip
COMMENT_TYPES = {"comment", "line_comment", "block_comment"}
CLOSERS = ")]}"
OPENERS = "([{"
MATCH = {")": "(", "]": "[", "}": "{"}

CHARS_PER_TOKEN = 3.0  # a conservative guess for code BPE; refined with the real tokenizer when given


def language_for(language_id: str | None, uri: str = "") -> str | None:
    """Grammar name for a document, from its languageId, else its file extension; None = line heuristics."""
    lang = (language_id or "").lower()
    lang = LANGUAGE_ALIASES.get(lang, lang)
    if lang in GRAMMARS:
        return lang
    match = re.search(r"(\.[A-Za-z0-9+]+)$", uri.split("?")[0])
    return EXTENSIONS.get(match.group(1).lower()) if match else None


@functools.cache
def get_parser(lang: str):
    import tree_sitter

    module_name, function_name = GRAMMARS[lang]
    module = importlib.import_module(module_name)
    return tree_sitter.Parser(tree_sitter.Language(getattr(module, function_name)()))


class Source:
    """A text with its (lazy) syntax tree and char <-> byte offset conversion."""

    def __init__(self, text: str, lang: str | None) -> None:
        self.text = text
        self.lang = lang if lang in GRAMMARS else None
        self.data = text.encode("utf-8", "surrogatepass")
        self.ascii = len(self.data) == len(text)
        self._tree = None

    @property
    def tree(self):
        if self._tree is None and self.lang is not None:
            self._tree = get_parser(self.lang).parse(self.data)
        return self._tree

    def byte(self, offset: int) -> int:
        return offset if self.ascii else len(self.text[:offset].encode("utf-8", "surrogatepass"))

    def char(self, byte: int) -> int:
        return byte if self.ascii else len(self.data[:byte].decode("utf-8", "surrogatepass"))

    def span(self, node) -> tuple[int, int]:
        return self.char(node.start_byte), self.char(node.end_byte)


def error_count(text: str, lang: str | None) -> int:
    """ERROR and MISSING nodes in `text`'s syntax tree (0 for languages without a grammar)."""
    if lang not in GRAMMARS:
        return 0
    tree = get_parser(lang).parse(text.encode("utf-8", "surrogatepass"))
    if not tree.root_node.has_error:
        return 0
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.is_error or node.is_missing:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count


# ---- lines and indentation -------------------------------------------------------------------------------


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


# ---- windows -------------------------------------------------------------------------------------------


# The windows are cut on a grid so that they stay put while the user types (decision 43). The engine keeps
# the previous request's context in a KV cache and re-encodes from the first token that differs; the
# suffix comes first in the FIM layout, so a suffix that moves costs the whole context, a prefix start that
# moves costs the whole prefix (~300 tokens: ~150 ms on a laptop core). Cut points that depend on the cursor
# or on the parse of the half-typed line (statement boundaries did: an open bracket swallows the statements
# after it) move on most lines. On the grid the prefix start is the first whole line after a grid point
# counted from the document's start, the suffix end the last whole line before a grid point counted from the
# document's end; typing at the cursor shifts neither, so both stay until the budget overflows one cell.
GRID_CELLS = 8  # cells per window: the window moves once per 1/8 of its size and keeps >= 7/8 of the budget
MAX_GRID_STEPS = 24  # cells tried inward before falling back to a ratio cut (one huge line, dense text)
CHARS_PER_TOKEN_GUESS = 4.0  # the first window tried when a tokenizer checks it: generous, stepped in to fit


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


# ---- syntax queries ------------------------------------------------------------------------------------


def _smallest_containing(source: Source, offset: int, types: set[str]):
    tree = source.tree
    if tree is None:
        return None
    b = source.byte(offset)
    node = tree.root_node.descendant_for_byte_range(b, b)
    while node is not None:
        # named nodes only: JavaScript's `function` keyword is an anonymous node of type "function" too
        if node.is_named and node.type in types and node.start_byte <= b <= node.end_byte:
            return node
        node = node.parent
    return None


@dataclass
class Span:
    start: int
    end: int
    kind: str  # "pass" | "ellipsis" | "todo" | "body"
    indent: str = ""  # indentation for lines of the fill


def _is_hole_node(source: Source, node) -> str | None:
    t = node.type
    if t == "pass_statement":
        return "pass"
    if (
        t == "expression_statement"
        and node.named_child_count == 1
        and node.named_children[0].type == "ellipsis"
    ):
        return "ellipsis"
    if t in COMMENT_TYPES and "TODO" in source.data[node.start_byte : node.end_byte].decode(
        "utf-8", "replace"
    ):
        return "todo"
    if t == "macro_invocation":
        name = node.child_by_field_name("macro")
        if name is not None and source.data[name.start_byte : name.end_byte] in (b"todo", b"unimplemented"):
            return "todo"
    if t == "expression_statement" and node.named_child_count == 1:
        return _is_hole_node(source, node.named_children[0])
    return None


_HOLE_LINE = re.compile(r"^[ \t]*(pass|\.\.\.|(#|//|/\*|--)[^\r\n]*\bTODO\b[^\r\n]*?)[ \t]*\r?$", re.M)


def find_holes(source: Source, lo: int, hi: int) -> list[Span]:
    """Holes (`pass`, `...`, TODO comments, `todo!()`) that lie inside [lo, hi], in document order."""
    text = source.text
    holes: list[Span] = []
    if source.tree is None:
        for m in _HOLE_LINE.finditer(text, lo, hi):
            s, e = m.start(1), m.end(1)
            kind = "pass" if m.group(1) == "pass" else "ellipsis" if m.group(1) == "..." else "todo"
            holes.append(Span(s, e, kind, leading_ws(text[line_start(text, s) : s])))
        return holes
    blo, bhi = source.byte(lo), source.byte(hi)
    stack = [source.tree.root_node]
    while stack:
        node = stack.pop()
        for child in reversed(node.children):
            if child.end_byte <= blo or child.start_byte >= bhi:
                continue
            kind = _is_hole_node(source, child)
            if kind is not None:
                s, e = source.span(child)
                e = s + len(text[s:e].rstrip("\r"))  # a comment's node holds a CRLF line's \r
                if s >= lo and e <= hi:
                    holes.append(Span(s, e, kind, leading_ws(text[line_start(text, s) : s])))
                    continue
            stack.append(child)
    holes.sort(key=lambda h: h.start)
    return holes


def hole_at(source: Source, offset: int) -> Span | None:
    """The hole under the cursor, or on the cursor's line."""
    text = source.text
    ls, le = line_start(text, offset), line_end(text, offset)
    for hole in find_holes(source, ls, le):
        if hole.start <= offset <= hole.end or text[ls:le].strip() == text[hole.start : hole.end].strip():
            return hole
    return None


def enclosing_function(source: Source, offset: int) -> tuple[int, int, int, int] | None:
    """(function start, function end, body start, body end) of the innermost function around `offset`."""
    node = _smallest_containing(source, offset, FUNCTION_TYPES)
    if node is None:
        return None
    body = node.child_by_field_name("body")
    if body is None:
        return None
    fs, fe = source.span(node)
    bs, be = source.span(body)
    return fs, fe, bs, be


def _body_interior(source: Source, bs: int, be: int) -> tuple[int, int]:
    """A body's span without its braces (brace languages) - the part a fill replaces."""
    text = source.text
    if text[bs:be].startswith("{") and text[bs:be].rstrip().endswith("}"):
        return bs + 1, bs + text[bs:be].rstrip().rfind("}")
    return bs, be


def last_code_before_line(text: str, offset: int) -> int:
    """Offset of the last non-blank character before the line of `offset` (0 if none): where a parse
    still sees the block an indented blank line belongs to."""
    return max(0, len(text[: line_start(text, offset)].rstrip()) - 1)


def empty_body_at(source: Source, offset: int) -> Span | None:
    """If the cursor is inside a function body that holds nothing (or only a hole), the span to fill."""
    text = source.text
    probe = offset
    indented_blocks = source.lang == "python" or source.lang is None
    if indented_blocks and not text[line_start(text, offset) : line_end(text, offset)].strip():
        # an empty python block parses as zero width after the colon: look at the last non-blank text
        probe = last_code_before_line(text, offset)
    found = enclosing_function(source, probe)
    if found is None:
        return None
    fs, _, bs, be = found
    inner_s, inner_e = _body_interior(source, bs, be)
    if indented_blocks:
        header_end = text.find(":", fs, bs) if bs == be else line_start(text, bs) - 1
        inner_s = next_line_start(text, header_end)
        inner_e = max(be, line_end(text, offset)) if offset >= inner_s else be
        if line_start(text, offset) > inner_s and text[inner_s : line_start(text, offset)].strip():
            return None
        inner_s = min(inner_s, line_start(text, offset))
    if not (inner_s <= offset <= max(inner_e, inner_s)):
        return None
    body = text[inner_s:inner_e]
    holes = find_holes(source, inner_s, inner_e)
    rest = body
    for hole in reversed(holes):
        rest = rest[: hole.start - inner_s] + rest[hole.end - inner_s :]
    if rest.strip():
        return None
    header_line = text[line_start(text, fs) : line_end(text, fs)]
    indent = leading_ws(header_line) + indent_unit(text, source.lang)
    cursor_line = text[line_start(text, offset) : line_end(text, offset)]
    if not cursor_line.strip() and indent_width(cursor_line) > indent_width(header_line):
        indent = cursor_line
    return Span(inner_s, inner_e, "body", indent)


# ---- the fill decision ---------------------------------------------------------------------------------

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
    parse of a 300 KB file costs ~200 ms; a region of a few KB, a few ms)."""
    lo = 0 if start - before <= 0 else line_start(text, start - before)
    hi = len(text) if end + after >= len(text) else line_end(text, end + after)
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


def opens_line(text: str, start: int, end: int, mode: str) -> bool:
    """A pure insertion on the line's indentation with code after it (see `FillContext.opens_line`)."""
    if mode != "line" or start != end:
        return False
    return not text[line_start(text, start) : start].strip() and bool(text[end : line_end(text, end)].strip())


def scan_brackets(text: str, skip_comments: bool = False) -> Iterator[tuple[int, str]]:
    """Yield (index, char) for brackets outside string literals (and `#` / `//` comments if asked):
    a rough, language-agnostic scan."""
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote or (c in "\r\n" and quote in "'\""):
                quote = ""
        elif c in "'\"`":
            quote = c
        elif skip_comments and (c == "#" and not text.startswith("#include", i) or text.startswith("//", i)):
            i = min([x for x in (text.find("\n", i), text.find("\r", i)) if x >= 0] or [len(text)])
            continue
        elif c in OPENERS or c in CLOSERS:
            yield i, c
        i += 1


def open_brackets(prefix: str, limit: int = 2000) -> list[str]:
    """Brackets opened in the tail of `prefix` and not yet closed (strings and comments roughly skipped)."""
    stack: list[str] = []
    for _, c in scan_brackets(prefix[-limit:], skip_comments=True):
        if c in OPENERS:
            stack.append(c)
        elif stack and stack[-1] == MATCH[c]:
            stack.pop()
    return stack
