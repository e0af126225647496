"""Holes and function bodies found in the syntax tree: what a code action fills.

A hole is a `pass`, `...`, a TODO comment or `todo!()` on a line of its own, or an empty function body.
Languages without a grammar find only the line forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dfim.engine.layout import indent_unit, leading_ws
from dfim.server.languages import COMMENT_TYPES, FUNCTION_TYPES, Source
from dfim.server.lines import indent_width, line_end, line_start, next_line_start


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


def function_names(source: Source, start: int, end: int) -> list[str]:
    """The names of the functions defined whole inside [start, end), in order (those with a `name`: not an
    arrow function's)."""
    tree = source.tree
    if tree is None:
        return []
    lo, hi = source.byte(start), source.byte(end)
    names: list[str] = []
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_byte <= lo or node.start_byte >= hi:
            continue
        if node.is_named and node.type in FUNCTION_TYPES and lo <= node.start_byte and node.end_byte <= hi:
            name = node.child_by_field_name("name")
            if name is not None:
                names.append(source.data[name.start_byte : name.end_byte].decode("utf-8", "replace"))
        stack.extend(reversed(node.children))
    return names


@dataclass
class Span:
    start: int
    end: int
    kind: str  # "pass" | "ellipsis" | "todo" | "body"
    indent: str = ""  # indentation for lines of the fill
    header_indent: str = ""  # a body's: the indentation of the line its definition starts on (its `}`'s)


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
    return Span(inner_s, inner_e, "body", indent, leading_ws(header_line))
