"""Candidate FIM spans of a Python file, found with tree-sitter, and whether the tests exercised one.

Four kinds, inside functions only: `line` (one whole simple statement line), `block` (the body of a clause,
2+ lines), `condition` (of if/elif/while) and `call` (an outermost single-line call expression).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("line", "block", "condition", "call")
SIMPLE_STATEMENTS = {
    "expression_statement", "return_statement", "raise_statement", "assert_statement", "delete_statement",
    "import_statement", "import_from_statement", "global_statement", "nonlocal_statement",
}  # fmt: skip
CLAUSE_TYPES = {
    "function_definition", "if_statement", "elif_clause", "else_clause", "for_statement", "while_statement",
    "with_statement", "try_statement", "except_clause", "finally_clause",
}  # fmt: skip
CONDITION_PARENTS = {"if_statement", "elif_clause", "while_statement"}
MAX_BLOCK_LINES = 15  # longer bodies are not what inline completion is asked for
MAX_CALL_CHARS = 100


@dataclass(frozen=True)
class Span:
    kind: str
    start: int  # byte offsets of the middle in the file
    end: int
    line: int  # 1-based line where the middle starts
    column: int  # 1-based column (in bytes) where the middle starts
    check_lines: tuple[int, ...]  # 1-based lines that must have run for the span to count as exercised
    entry_point: str  # qualified name of the enclosing function


def _python_parser():
    import tree_sitter
    import tree_sitter_python

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_python.language()))


def _line_start(data: bytes, offset: int) -> int:
    return data.rfind(b"\n", 0, offset) + 1


def _line_end_incl(data: bytes, offset: int) -> int:
    """Offset just past the newline of the line holding `offset` (or the end of the file)."""
    i = data.find(b"\n", offset)
    return len(data) if i < 0 else i + 1


def _is_docstring(node) -> bool:
    return (
        node.type == "expression_statement"
        and node.named_child_count == 1
        and node.named_children[0].type
        in (
            "string",
            "concatenated_string",
        )
    )


def _alone_on_line(data: bytes, node) -> bool:
    """The node is the only thing on its single line (apart from indentation and a trailing comment-free end)."""
    if node.start_point.row != node.end_point.row:
        return False
    start, end = _line_start(data, node.start_byte), _line_end_incl(data, node.start_byte)
    return data[start:end].strip() == data[node.start_byte : node.end_byte].strip()


def _statements(block) -> list:
    return [c for c in block.named_children if c.type != "comment" and not _is_docstring(c)]


def find_spans(text: str, kinds: Iterable[str] = KINDS) -> list[Span]:
    """Candidate FIM spans of a Python file (inside functions only: module-level code runs at import, so the
    tests "exercising" it would say nothing)."""
    kinds = set(kinds)
    data = text.encode("utf-8")
    tree = _python_parser().parse(data)
    spans: dict[tuple[int, int, str], Span] = {}

    def add(kind: str, start: int, end: int, check: Iterable[int], name: str) -> None:
        if kind in kinds and end > start and data[start:end].strip():
            line = data.count(b"\n", 0, start) + 1
            column = start - _line_start(data, start) + 1
            checks = tuple(sorted(set(check)))
            spans.setdefault((start, end, kind), Span(kind, start, end, line, column, checks, name))

    def visit(node, names: tuple[str, ...], inside_call: bool) -> None:
        if node.type == "function_definition":
            name_node = node.child_by_field_name("name")
            names = (*names, name_node.text.decode() if name_node else "?")
        elif node.type == "class_definition":
            name_node = node.child_by_field_name("name")
            names = (*names, name_node.text.decode() if name_node else "?")
        in_function = node.type == "function_definition" or _in_function(node)
        qual = ".".join(names)
        row = node.start_point.row + 1
        if in_function:
            if node.type in SIMPLE_STATEMENTS and not _is_docstring(node) and _alone_on_line(data, node):
                if node.parent is not None and node.parent.type == "block":
                    start = _line_start(data, node.start_byte)
                    add("line", start, _line_end_incl(data, node.start_byte), [row], qual)
            if node.type == "block" and node.parent is not None and node.parent.type in CLAUSE_TYPES:
                statements = _statements(node)
                first_row = statements[0].start_point.row if statements else -1
                if statements and first_row > node.parent.start_point.row:  # not `if x: y` on one line
                    start = _line_start(data, statements[0].start_byte)
                    end = _line_end_incl(data, node.end_byte - 1 if node.end_byte > 0 else 0)
                    n_lines = data.count(b"\n", start, end)
                    if 2 <= n_lines <= MAX_BLOCK_LINES:
                        add("block", start, end, [s.start_point.row + 1 for s in statements], qual)
            if node.type in CONDITION_PARENTS:
                condition = node.child_by_field_name("condition")
                if condition is not None and condition.start_point.row == condition.end_point.row:
                    add("condition", condition.start_byte, condition.end_byte, [row], qual)
            if (
                node.type == "call"
                and not inside_call
                and node.start_point.row == node.end_point.row
                and node.end_byte - node.start_byte <= MAX_CALL_CHARS
            ):
                add("call", node.start_byte, node.end_byte, [row], qual)
        inside = inside_call or node.type == "call"
        for child in node.children:
            visit(child, names, inside)

    visit(tree.root_node, (), False)
    return sorted(spans.values(), key=lambda s: (s.start, s.end, KINDS.index(s.kind)))


def _in_function(node) -> bool:
    parent = node.parent
    while parent is not None:
        if parent.type == "function_definition":
            return True
        parent = parent.parent
    return False


def exercised(span: Span, ran: set[int]) -> bool:
    return all(line in ran for line in span.check_lines)
