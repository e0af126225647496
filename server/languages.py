"""The languages the server knows: LSP languageIds and file extensions, tree-sitter grammars, and `Source`,
a text with its lazily parsed syntax tree.

Everything that names a language by extension or languageId reads the tables here.
"""

from __future__ import annotations

import functools
import importlib
import re

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
# File extension -> language name. Languages without a grammar here are still filled (the model reads their
# text; the server falls back to line heuristics), so `dfim fill` and `dfim replay` accept them.
EXTENSIONS = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "javascript", ".ts": "typescript", ".mts": "typescript", ".cts": "typescript", ".tsx": "tsx",
    ".go": "go", ".rs": "rust", ".java": "java", ".c": "c", ".h": "c", ".cpp": "cpp", ".cc": "cpp",
    ".cxx": "cpp", ".hpp": "cpp", ".hh": "cpp", ".hxx": "cpp",
    ".rb": "ruby", ".lua": "lua", ".sh": "shell", ".kt": "kotlin", ".swift": "swift", ".cs": "csharp",
    ".php": "php",
}  # fmt: skip


# The interpreter a script's `#!` line names -> language name, for a file without a known extension
SHEBANGS = {
    "python": "python", "pypy": "python", "node": "javascript", "nodejs": "javascript", "bun": "javascript",
    "deno": "typescript", "ts-node": "typescript", "tsx": "typescript", "sh": "shell", "bash": "shell",
    "zsh": "shell", "dash": "shell", "ksh": "shell", "ruby": "ruby", "lua": "lua", "php": "php",
}  # fmt: skip


FUNCTION_TYPES = {
    "function_definition", "function_declaration", "method_definition", "arrow_function",
    "function_expression", "function", "generator_function_declaration", "method_declaration",
    "constructor_declaration", "function_item", "func_literal",
}  # fmt: skip


COMMENT_TYPES = {"comment", "line_comment", "block_comment"}


def language_for(language_id: str | None, uri: str = "") -> str | None:
    """Grammar name for a document, from its languageId, else its file extension; None = line heuristics."""
    lang = (language_id or "").lower()
    lang = LANGUAGE_ALIASES.get(lang, lang)
    if lang in GRAMMARS:
        return lang
    language = language_of_path(uri.split("?")[0])
    return language if language in GRAMMARS else None


def language_of_path(path: str) -> str | None:
    """The language a file's extension names (`EXTENSIONS`), with or without a grammar; None if unknown."""
    match = re.search(r"(\.[A-Za-z0-9+]+)$", path)
    return EXTENSIONS.get(match.group(1).lower()) if match else None


def language_of_shebang(text: str) -> str | None:
    """The language a script's first line names (`#!/usr/bin/env python3`, `#!/bin/sh`, `#!/usr/bin/env -S
    node --flag`); None without a `#!` line or for an interpreter `SHEBANGS` does not know."""
    first = text.split("\n", 1)[0].strip()
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    program = words[0].rsplit("/", 1)[-1] if words else ""
    if program == "env":  # its options and VAR=value assignments come before the program
        rest = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        program = rest[0].rsplit("/", 1)[-1] if rest else ""
    return SHEBANGS.get(re.sub(r"[\d.]+$", "", program))  # python3.12 -> python


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


def _byte_span(text: str, span: tuple[int, int]) -> tuple[int, int]:
    """Character offsets [start, end] of `text` as byte offsets of its UTF-8 (lone surrogates kept, as
    the parser reads it)."""
    start, end = (len(text[:i].encode("utf-8", "surrogatepass")) for i in span)
    return start, end


def bracket_balance(text: str, lang: str, span: tuple[int, int]) -> dict[str, int]:
    """Each bracket pair's openers minus its closers among the syntax tree's bracket tokens inside `span`
    (character offsets [start, end)): none in strings or comments, whatever the language writes them as,
    and none the parser only assumed (MISSING)."""
    data = text.encode("utf-8", "surrogatepass")
    lo, hi = _byte_span(text, span)
    balance = {"(": 0, "[": 0, "{": 0}
    closer_of = {")": "(", "]": "[", "}": "{"}
    stack = [get_parser(lang).parse(data).root_node]
    while stack:
        node = stack.pop()
        if node.end_byte <= lo or node.start_byte >= hi:
            continue
        if node.child_count == 0 and not node.is_missing and lo <= node.start_byte:
            if node.type in balance:
                balance[node.type] += 1
            elif node.type in closer_of:
                balance[closer_of[node.type]] -= 1
        stack.extend(node.children)
    return balance


def error_count(text: str, lang: str | None, span: tuple[int, int] | None = None) -> int:
    """ERROR and MISSING nodes in `text`'s syntax tree (0 for languages without a grammar); with `span`
    (character offsets [start, end]) only those that touch it: an edit's own errors, not those of a line
    typed halfway elsewhere or of a window cut inside a block."""
    if lang not in GRAMMARS:
        return 0
    data = text.encode("utf-8", "surrogatepass")
    tree = get_parser(lang).parse(data)
    if not tree.root_node.has_error:
        return 0
    lo, hi = (0, len(data)) if span is None else _byte_span(text, span)
    count = 0
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.end_byte < lo or node.start_byte > hi:
            continue
        if node.is_error or node.is_missing:
            count += 1
        if node.has_error:
            stack.extend(node.children)
    return count
