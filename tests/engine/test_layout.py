"""Unit tests of engine/layout.py: the line scanner (code, strings, comments) and the rules built on it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dfim.engine import layout


@pytest.mark.parametrize(
    ("line", "lang", "want"),
    [
        ('x = "a # b"  # c', "python", ('x = ""  ', "comment")),
        ('x = "abc', "python", ("", "string")),
        ('s = "a\\"b" + c', "python", ('s = "" + c', "code")),
        ("s = 'a\\\\' + f(", "python", ("s = '' + f(", "code")),
        ("this.#count // x", "javascript", ("this.#count ", "comment")),
        ("x = 1 # not a comment in C", "c", ("x = 1 # not a comment in C", "code")),
        ("#include <stdio.h>", None, ("#include <stdio.h>", "code")),
        ("x = 1  # c", None, ("x = 1  ", "comment")),
        ("x = 1  // c", None, ("x = 1  ", "comment")),
        ("url = `a // b` + c", "javascript", ("url = `` + c", "code")),
        ("fn f<'a>(x: &'a str) -> char { 'x' }", "rust", ("fn f<'a>(x: &'a str) -> char { '' }", "code")),
        ("'outer: loop {", "rust", ("'outer: loop {", "code")),
        ("c = 'x' + '", "python", ("", "string")),
        ('a = "x\r(" + b', "python", ('a = "" + b', "code")),  # one line: a lone \r is no line end here
        ("", "python", ("", "code")),
    ],
)
def test_scan_line(line, lang, want):
    assert layout.scan_line(line, lang) == want
    assert layout.code_of_line(line, lang) == want[0]


@pytest.mark.parametrize(
    ("text", "comments", "want"),
    [
        ("f(a, [1])", False, [(1, "("), (5, "["), (7, "]"), (8, ")")]),
        ("s = '(' + f(", False, [(11, "(")]),
        ('x = "a\\"(" + g(', False, [(14, "(")]),
        ('s = "abc\n(x)', False, [(9, "("), (11, ")")]),  # a line end ends a ' or " string
        ('s = "abc\r(x)', False, [(9, "("), (11, ")")]),
        ("s = `a\n(b`(", False, [(10, "(")]),  # a backquoted string goes on over lines
        ('s = "a\\\n(" + f(', False, [(14, "(")]),  # an escaped line end does not end the string
        ("# (\n)", False, [(2, "("), (4, ")")]),
        ("# (\n)", True, [(4, ")")]),
        ("f(  # )\n)", True, [(1, "("), (8, ")")]),
        ("f(  // )\r)", True, [(1, "("), (9, ")")]),
        ("#include <a(b>\n(", True, [(11, "("), (15, "(")]),
        ("f(  # )", True, [(1, "(")]),
        ("'a' # (\n[", True, [(8, "[")]),
    ],
)
def test_scan_brackets(text, comments, want):
    assert layout.scan_brackets(text, skip_comments=comments) == want


def test_unclosed_on_line_and_opens_block():
    assert layout.unclosed_on_line("return f(a, [b") == "])"
    assert layout.unclosed_on_line('return f("(", [b') == "])"
    assert layout.unclosed_on_line("x = a)") == ""
    assert layout.unclosed_on_line('x = f("abc') == ""
    assert layout.opens_block("def f(x):", "python")
    assert layout.opens_block("if (ok) {  // go", "javascript") is False
    assert not layout.opens_block("x = '{'", "python")


def test_opens_braceless():
    for line in (
        "  if (getCcalls(L) >= MAX)",
        "} else",
        "for (i = 0; i < n; i++)  /* all */",
        "else if (x) // y",
    ):
        assert layout.opens_braceless(line, "c"), line
    for line in ("  if (x) return;", "if (a &&", "while (x) {", "foo(x)", "} while (x);"):
        assert not layout.opens_braceless(line, "c"), line
    assert not layout.opens_braceless("if (x)", "python")


@pytest.mark.parametrize(
    ("line", "lang", "want"),
    [
        ('x = f"a {b', "python", '"'),
        ("route := `/{v1", "go", "`"),
        ("s = 'it''s", "python", "'"),
        ('x = "done" + y', "python", ""),
        ("let r: &'a str = x", "rust", ""),  # a lifetime opens no string
        ('x = 1  # "quoted', "python", ""),  # a comment, not a string
    ],
)
def test_open_quote(line, lang, want):
    assert layout.open_quote(line, lang) == want


@pytest.mark.parametrize(
    "text, lang, want",
    [
        ("def f():\n    if x:\n        y()\n", "python", "    "),
        ("class A {\n public:\n  void f() {\n    g();\n  }\n};\n", "cpp", "  "),  # ` public:` is not a step
        ("func f() {\n\tif x {\n\t\ty()\n\t}\n}\n", "go", "\t"),
        # a continuation aligned under its bracket is no step; a stray tab line does not outvote spaces
        ("int f(int a,\n      int b) {\n  if (a) {\n    g();\n  }\n\treturn b;\n}\n", "c", "  "),
        ("x = 1\n", "go", "\t"),
        ("x = 1\n", "rust", "    "),
        ("/**\n * Doc.\n */\nfn f() {\n  g();\n}\n", "rust", "  "),
    ],
)
def test_indent_unit(text, lang, want):
    assert layout.indent_unit(text, lang) == want


def _brackets_by_scan_code(text: str, skip_comments: bool) -> list[tuple[int, str]]:
    code, _ = layout.scan_code(text, None, comments=skip_comments, lines=True)
    return [(i, text[i]) for i in code if text[i] in "()[]{}"]


@pytest.mark.parametrize("skip_comments", [False, True])
def test_scan_brackets_finds_what_scan_code_reads_as_code(skip_comments):
    """The fast bracket scan agrees with the character-by-character scan on every text: random ones made of
    the characters that matter (quotes, escapes, comment starts, line ends), and this repository's code."""
    rng = random.Random(7)
    alphabet = list("()[]{}'\"`#/\\\n\r ax") + ["//", "#include", "\\\n"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 60))) for _ in range(3000)]
    texts += [Path(layout.__file__).read_text(), Path(__file__).read_text()]
    for text in texts:
        assert layout.scan_brackets(text, skip_comments) == _brackets_by_scan_code(text, skip_comments), text


def test_a_line_ends_in_a_placeholder_of_its_open_string():
    from dfim.engine.layout import open_placeholder

    assert open_placeholder('print(f"Hello, {', "python")
    assert open_placeholder("const s = `Hi ${user.na", "typescript")
    assert open_placeholder('println!("{', "rust")
    assert not open_placeholder('print(f"a {b} c', "python")  # closed
    assert not open_placeholder('print(f"a {b}")', "python")  # in code
    assert not open_placeholder("x = {", "python")  # a dict, not a string
    assert not open_placeholder('x = "{}" + f(', "python")
