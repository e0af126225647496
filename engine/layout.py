"""How source text is laid out in lines: code, strings and comments (`scan_code`), indentation steps and
lines that open a block.

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
OPENERS = "([{"
CLOSERS = ")]}"
MATCH = {")": "(", "]": "[", "}": "{"}  # each closer's opener
CLOSER_OF = {opener: closer for closer, opener in MATCH.items()}  # each opener's closer
RUST_CHAR = re.compile(r"'(?:\\.|[^\\'])'")  # 'a', '\n': a char literal; any other ' is a lifetime or a label


def leading_ws(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_unit(text: str, lang: str | None = None) -> str:
    """The document's indentation step, read from the lines that open a block (`{` or `:` at their end) and
    the line after each: a tab where most of those go deeper by a tab, else the most common step in spaces
    (2, 3, 4 or 8). Lines that open a bracket (`(`, `[`) count only where no block says: Google-style C++
    continues a call 4 deeper in a 2-space file. Neither a file's smallest indent (` public:` is one space
    in) nor its other lines (a continuation aligned under a bracket, a script inside a string) are a guide.
    With no such pair yet, the indented lines' habit (mostly tabs: a tab; else their smallest indent), and
    with none of those, four spaces. Go is always a tab (gofmt)."""
    if lang == "go":
        return "\t"  # gofmt indents with tabs, whatever a raw string in the file holds
    blocks: dict[str, int] = {}
    brackets: dict[str, int] = {}
    previous: str | None = None
    counts = blocks
    tabs, spaces = 0, []  # lines indented with a tab, the widths of those indented with spaces
    for line in text.splitlines()[:2000]:
        stripped = line.strip()
        if not stripped:
            continue
        ws = leading_ws(line)
        if ws.startswith("\t"):
            tabs += 1
        elif ws and not stripped.startswith("*"):
            spaces.append(len(ws))
        if previous is not None and len(ws) > len(previous) and ws.startswith(previous):
            step = ws[len(previous) :]
            if step == "\t" or (step.strip(" ") == "" and len(step) in (2, 3, 4, 8)):
                counts[step] = counts.get(step, 0) + 1
        previous = None
        if not stripped.startswith(("*", "//", "#")):
            if stripped.endswith(("{", ":")):
                previous, counts = ws, blocks
            elif stripped.endswith(("(", "[")):
                previous, counts = ws, brackets
    steps = blocks or brackets
    if steps:
        return max(steps, key=lambda step: (steps[step], step == "\t", -len(step)))  # a tie: tab, smaller
    # no block opened yet: how the indented lines there are indented
    if tabs > len(spaces):
        return "\t"
    if spaces and min(spaces) in (2, 3, 4, 8):
        return " " * min(spaces)
    return "    "


def _comment_starts(line: str, i: int, lang: str | None) -> bool:
    if lang is None:  # either kind, but not C's `#include`
        return (line[i] == "#" and not line.startswith("#include", i)) or line.startswith("//", i)
    return line[i] == "#" if lang in HASH_COMMENTS else line.startswith("//", i)


def scan_code(
    text: str, lang: str | None = None, comments: bool = True, lines: bool = False
) -> tuple[list[int], str]:
    """(code, end): the indexes of `text`'s code characters, and how it ends: "code", "comment" (in a
    comment) or "string" (inside an unclosed quote). The one scan of quotes and comments that every rule
    reading code goes through: a rough scan in the language's comment and quote syntax (`#` or `//`, either
    but C's `#include` for no language; Rust's lifetimes are not quotes).

    Code is everything outside string literals' contents (their quotes are code) and, with `comments`,
    outside comments. `text` is one line unless `lines`: then a line end also ends a `'` or `"` string
    (a backquoted one goes on) and a comment, and the scan goes on after it."""
    code: list[int] = []
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
                code.append(i)
            elif lines and c in "\r\n" and quote in "'\"":
                quote = ""
        elif c == "'" and lang == "rust" and not RUST_CHAR.match(text, i):
            code.append(i)  # `'a`, `'static`, `'outer:`
        elif c in "'\"`":
            quote = c
            code.append(i)
        elif comments and _comment_starts(text, i, lang):
            ends = [x for x in (text.find("\n", i), text.find("\r", i)) if x >= 0] if lines else []
            if not ends:
                return code, "comment"
            i = min(ends)
            continue
        else:
            code.append(i)
        i += 1
    return code, "string" if quote else "code"


def scan_line(line: str, lang: str | None = None) -> tuple[str, str]:
    """(code, end) of one line (`scan_code`): its code with string literals' contents blanked out (their
    quotes kept) and a comment dropped; the code is "" when the line ends inside an unclosed quote."""
    code, end = scan_code(line, lang)
    return ("", end) if end == "string" else ("".join(line[i] for i in code), end)


# What `scan_brackets` stops at: a bracket, a quote, or what may start a comment; the rest is skipped in C.
_BRACKET_EVENTS = re.compile(r"[()\[\]{}'\"`#/]")
# What ends a string that a quote opened, or escapes a character in it.
_STRING_STOPS = {q: re.compile("[" + re.escape(q) + ("\\\\]" if q == "`" else "\\\\\r\n]")) for q in "'\"`"}


def scan_brackets(text: str, skip_comments: bool = False) -> list[tuple[int, str]]:
    """(index, bracket) for the brackets of several lines outside string literals (and `#` / `//` comments
    if asked): the brackets of `scan_code(text, None, comments=skip_comments, lines=True)`'s code. The
    server reads a prefix's brackets several times a request, so this jumps from one character that matters
    to the next instead of visiting each (`tests/engine/test_layout.py` holds it to `scan_code`)."""
    out: list[tuple[int, str]] = []
    n = len(text)
    i = 0
    while True:
        m = _BRACKET_EVENTS.search(text, i)
        if m is None:
            return out
        i = m.start()
        c = text[i]
        if c in OPENERS or c in CLOSERS:
            out.append((i, c))
            i += 1
        elif c in "'\"`":  # to the closing quote; a line end also ends ' and " (backslash escapes one char)
            stop = _STRING_STOPS[c]
            i += 1
            while i < n:
                m = stop.search(text, i)
                if m is None:
                    return out
                i = m.end() + (text[m.start()] == "\\")
                if text[m.start()] != "\\":
                    break
        elif skip_comments and _comment_starts(text, i, None):  # to the line's end
            ends = [x for x in (text.find("\n", i), text.find("\r", i)) if x >= 0]
            if not ends:
                return out
            i = min(ends)
        else:  # a `/` or `#` that starts no comment
            i += 1


def open_quote(line: str, lang: str | None = None) -> str:
    """The quote a line (up to the cursor) leaves open (`x = f"a {b` -> `"`), or "" when it ends in code or a
    comment."""
    code, end = scan_code(line, lang)
    if end != "string":
        return ""
    return next((line[i] for i in reversed(code) if line[i] in "'\"`"), "")


def open_placeholder(line: str, lang: str | None = None) -> bool:
    """Whether a line (up to the cursor) ends inside a string, inside a `{` of that string that nothing
    closed yet: an f-string's or a format string's placeholder, a template literal's `${` (`f"a {b` ->
    True, `"a {b} c` -> False)."""
    code, end = scan_code(line, lang)
    if end != "string" or not code:
        return False
    text = line[code[-1] + 1 :]  # the open string's text: after its opening quote, the last code character
    return text.rfind("{") > text.rfind("}")


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
    stack: list[str] = []
    for c in code:
        if c in OPENERS:
            stack.append(c)
        elif c in MATCH:
            if not stack or stack.pop() != MATCH[c]:
                return ""
    return "".join(CLOSER_OF[c] for c in reversed(stack))


BRACELESS_HEADER = re.compile(r"(?:\}\s*)?(?:(?:else\s+)?if|while|for)\s*\(.*\)$|(?:\}\s*)?else$")


def opens_braceless(line: str, lang: str | None = None) -> bool:
    """Whether a line of a brace language is a control header without its brace, whose one statement goes
    one level deeper on the next line: `if (l_unlikely(x))`, `} else`, `for (i = 0; i < n; i++)` (a comment
    after it aside)."""
    if lang not in BRACE_LANGUAGES:
        return False
    code, end = scan_line(line, lang)
    stripped = re.sub(r"/\*.*?\*/", "", code).strip()
    return (
        end != "string"
        and bool(BRACELESS_HEADER.fullmatch(stripped))
        and bracket_depth(stripped.lstrip("}")) == 0
    )


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


def opener_indent(prefix: str, closer: str, lang: str | None = None, window: int = 20000) -> str | None:
    """Where a line that starts with `closer` belongs: the indentation of the statement whose line opened the
    bracket it closes (the innermost one the prefix leaves open), or None when that is not `closer`'s."""
    text = prefix[-window:]
    code, _ = scan_code(text, lang, comments=True, lines=True)
    stack: list[int] = []
    for i in code:
        if text[i] in OPENERS:
            stack.append(i)
        elif text[i] in CLOSERS and stack and text[stack[-1]] == MATCH[text[i]]:
            stack.pop()
    if not stack or text[stack[-1]] != MATCH.get(closer):
        return None
    return statement_indent(
        text[: text.find("\n", stack[-1]) if "\n" in text[stack[-1] :] else len(text)], lang
    )


def block_lead(prefix: str, suffix: str, lang: str | None = None) -> str:
    """At the end of a line that opens a block, with nothing after the cursor on it: the line break and the
    block's indentation (the line's, one step deeper) that start a one-line fill there; else ""."""
    line = prefix[prefix.rfind("\n") + 1 :]
    if suffix.split("\n", 1)[0].strip() or not opens_block(line, lang):
        return ""
    return (
        "\n" + statement_indent(prefix[-20000:], lang) + indent_unit(prefix[-20000:] + suffix[:20000], lang)
    )
