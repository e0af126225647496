"""How source text is laid out in lines: indentation steps and lines that open a block.

Shared by the language server (`dfim.server.context`) and the `dfim fill` / `dfim trace` commands, which answer
as the server does (decision 29). Plain string rules, no parser: `dfim fill` must not need tree-sitter.
"""

from __future__ import annotations

import re

# A line ending in `:` opens a block when it starts with one of these and the colon is outside brackets
# (python); other colons (`{"a":`, `x[1:`, `def f(name:`) go on with the same line.
BLOCK_HEADER = re.compile(r"(if|elif|else|for|while|with|try|except|finally|def|class|async|match|case)\b")
# In the languages whose blocks are braces, a colon ends only a switch label (and in C++ an access
# specifier); `let n:`, `): Promise<T>`, `for (auto& x :` go on with the line.
LABEL = re.compile(r"(case\b.*|default)\s*:$")
ACCESS = re.compile(r"(public|private|protected)\s*:$")
BRACE_LANGUAGES = frozenset({"javascript", "typescript", "tsx", "go", "rust", "java", "c", "cpp", "csharp",
                             "kotlin", "swift", "php"})  # fmt: skip
# `#` starts a comment in these (and in a language we do not know); `//` in the others. In C and C++ a line
# starting with `#` is a preprocessor directive, elsewhere `#` is code (`this.#count`, `#[derive]`).
HASH_COMMENTS = frozenset({"python", "ruby", "shell", "perl", "r"})
RUST_CHAR = re.compile(r"'(?:\\.|[^\\'])'")  # 'a', '\n': a char literal; any other ' is a lifetime or a label


def leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_unit(text: str, lang: str | None = None) -> str:
    """The document's indentation step: a tab if lines start with tabs, else the smallest space step; with no
    indented line yet, the language's habit (a tab for Go, four spaces elsewhere). The ` * ` lines of a block
    comment (`/** ... */`) are not indentation."""
    steps = []
    for line in text.splitlines()[:400]:
        ws = leading_ws(line)
        if not ws or not line.strip() or line.lstrip().startswith("*"):
            continue
        if ws.startswith("\t"):
            return "\t"
        steps.append(len(ws))
    if steps and min(steps) in (2, 3, 4, 8):
        return " " * min(steps)
    return "\t" if lang == "go" else "    "


def _comment_starts(line: str, i: int, lang: str | None) -> bool:
    if lang is None:  # either kind, but not C's `#include`
        return (line[i] == "#" and not line.startswith("#include", i)) or line.startswith("//", i)
    return line[i] == "#" if lang in HASH_COMMENTS else line.startswith("//", i)


def scan_line(line: str, lang: str | None = None) -> tuple[str, str]:
    """(code, end): the line's code with string literals' contents blanked out (their quotes kept) and a
    comment dropped, and how the line ends: "code", "comment" (it ends in a comment) or "string" (inside an
    unclosed quote, whose text is dropped too). A rough scan of one line in the language's comment and
    quote syntax (`#` or `//`; Rust's lifetimes are not quotes)."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
                out.append(c)
        elif c == "'" and lang == "rust" and not RUST_CHAR.match(line, i):
            out.append(c)  # `'a`, `'static`, `'outer:`
        elif c in "'\"`":
            quote = c
            out.append(c)
        elif _comment_starts(line, i, lang):
            return "".join(out), "comment"
        else:
            out.append(c)
        i += 1
    return ("", "string") if quote else ("".join(out), "code")


def code_of_line(line: str, lang: str | None = None) -> str:
    """The line's code (`scan_line`); "" when it ends inside an unclosed quote."""
    return scan_line(line, lang)[0]


def bracket_depth(code: str) -> int:
    """Brackets opened minus brackets closed in a line's code (negative: it closes some opened above)."""
    return sum(code.count(c) for c in "([{") - sum(code.count(c) for c in ")]}")


def unclosed_on_line(line: str, lang: str | None = None) -> str:
    """The closers for the brackets a line's code opens and leaves open (`return f(a, [b` -> `])`); "" when
    it leaves none open, closes more than it opens, mismatches, or ends inside a string."""
    code, end = scan_line(line, lang)
    if end == "string":
        return ""
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for c in code:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return ""
    return "".join({"(": ")", "[": "]", "{": "}"}[c] for c in reversed(stack))


def opens_block(line: str, lang: str | None = None) -> bool:
    """Whether a line (up to the cursor) ends by opening a block whose first line goes below it: `def f(x):`,
    `if x > 0:`, `) -> int:` (a signature over several lines), `if (ok) {`, `case 1:`. Not `call(`, `[`, a
    colon inside brackets (`def f(name:`, `x[1:`) or one that opens no block in the language (`let n:`), nor
    a line that ends in a comment or a string."""
    code, end = scan_line(line, lang)
    code = code.rstrip()
    if end != "code":
        return False
    if code.endswith("{"):
        return True
    stripped = code.strip()
    if not code.endswith(":"):
        return False
    if lang in BRACE_LANGUAGES:
        return bool(LABEL.match(stripped) or (lang == "cpp" and ACCESS.match(stripped)))
    if bracket_depth(code) > 0:
        return False  # the colon is inside a bracket the line opened: an annotation, a slice, a lambda
    # `) -> int:`, `        b):`: the end of a header whose brackets opened on a line above (not a dict's
    # key after a value over several lines: `32], "name":`)
    closes_above = stripped[:1] in ")]" or (
        bracket_depth(code) < 0 and code[:-1].rstrip().endswith((")", "]"))
    )
    return (
        bool(BLOCK_HEADER.match(stripped) or LABEL.match(stripped) or ACCESS.match(stripped)) or closes_above
    )


def statement_indent(prefix: str, lang: str | None = None, max_lines: int = 50) -> str:
    """The indentation of the statement the prefix's last line ends: that line's, or where a line closes
    brackets opened above it (`    b) {` after `if (a &&`), the indentation of the line that opened them."""
    lines = prefix.split("\n")
    depth = 0
    for back, line in enumerate(reversed(lines)):
        code = code_of_line(line.rstrip("\r"), lang).rstrip()
        depth += bracket_depth(code[:-1] if back == 0 and code.endswith("{") else code)  # not the block's own
        if depth >= 0:
            return leading_ws(line)
        if back >= max_lines:
            break  # the opening line is too far up to look for: the last line's own indentation
    return leading_ws(lines[-1])


def block_lead(prefix: str, suffix: str, lang: str | None = None) -> str:
    """At the end of a line that opens a block, with nothing after the cursor on it: the line break and the
    block's indentation (the line's, one step deeper) that start a one-line fill there; else ""."""
    line = prefix[prefix.rfind("\n") + 1 :]
    if suffix.split("\n", 1)[0].strip() or not opens_block(line, lang):
        return ""
    return (
        "\n" + statement_indent(prefix[-20000:], lang) + indent_unit(prefix[-20000:] + suffix[:20000], lang)
    )
