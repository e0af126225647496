"""Unit tests of server/context.py: fill modes and the FillContext's single-line forms."""

from __future__ import annotations

import pytest

from dfim.server import context, languages, lines, postprocess
from tests.server.helpers import ctx_for, single, split


@pytest.mark.parametrize(
    ("src", "lang", "mode"),
    [
        ("def f(x):\n    |\n\ndef g():\n    pass\n", "python", "block"),
        ("class A:\n    def f(self):\n        |\n    def g(self): pass\n", "python", "block"),
        ("def f(x):\n    y = 1\n    |\n", "python", "multiline"),
        ("x = foo(a|, b)\n", "python", "line"),
        ("x = foo(|)\n", "python", "line"),
        ("if x:|\n", "python", "multiline"),
        ("function f(x) {\n  |\n}\n", "javascript", "block"),
        ("func f(x int) int {\n\t|\n}\n", "go", "block"),
        ("fn f() -> i32 {\n    |\n}\n", "rust", "block"),
        ("int f(int x) {\n  |\n}\n", "c", "block"),
        ("class A { int f() {\n  |\n} }\n", "java", "block"),
        ("some text |here\n", None, "line"),
    ],
)
def test_decide_mode(src, lang, mode):
    text, cursor = split(src)
    assert context.decide_mode(languages.Source(text, lang), cursor)[0] == mode


def test_block_fill_covers_the_empty_body():
    text, cursor = split("function f(x) {\n  |\n}\n")
    ctx = context.build_context(text, cursor, "javascript")
    assert ctx.mode == "block"
    assert ctx.prefix.endswith("{") and ctx.suffix.startswith("}")


def test_one_line_asks_a_blank_lines_fill_as_a_single_line():
    ctx = ctx_for("def f(x):\n    y = x\n    |\n    return y\n")
    assert ctx.mode == "multiline"
    single = context.one_line(ctx)
    assert (single.mode, single.max_tokens) == ("line", context.MAX_TOKENS["line"])
    assert (single.prefix, single.suffix, single.start, single.end) == (
        ctx.prefix,
        ctx.suffix,
        ctx.start,
        ctx.end,
    )
    assert postprocess.clean("y += 1\n    z = y", single) == "y += 1"
    # after an opener the fill's first line is the break itself; an empty body is filled whole
    for src in ("if x:|\n", "def f(x):\n    |\n\ndef g():\n    pass\n"):
        ctx = ctx_for(src)
        assert context.one_line(ctx) is ctx


@pytest.mark.parametrize(
    ("src", "lang"),
    [
        ("def f(x):\n    |\n\ndef g():\n    pass\n", "python"),
        ("class A:\n    def f(self):\n        |\n    def g(self): pass\n", "python"),
        ("def f(x):\n\n    |\n    pass\n", "python"),
        ("function f(x) {\n  |\n}\n", "javascript"),
        ("fn f() -> i32 {\n    |\n}\n", "rust"),
    ],
)
def test_single_line_asks_a_blank_line_of_an_empty_body_as_that_line(src, lang):
    assert ctx_for(src, lang).mode == "block"
    ctx, text, cursor = single(src, lang)
    assert (ctx.mode, ctx.start, ctx.end, ctx.lead) == ("line", cursor, cursor, "")
    assert ctx.max_tokens == context.MAX_TOKENS["line"]
    # the model reads the document up to the cursor and from it, as for any blank line
    assert text[:cursor].endswith(ctx.prefix) and text[cursor:].startswith(ctx.suffix)
    assert ctx.prefix.endswith(text[lines.line_start(text, cursor) : cursor])
    assert ctx.indent == text[lines.line_start(text, cursor) : cursor]
    assert postprocess.clean("return 1\n    y = 2", ctx) == "return 1"


