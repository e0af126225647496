"""How source text is laid out in lines: indentation steps and lines that open a block.

Shared by the language server (`server.context`) and the `dfim fill` / `dfim trace` commands, which answer
as the server does (decision 29). Plain string rules, no parser: `dfim fill` must not need tree-sitter.
"""

from __future__ import annotations

import re

# A line ending in `:` opens a block when it starts with one of these (python; `case`/`default` labels and
# C++ access specifiers); other colons (`{"a":`, `x[1:`, `let n:`) go on with the same line.
BLOCK_HEADER = re.compile(
    r"(if|elif|else|for|while|with|try|except|finally|def|class|async|match|case|default"
    r"|public|private|protected)\b"
)


def leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_unit(text: str, lang: str | None = None) -> str:
    """The document's indentation step: a tab if lines start with tabs, else the smallest space step; with no
    indented line yet, the language's habit (a tab for Go, four spaces elsewhere)."""
    steps = []
    for line in text.splitlines()[:400]:
        ws = leading_ws(line)
        if not ws or not line.strip():
            continue
        if ws.startswith("\t"):
            return "\t"
        steps.append(len(ws))
    if steps and min(steps) in (2, 3, 4, 8):
        return " " * min(steps)
    return "\t" if lang == "go" else "    "


def code_of_line(line: str) -> str:
    """The line's code: string literals' contents blanked out (their quotes kept), a `#` or `//` comment and
    everything after an unclosed quote dropped. A rough, language-agnostic scan of one line."""
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
        elif c in "'\"`":
            quote = c
            out.append(c)
        elif (c == "#" and not line.startswith("#include", i)) or line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "" if quote else "".join(out)


def opens_block(line: str) -> bool:
    """Whether a line (up to the cursor) ends by opening a block whose first line goes below it: `def f(x):`,
    `if x > 0:`, `) -> int:` (a signature over several lines), `if (ok) {`. Not `call(`, `[`, a colon that
    opens no block (after which the line goes on), nor a `{` or `:` in a string or a comment."""
    code = code_of_line(line).rstrip()
    if code.endswith("{"):
        return True
    stripped = code.strip()
    return code.endswith(":") and (bool(BLOCK_HEADER.match(stripped)) or stripped[:1] in ")]")


def block_lead(prefix: str, suffix: str, lang: str | None = None) -> str:
    """At the end of a line that opens a block, with nothing after the cursor on it: the line break and the
    block's indentation (the line's, one step deeper) that start a one-line fill there; else ""."""
    line = prefix[prefix.rfind("\n") + 1 :]
    if suffix.split("\n", 1)[0].strip() or not opens_block(line):
        return ""
    return "\n" + leading_ws(line) + indent_unit(prefix[-20000:] + suffix[:20000], lang)