@pytest.mark.parametrize(
    ("src", "lang", "lead"),
    [
        ("def f(x):|\n", "python", "\n    "),  # an empty body: the block mode's span
        ("def f(x):\n    if x:|\n    return 1\n", "python", "\n        "),
        ("class A:\n    def f(self):|\n", "python", "\n        "),
        ("def f(x):\n    try:|\n", "python", "\n        "),
        ("function f(x) {|\n", "javascript", "\n    "),  # no indentation yet: 4 spaces
        ("def f(x):\r\n    if x:|\r\n", "python", "\r\n        "),
        ("def f(\n    a,\n    b,\n) -> int:|\n", "python", "\n    "),  # a signature over several lines
        ("if (\n    a\n    and b\n):|\n", "python", "\n    "),
        ("class A {\npublic:|\n};\n", "cpp", "\n    "),
        ("package main\n\nfunc main() {|\n}\n", "go", "\n\t"),  # no indented line yet: Go's tab
        # a Rust lifetime is no quote, a JS private field no comment: the `{` still opens the block
        ("fn greet(name: &'static str) {|\n}\n", "rust", "\n    "),
        (
            "class C {\n  #n = 0;\n  inc() {\n    if (this.#n > 0) {|\n    }\n  }\n}\n",
            "javascript",
            "\n      ",
        ),
        # the block is indented from the statement's first line, not from its continuation line
        ("function f(a, b) {\n  if (a &&\n      b) {|\n  }\n  return 1;\n}\n", "javascript", "\n    "),
        ("def f(a, b):\n    if (a and\n            b):|\n    return 1\n", "python", "\n        "),
        # the ` * ` lines of a doc comment are not the file's indentation step
        (
            "/**\n * Adds.\n */\nfunction add(a, b) {\n  const s = a + b;\n  if (s > 0) {|\n  }\n}\n",
            "javascript",
            "\n    ",
        ),
    ],
)
def test_single_line_after_a_block_opener_starts_a_new_line(src, lang, lead):
    ctx, text, cursor = single(src, lang)
    assert (ctx.mode, ctx.start, ctx.end, ctx.lead) == ("line", cursor, cursor, lead)
    assert ctx.prefix.endswith(text[lines.line_start(text, cursor) : cursor] + lead)
    assert text[cursor:].startswith(ctx.suffix)
    # the suggestion is the break, the block's indentation and one line: the code below does not move
    assert postprocess.clean("return x\n    y = 2", ctx) == lead + "return x"
    assert postprocess.clean("  return x", ctx) == lead + "return x"
    assert postprocess.clean("", ctx) is None


@pytest.mark.parametrize(
    "src",
    [
        "x = foo(|\n",
        "values = [|\n",
        'd = {"a":|\n',  # a colon that opens no block: the line goes on
        "y = x[1:|\n",
        'print(f"total: {|\n',  # a brace in a string or a comment opens no block
        "x = 1  # note:|\n",
        "def greet(name:|\n",  # a colon inside brackets: an annotation, a slice, a lambda
        "x = [1, 2]\nif x[1:|\n",
        "ys = sorted(xs, key=lambda v:|\n",
        ("class A {\n  void f(List<String> items) {\n    for (String s :|\n  }\n}\n", "java"),
        ("class Api {\n  async load(url: string):|\n}\n", "typescript"),  # a type's colon opens nothing
        ("class Api {\n  private cache:|\n}\n", "typescript"),
        'config = {\n    "sizes": [16,\n              32], "name":|\n}\n',  # a key after a value on two lines
        ("export async function load(\n  url: string,\n):|\n", "typescript"),
    ],
)
def test_single_line_after_a_bracket_or_another_colon_goes_on_with_the_line(src):
    src, lang = src if isinstance(src, tuple) else (src, "python")
    ctx, text, cursor = single(src, lang)
    assert (ctx.mode, ctx.start, ctx.end, ctx.lead) == ("line", cursor, cursor, "")
    assert ctx.prefix == text[:cursor]


@pytest.mark.parametrize(
    ("src", "lang"),
    [
        ("x = foo(a|, b)\n", "python"),  # already a line
        ("def f(x):\n    y = 1\n    return y|\n", "python"),
        ("function f(x) {\n  return x;\n}|\n", "javascript"),
    ],
)
def test_single_line_leaves_other_fills_alone(src, lang):
    text, cursor = split(src)
    ctx = context.build_context(text, cursor, lang)
    assert context.single_line(ctx, text, cursor) == ctx


@pytest.mark.parametrize(
    "doc, lang",
    [
        ("function f(xs) {\n  const out = [];\n|}\n", "javascript"),
        ("int f(void) {\n    return 1;\n    |}\n", "c"),
        ("x = [\n    1,\n|]\n", "python"),
    ],
)
def test_a_cursor_before_closing_brackets_gets_one_new_line_above_them(doc, lang):
    text, cursor = split(doc)
    ctx = context.build_context(text, cursor, lang)
    assert ctx.mode == "line" and ctx.opens_line


@pytest.mark.parametrize(
    "src, lang, lead",
    [
        ("def f(xs):\n    for x in xs:|\n    return 1\n", "python", "\n        "),
        ("int f(int n) {\n  for (int i = 0; i < n; i++) {|\n  }\n}\n", "c", "\n    "),
        # where the block's first line need not be one step in, the model writes the indentation itself
        ("class A {|\n};\n", "cpp", ""),
        ("func f(x int) {\n\tswitch x {|\n\t}\n}\n", "go", ""),
        ("def f(x):\n    y = (x +|\n", "python", ""),
    ],
)
def test_a_several_line_fill_after_a_block_opener_starts_on_its_new_line(src, lang, lead):
    text, cursor = split(src)
    ctx = context.block_lead_for(context.build_context(text, cursor, lang), text, cursor)
    assert ctx.lead == lead and ctx.prefix.endswith(text[:cursor] + lead)
    if lead:
        assert ctx.mode == "multiline"
        # the suggestion starts with the break and the indentation; the lines stay in the block
        assert postprocess.clean("x()\n" + lead[1:] + "y()", ctx) == lead + "x()\n" + lead[1:] + "y()"
