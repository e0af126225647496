"""Unit tests of the server's pure parts: positions, context, post-processing, options, inline, telemetry."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest
from lsprotocol import types

from dfim.engine.api import Hole, SamplerSettings, TokenScore
from dfim.server import (
    actions,
    context,
    holes,
    inline,
    languages,
    lines,
    options,
    postprocess,
    telemetry,
    windows,
)
from dfim.server.documents import (
    UTF8,
    UTF16,
    UTF32,
    Document,
    PositionError,
    choose_encoding,
    column_to_index,
)


def pos(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def rng(a: int, b: int, c: int, d: int) -> types.Range:
    return types.Range(start=pos(a, b), end=pos(c, d))


# ---- documents ----------------------------------------------------------------------------------------


def test_choose_encoding_prefers_utf8_then_defaults_to_utf16():
    assert choose_encoding(None) == UTF16
    assert choose_encoding([UTF16]) == UTF16
    assert choose_encoding([UTF16, UTF8]) == UTF8
    assert choose_encoding(["utf-7"]) == UTF16


def test_positions_with_emoji_and_surrogate_pairs():
    doc = Document("file:///a.py", 'x = "😋"\ny = 1\n')
    # the closing quote: 9 UTF-8 bytes, 7 UTF-16 units, 6 code points in
    assert doc.offset_at(pos(0, 9), UTF8) == 6 and doc.text[6] == '"'
    assert doc.offset_at(pos(0, 7), UTF16) == 6
    assert doc.offset_at(pos(0, 6), UTF32) == 6
    assert doc.position_at(6, UTF16) == pos(0, 7)
    assert doc.position_at(6, UTF8) == pos(0, 9)
    # between the two halves of the surrogate pair: snaps to the start of the emoji
    assert doc.offset_at(pos(0, 6), UTF16) == 5
    assert column_to_index('"😋"', 2, UTF16) == 1


def test_crlf_and_lone_cr_line_ends_and_tabs():
    doc = Document("file:///a.c", "a\r\n\tb\rc\nd")
    assert doc.line_count == 4
    assert doc.line_text(1) == "\tb"
    assert doc.offset_at(pos(1, 1), UTF16) == 4 and doc.text[4] == "b"
    assert doc.offset_at(pos(2, 1), UTF16) == 7
    assert doc.position_at(len(doc.text), UTF16) == pos(3, 1)
    # the end of line 0 is before the \r\n, never between \r and \n
    assert doc.offset_at(pos(0, 1), UTF16) == 1
    assert doc.offset_at(pos(0, 2), UTF16) == 1  # past the line's end: its end, still before the \r\n


def test_form_feed_and_unicode_separators_are_not_line_ends():
    doc = Document("file:///a.py", "a\x0cb\u2028c\nd")
    assert doc.line_count == 2
    assert doc.offset_at(pos(1, 0)) == 6


def test_lines_past_the_end_raise_and_characters_past_a_line_end_mean_its_end():
    doc = Document("file:///a.py", "ab\ncd")
    for bad in (pos(2, 0), pos(5, 5)):
        with pytest.raises(PositionError):
            doc.offset_at(bad)
    assert doc.offset_at(pos(1, 2)) == 5
    # LSP: a character past the line's end defaults to the line length
    assert doc.offset_at(pos(0, 3)) == 2 and doc.offset_at(pos(1, 99)) == 5


def test_incremental_and_whole_document_changes():
    doc = Document("file:///a.py", "héllo 😋 world\r\nline2\r\n")
    change = types.TextDocumentContentChangePartial(range=rng(0, 9, 0, 14), text="there")
    doc.apply_change(change, UTF16)  # "héllo 😋 " is 9 UTF-16 units
    assert doc.text == "héllo 😋 there\r\nline2\r\n"
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(1, 0, 2, 0), text=""), UTF16)
    assert doc.text == "héllo 😋 there\r\n"
    doc.apply_change(types.TextDocumentContentChangeWholeDocument(text="new"), UTF16)
    assert doc.text == "new" and doc.line_count == 1
    # a change past the end of a line clamps to the line end (LSP's rule), never corrupts
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(0, 99, 0, 99), text="!"), UTF16)
    assert doc.text == "new!"


def test_utf8_change():
    doc = Document("file:///a.py", "é = 1\n")
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(0, 2, 0, 2), text="x"), UTF8)
    assert doc.text == "éx = 1\n"


# ---- context ------------------------------------------------------------------------------------------


def split(src: str) -> tuple[str, int]:
    return src.replace("|", ""), src.index("|")


@pytest.mark.parametrize(
    ("language_id", "uri", "expected"),
    [
        ("python", "", "python"),
        ("typescriptreact", "", "tsx"),
        ("", "file:///x/y.rs", "rust"),
        ("plaintext", "file:///x/y.hpp", "cpp"),
        ("markdown", "file:///x/README.md", None),
    ],
)
def test_language_for(language_id, uri, expected):
    assert languages.language_for(language_id, uri) == expected


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


def test_windows_cut_on_whole_lines_preferring_top_level_ones():
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))
    text = body + "def target(x):\n    return |\n" + body
    text, cursor = split(text)
    ctx = context.build_context(text, cursor, "python", prefix_tokens=100, suffix_tokens=60)
    assert ctx.prefix.startswith("def f") and len(ctx.prefix) < 100 * 3 + 10
    assert ctx.suffix.endswith("\n") and ctx.suffix.rstrip().endswith(tuple(f"+ {i}" for i in range(200)))
    # with a real token counter the windows fit the budgets
    ctx = context.build_context(text, cursor, "python", prefix_tokens=50, suffix_tokens=30, count_tokens=len)
    assert len(ctx.prefix) <= 50 and len(ctx.suffix) <= 30
    assert ctx.prefix.startswith("def ") or ctx.prefix.startswith("    ")


def shipped_token_count():
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR
    from dfim.engine.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_file(DEFAULT_MODEL_DIR / "tokenizer.json")
    return lambda text: len(tokenizer.encode(text))


def _typing(text: str, at: int, typed: str, step: int = 3):
    """(document, cursor) after each `step` characters of `typed` are inserted at `at`."""
    for k in range(step, len(typed) + 1, step):
        yield text[:at] + typed[:k] + text[at:], at + k


def test_windows_stay_put_while_the_user_types():
    # decision 43: the engine re-encodes from the first context token that changed, and the suffix comes
    # first, so windows that moved with the cursor or with the half-typed line's parse cost a re-encode
    body = "".join(f"def f{i}(x):\n    y = [x, {i}]\n    return y\n\n" for i in range(300))
    at = len(body) // 2
    at = body.index("\n", at) + 1
    typed = "    values = compute(alpha, [beta, gamma], {'k': delta})\n    total = sum(values) + offset(\n"
    count = shipped_token_count()
    contexts = [
        context.build_context(doc, cur, "python", prefix_tokens=200, suffix_tokens=100, count_tokens=count)
        for doc, cur in _typing(body, at, typed)
    ]
    suffixes = {c.suffix for c in contexts}
    starts = [c.start - len(c.prefix) for c in contexts]
    assert len(suffixes) == 1  # open brackets and all: the text after the cursor is read the same way
    cell = 200 * windows.CHARS_PER_TOKEN / windows.GRID_CELLS
    assert 1 < len(set(starts)) <= 1 + len(typed) / cell  # at most one move per cell typed
    assert all(count(c.prefix) <= 200 and count(c.suffix) <= 100 for c in contexts)  # within the budgets
    assert all(count(c.prefix) >= 200 * 0.75 and count(c.suffix) >= 100 * 0.75 for c in contexts)  # used
    assert all(c.prefix.startswith(("def f", "    ")) and c.suffix.endswith("\n") for c in contexts)  # lines


def test_windows_are_cut_on_the_documents_grid_not_the_parsed_regions():
    # only a region around the cursor is parsed; the windows must not depend on where that region starts
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(4000))
    for cursor in (len(body) // 3, len(body) // 3 + 1, len(body) // 2 + 7):
        far = context.build_context(body, cursor, "python", prefix_tokens=300, suffix_tokens=100)
        near = windows.fit_window(languages.Source(body, "python"), cursor, cursor, 300, 100)
        assert (far.start - len(far.prefix), far.end + len(far.suffix)) == near


def test_dense_text_keeps_a_full_window_and_never_breaks_the_context():
    # review of decision 43: budgets under one grid cell crashed (IndexError), and CJK/emoji text stepped
    # the windows down to nothing
    count = shipped_token_count()
    for budgets in ((339, 169), (1024, 256)):
        for n in range(1, 300, 7):
            text = "s = '" + "\U0001f600" * n
            ctx = context.build_context(text, len(text), "python", *budgets, count_tokens=count)
            assert count(ctx.prefix) <= budgets[0] and text.endswith(ctx.prefix)
    cjk = "".join(f"# 第{i}行的注释，说明这个函数做什么\nx{i} = {i}\n" for i in range(400))
    cursor = len(cjk) // 2
    ctx = context.build_context(cjk, cursor, "python", 256, 128, count_tokens=count)
    assert 256 * 0.6 <= count(ctx.prefix) <= 256 and 128 * 0.6 <= count(ctx.suffix) <= 128


def test_crlf_windows_start_where_lf_windows_do():
    body = "".join(f"def f{i}(x):\n    y = x + {i}\n    return y\n\n" for i in range(300))
    cursor = body.index("def f150")
    lf = context.build_context(body, cursor, "python", 300, 100)
    crlf_text = body.replace("\n", "\r\n")
    crlf = context.build_context(crlf_text, crlf_text.index("def f150"), "python", 300, 100)
    assert lf.prefix.startswith("def f") and crlf.prefix.startswith("def f")


def test_a_large_budget_keeps_its_window_while_the_user_types():
    # the parsed region is sized for the widest window tried, so the window stays on the document's grid
    body = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(6000))
    at = body.index("def f5000")
    count = shipped_token_count()
    starts = {
        c.start - len(c.prefix)
        for doc, cur in _typing(body, at, "    total = compute(alpha)\n", step=6)
        for c in [context.build_context(doc, cur, "python", 6000, 256, count_tokens=count)]
    }
    assert len(starts) <= 2


def test_windows_without_grammar_cut_at_lines():
    text = "\n".join(f"line {i} of the file" for i in range(500))
    cursor = text.index("line 250") + 4
    ctx = context.build_context(text, cursor, None, prefix_tokens=40, suffix_tokens=40)
    assert ctx.prefix.startswith("line ") and ctx.suffix.endswith("\n")


def test_find_holes_in_several_languages():
    py = "def f():\n    pass\n\ndef g():\n    ...\n\n# TODO: h\n"
    assert [h.kind for h in holes.find_holes(languages.Source(py, "python"), 0, len(py))] == [
        "pass",
        "ellipsis",
        "todo",
    ]
    rs = "fn f() -> i32 {\n    todo!()\n}\n"
    assert [h.kind for h in holes.find_holes(languages.Source(rs, "rust"), 0, len(rs))] == ["todo"]
    js = "function f() {\n  // TODO implement\n}\n"
    found = holes.find_holes(languages.Source(js, "javascript"), 0, len(js))
    assert len(found) == 1 and js[found[0].start : found[0].end] == "// TODO implement"
    plain = "a\n    pass\nb\n"
    assert [h.kind for h in holes.find_holes(languages.Source(plain, None), 0, len(plain))] == ["pass"]


def test_open_brackets():
    assert lines.open_brackets("x = foo(a, [1, 2") == ["(", "["]
    assert lines.open_brackets("s = '(' + f(") == ["("]


# ---- postprocess --------------------------------------------------------------------------------------


def ctx_for(src: str, lang: str | None = "python") -> context.FillContext:
    text, cursor = split(src)
    return context.build_context(text, cursor, lang)


def test_suffix_overlap_and_duplicated_closers_are_removed():
    ctx = ctx_for("x = foo(|)\n")
    assert postprocess.clean("a, b)", ctx) == "a, b"
    assert postprocess.clean("bar(1))", ctx) == "bar(1)"
    ctx = ctx_for("print(f(|))\n")
    assert postprocess.clean("x)", ctx) == "x"
    ctx = ctx_for("def f(x):\n    |\n    return y\n")
    assert postprocess.clean("y = x + 1\n    return y", ctx) == "y = x + 1"


def test_a_lone_colon_or_semicolon_after_the_cursor_is_not_doubled():
    assert postprocess.clean("0:", ctx_for("if x > |:\n    pass\n")) == "0"
    assert postprocess.clean("w * 2;", ctx_for("int a = |;\n", "c")) == "w * 2"
    assert postprocess.clean("length;", ctx_for("const n = xs.|;\n", "javascript")) == "length"
    assert postprocess.clean("0", ctx_for("if x > |:\n    pass\n")) == "0"  # nothing doubled: untouched


def test_a_fill_never_doubles_the_closing_quote_or_the_text_after_the_cursor():
    ctx = ctx_for('greeting = f"Hello {name}|"\n')
    assert postprocess.clean('!"', ctx) == "!"
    assert postprocess.clean(' and "x"', ctx) == ' and "x"'  # opens and closes its own string: kept
    ctx = ctx_for('path = "C:\\\\dir\\\\|"\n')  # an escaped backslash, then the closing quote
    assert postprocess.clean('sub\\\\"', ctx) == "sub\\\\"
    assert postprocess.clean('a\\"b', ctx) == 'a\\"b'  # an escaped quote closes nothing
    ctx = ctx_for('doc = """Sum |"""\n')
    assert postprocess.clean('of values."""', ctx) == "of values."
    # an editor closed the quote and the bracket: the fill ends where it closes the string
    ctx = ctx_for('def main():\n    print("|")\n')
    assert postprocess.clean('Hello, world!", 1)', ctx) == "Hello, world!"
    # it wrote the rest of the line too, or closed the string itself: the overlap and the quote go
    assert postprocess.clean('Hello", end="")', ctx) == 'Hello", end="'
    assert postprocess.clean('Hello, " + name + "!"', ctx) == 'Hello, " + name + "!'
    ctx = ctx_for('def f():\n    """|"""\n')
    assert postprocess.clean("Return the user's name.", ctx) == "Return the user's name."
    ctx = ctx_for('def f(d):\n    return d.get("|", None)\n')
    assert postprocess.clean('key")', ctx) == "key"
    ctx = ctx_for('class A {\n  void f() {\n    System.out.println("|");\n  }\n}\n', "java")
    assert postprocess.clean('Total: " + n);', ctx) == "Total: "
    # mid-word: a fill that is only the start of what follows the cursor adds nothing
    ctx = ctx_for("BUCK|ETS = (16, 32)\n")
    assert postprocess.clean("ETS", ctx) is None
    assert postprocess.clean("ET_SIZES", ctx) == "ET_SIZES"


def test_a_fill_stops_before_the_model_stutters():
    ctx = ctx_for("def add(a, b):\n    total = a + b\n    |\n    return total\n")
    raw = "total = b + b\n    total = total + total total total total\n    x = 1"
    assert postprocess.clean(raw, ctx) == "total = b + b"
    assert postprocess.clean("total total total total", ctx) is None
    assert postprocess.clean("return [x for x in xs if x]", ctx) == "return [x for x in xs if x]"
    for code in (
        'bytes.fromhex("00 00 00 00")',
        'struct.Struct("I I I I")',
        "x = 'b b b b'",
        "y = compute(a, b)  # no no no no",
    ):
        assert postprocess.clean(code, ctx) == code
    assert postprocess.cut_stutter('x = """\nfoo foo foo foo\n"""\ny') == 'x = """\nfoo foo foo foo\n"""\ny'


def test_a_block_fill_stops_where_the_model_loops_over_its_own_lines():
    cut = postprocess.cut_loop
    # a line twice in a row, or a run of lines written again right after itself
    assert cut("x = [x]\nx = [x]\nx = [x]", "python") == "x = [x]"
    run = "if a:\n    d = abs(a)\n    print(d)\n    d = abs(a)\n    print(d)\n    return d"
    assert cut(run, "python") == "if a:\n    d = abs(a)\n    print(d)"
    # the `if` whose body was the repeat goes too
    assert cut("total = 0\nif x:\nif x:\n    y = 1", "python") == "total = 0"
    # real code says the same thing in two places; strings make lines differ; closers and markup repeat
    for legit in (
        "while i < len(s):\n    if s[i] == ' ':\n        i += 1\n        continue\n    out.append(s[i])\n    i += 1",
        "if c == '(':\n    cur.append(c)\nelif c == ')':\n    cur.append(c)",
        "a, err := f()\nif err != nil {\n\treturn err\n}\nb, err := g(a)\nif err != nil {\n\treturn err\n}",
        'print("start")\nprint("done")',
        'assert upper("a") == "A"\nassert upper("b") == "B"',
        "if a:\n    return False\nelif b:\n    return False\nreturn True",
        "        }\n    }\n}",
        "<div>\n  <p>x</p>\n</div>\n</div>",
        "if (a) {\n  f(a);\n}\nif (b) {\n  g(b);\n}",
    ):
        assert cut(legit, "python") == legit
    # only several-line fills: a single line is never cut
    ctx = ctx_for("def f(xs):\n    |\n")
    assert ctx.mode != "line"
    assert postprocess.clean("total = 0\n    x = 1\n    x = 1", ctx) == "total = 0\n    x = 1"


def test_a_block_fill_loses_a_tail_that_does_not_parse():
    ctx = ctx_for("def f(xs):\n    total = 0\n    |\n    return total\n")
    assert ctx.mode != "line"
    broken = "for x in xs:\n        total += x\n    numbersbers len(num(num)"
    assert postprocess.cut_to_parsing_lines(broken, ctx) == "for x in xs:\n        total += x"
    # lines that parse only together stay together; a fill that never parses is left as it is
    whole = "for x in xs:\n        if x:\n            total += x"
    assert postprocess.cut_to_parsing_lines(whole, ctx) == whole
    assert postprocess.cut_to_parsing_lines("x = (\n    1 +", ctx) == "x = (\n    1 +"
    assert postprocess.clean(broken, ctx) == "for x in xs:\n        total += x"
    # a block header left without its body at the end goes with the broken tail
    headed = "for x in xs:\n        total += x\n    if x > 3:\n        total -= (x"
    assert postprocess.cut_to_parsing_lines(headed, ctx) == "for x in xs:\n        total += x"
    # an unfinished line above the cursor (as while typing) does not turn the cut off
    ctx = ctx_for("def f(xs):\n    total = foo(xs,\n    |\n    return total\n")
    assert postprocess.cut_to_parsing_lines(broken, ctx) == "for x in xs:\n        total += x"
    # a loop cut that would leave a bracket open is not made
    ctx = ctx_for("def f():\n    |\n    return m\n")
    table = 'm = {\n        "a": 1,\n        "a": 1,\n    }'
    assert postprocess.clean(table, ctx) == table


def test_the_parse_window_starts_at_a_top_level_line_and_ends_at_a_line_end():
    prefix = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(400)) + "def g(xs):\n    "
    suffix = "\n    return xs\n" + "x = 1\n" * 1000
    before, after = postprocess.parse_window(prefix, suffix, before=4000, after=2000)
    assert prefix.endswith(before) and before.startswith("def f") and len(before) <= 4000
    assert suffix.startswith(after) and after.endswith("x = 1") and 2000 <= len(after) <= 2010
    assert postprocess.parse_window("x = 1\n", "y\n") == ("x = 1\n", "y\n")  # short text stays whole


def test_a_brace_fill_does_not_end_in_a_braceless_header():
    ctx = ctx_for("function f(t) {\n  let n = 0;\n  |\n  return t;\n}\n", "javascript")
    fill = "n += 1;\n  if (t > 10)\n  t = (t +"
    assert postprocess.cut_to_parsing_lines(fill, ctx) == "n += 1;"


def test_an_empty_brace_body_fill_stays_on_the_cursors_line():
    from dfim.server.inline import fit_body_fill, one_line_edit

    for src in ("function f(w) {\n  |\n}\n", "function f(w) {\n\n  |\n\n}\n", "function f(w) {|\n}\n"):
        text, cursor = split(src)
        ctx = context.build_context(text, cursor, "javascript")
        assert ctx.mode == "block"
        for raw in ("\n" + ctx.indent + "return w;\n", "return w;"):
            fill = fit_body_fill(postprocess.clean(raw, ctx), text, ctx, cursor)
            edit = one_line_edit(text, ctx.start, ctx.end, fill, cursor)
            assert edit is not None, (src, raw)
            s, e, insert = edit
            assert "return w;" in text[:s] + insert + text[e:]


def test_broken_characters_are_never_shown():
    ctx = ctx_for('name = "|"\n')
    assert postprocess.clean("H\ufffdüße", ctx) == "Hüße"
    ctx = ctx_for('bad = "\ufffd"\nname = "|"\n')  # the user's own replacement character may be copied
    assert postprocess.clean("\ufffd!", ctx) == "\ufffd!"


def test_single_line_mode_keeps_one_line_and_closes_its_own_brackets():
    ctx = ctx_for("total = |\n")
    assert postprocess.clean("sum(values\nprint(total)", ctx) == "sum(values)"


def test_a_fill_in_a_lines_indentation_opens_a_new_line_above_its_code():
    # cursor at column 0 of an indented statement (where a FIM harness splits prefix and suffix)
    ctx = ctx_for("def f(x):\n    y = x\n|    return y\n")
    assert (ctx.mode, ctx.opens_line) == ("line", True)
    assert postprocess.clean("    y += 1\nprint(y)", ctx) == "    y += 1\n"
    # cursor after the indentation: the code keeps its indentation on the next line
    ctx = ctx_for("def f(x):\n    y = x\n    |return y\n")
    assert ctx.opens_line
    assert postprocess.clean("y = g(y", ctx) == "y = g(y)\n    "
    # a copy of the line it would push down is no suggestion
    assert postprocess.clean("return y", ctx) is None
    # deeper than the line before, which opens no block: impossible, so at the indentation of the code below
    ctx = ctx_for("|def add(a, b):\n    return a\n")
    assert postprocess.clean("    assert a == b", ctx) == "assert a == b\n"
    ctx = ctx_for("x = 1\n|y = 2\n")
    assert postprocess.clean("        z = 3", ctx) == "z = 3\n"
    # deeper after a line that opens a block is the model's to choose (a body above a dedented line)
    ctx = ctx_for("def f(x):\n    if x:\n|    return y\n")
    assert postprocess.clean("        x += 1", ctx) == "        x += 1\n"
    # not at a line's start, or nothing after the cursor: the line is completed in place
    assert not ctx_for("x = foo(|a)\n").opens_line
    assert not ctx_for("def f(x):\n    |\n").opens_line
    text, cursor = split("def f(x):\n    |return y\n")
    assert not context.build_context(
        text, cursor, "python", mode="line", span=(cursor, cursor + 6)
    ).opens_line


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


def single(src: str, lang: str | None = "python") -> tuple[context.FillContext, str, int]:
    text, cursor = split(src)
    return context.single_line(context.build_context(text, cursor, lang), text, cursor), text, cursor


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
    ("src", "lang"),
    [
        ('package main\n\nimport "fmt"\n\nfunc main() {\n\t|\n}\n', "go"),
        ("function f(a) {\n\tconst b = a + 1;\n\t|\n}\n", "javascript"),
        ("def f(a):\n    b = 1\n    |\n    return b\n", "python"),
    ],
)
def test_a_fill_after_typed_indentation_does_not_indent_again(src, lang):
    ctx, _, _ = single(src, lang)
    for raw in ("\tname = 1", "    name = 1", " name = 1"):
        assert postprocess.clean(raw, ctx) == "name = 1", raw


def test_a_fill_after_typed_indentation_may_go_one_deeper_below_an_opener():
    ctx, _, _ = single("def f(a):\n    if a:\n    |\n")  # the editor kept the `if`'s indentation
    assert postprocess.clean("    return 1", ctx) == "    return 1"
    ctx, _, _ = single("def f(a):\n    if a:  # positive\n    |\n")  # a comment after the opener
    assert postprocess.clean("    return 1", ctx) == "    return 1"


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


def test_scope_limited_by_indentation():
    ctx = ctx_for("def f(x):\n    if x:\n        |\n")
    raw = "y = 1\n        z = 2\n    return 3\ndef g():\n    pass"
    assert postprocess.clean(raw, ctx) == "y = 1\n        z = 2"


def test_brace_scope_does_not_close_the_enclosing_block():
    ctx = ctx_for("function f(x) {\n  const y = 1;\n  |\n}\n", "javascript")
    assert postprocess.clean("return y;\n}\n", ctx) == "return y;"


def test_empty_and_repetitive_suggestions_are_dropped():
    ctx = ctx_for("x = |\n")
    assert postprocess.clean("   \n ", ctx) is None
    assert postprocess.is_repetitive("a = 1\na = 1\na = 1\n")
    assert postprocess.is_repetitive("abababababababab")
    assert not postprocess.is_repetitive("for i in range(10):\n    total += i")
    ctx = ctx_for("y = compute(x)\n|\nz = 2\n")
    assert postprocess.clean("z = 2", ctx) is None


def test_crlf_documents_get_crlf_completions():
    text = "def f(x):\r\n    if x:\r\n        \r\n"
    cursor = text.index("        \r\n") + 8
    ctx = context.build_context(text, cursor, "python")
    assert ctx.newline == "\r\n"
    assert postprocess.clean("a = 1\n        b = 2", ctx) == "a = 1\r\n        b = 2"


def test_rank_prefers_candidates_that_parse():
    ctx = ctx_for("def f(x):\n    return |\n")
    ranked = postprocess.rank_candidates(["x +* 1", "x + 1", "x + 1"], ctx)
    assert ranked == ["x + 1", "x +* 1"]


# ---- options ------------------------------------------------------------------------------------------


def test_options_merge_camel_and_snake_case():
    merged, errors = options.merge_options(
        options.Options(), {"sampling": {"maxSteps": 8, "entropy_bound": 0.2}, "model": {"device": "cuda"}}
    )
    assert not errors
    assert (
        merged.sampling.max_steps == 8
        and merged.sampling.entropy_bound == 0.2
        and merged.model.device == "cuda"
    )


def test_bad_values_are_reported_and_previous_kept():
    previous, _ = options.merge_options(options.Options(), {"sampling": {"maxSteps": 8}})
    merged, errors = options.merge_options(
        previous,
        {
            "sampling": {"maxSteps": 0, "entropyBound": "high", "maxCanvas": 64},
            "model": {"device": "tpu"},
            "telemetry": {"enabled": "yes"},
            "languages": "python",
            "bogus": 1,
        },
    )
    assert merged.sampling.max_steps == 8 and merged.sampling.entropy_bound == 0.1
    assert merged.sampling.max_canvas == 64
    assert merged.model.device == "cpu" and merged.telemetry.enabled is True and merged.languages == ["*"]
    assert len(errors) == 6
    assert "unknown setting dfim.bogus (ignored)" in errors
    assert any("dfim.sampling.maxSteps" in e for e in errors)
    # non-finite numbers are refused; a message quotes what was sent, shortened
    merged, errors = options.merge_options(
        previous, {"sampling": {"entropyBound": float("nan"), "maxSteps": 1e300}}
    )
    assert merged.sampling.entropy_bound == 0.1 and merged.sampling.max_steps == 8
    assert len(errors) == 2 and "1e+300" in errors[1] and len(errors[1]) < 100
    merged, errors = options.merge_options(previous, {"sampling": {"entropyBound": 10**400, "seed": 10**400}})
    assert merged.sampling.entropy_bound == 0.1 and len(errors) == 2 and all(len(e) < 120 for e in errors)
    _, errors = options.merge_options(options.Options(), "not an object")
    assert errors
    # a Lua client's empty table arrives as []: no settings, no error (also nested)
    assert options.merge_options(previous, []) == (previous, [])
    assert options.merge_options(previous, {"sampling": []}) == (previous, [])
    _, errors = options.merge_options(previous, [1])
    assert errors


def test_options_json_round_trip():
    data = options.to_json(options.Options())
    merged, errors = options.merge_options(options.Options(), data)
    assert not errors and merged == options.Options()


# ---- inline -------------------------------------------------------------------------------------------


def test_fill_until_shown_asks_again_with_the_next_seed_only_when_nothing_is_left():
    import asyncio

    from dfim.engine.api import FillRequest, FillResult

    ctx = ctx_for("def f(x):\n    y = x\n    |\n    return y\n")
    ctx = context.one_line(ctx)

    def run(texts: list[str], retries: int, cancelled: bool = False):
        seeds: list[int | None] = []

        async def fill_once(request: FillRequest) -> FillResult | None:
            seeds.append(request.seed)
            text = texts[len(seeds) - 1]
            result = FillResult(
                text or "", 5, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
            )
            return None if text is None else result

        request = FillRequest(prefix=ctx.prefix, suffix=ctx.suffix, seed=7)
        out = asyncio.run(inline.fill_until_shown(fill_once, request, ctx, "", retries, lambda: cancelled))
        return out, seeds

    # the first draw copies the line below: dropped, so the next seed is asked
    assert run(["return y", "y += 1"], retries=1) == ((["y += 1"], 10, 2), [7, 8])
    # something to show at once: one fill
    assert run(["y += 1", "z = 2"], retries=1) == ((["y += 1"], 5, 1), [7])
    # retries exhausted, or off, or the request superseded: nothing, no further fill
    assert run(["return y", "   "], retries=1) == (([], 10, 2), [7, 8])
    assert run(["return y", "y += 1"], retries=0) == (([], 5, 1), [7])
    assert run(["return y", "y += 1"], retries=1, cancelled=True) == (([], 5, 1), [7])
    # a cancelled fill ends it
    assert run([None], retries=1) == (None, [7])


def test_a_drafted_fills_retries_draft_again_avoiding_what_was_dropped():
    """The greedy draft is the same every time: a retry asks `again` (the server's: the draft beside canvases
    from noise) told to avoid every dropped text (decision 44)."""
    import asyncio
    from dataclasses import replace

    from dfim.engine.api import FillRequest, FillResult, SamplerSettings

    ctx = context.one_line(ctx_for("def f(x):\n    y = x\n    |\n    return y\n"))
    asked: list[tuple[bool, int, int | None, tuple[str, ...]]] = []
    texts = ["return y", "   ", "y += 1"]  # the draft copies the line below, then writes nothing: dropped

    async def fill_once(request: FillRequest) -> FillResult:
        asked.append((request.settings.draft, request.candidates, request.seed, request.avoid))
        text = texts[len(asked) - 1]
        return FillResult(
            text, 1, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
        )

    drafted = FillRequest(
        prefix=ctx.prefix, suffix=ctx.suffix, seed=7, settings=SamplerSettings(draft=True), candidates=1
    )
    again = replace(drafted, candidates=2)
    out = asyncio.run(inline.fill_until_shown(fill_once, drafted, ctx, "", 2, lambda: False, again=again))
    assert out == (["y += 1"], 3, 3)
    assert asked == [(True, 1, 7, ()), (True, 2, 8, ("return y",)), (True, 2, 9, ("return y", "   "))]


def test_a_drafted_lines_retry_adds_canvases_from_noise_only_at_a_lines_start():
    """Decision 50: at a line's start (a blank line, column 0 above code, a block opener's new line) the
    avoiding draft goes beside canvases from noise; after code on the line it goes alone."""
    settings = SamplerSettings(draft=True)
    opts = options.Options()
    wide = opts.inline.candidates
    assert wide > 1
    cases = {
        "def f(x):\n    y = x\n    |\n    return y\n": wide,  # a blank line
        "def f(x):\n|    return x\n": wide,  # column 0 above code
        "def f(x):\n    if x:|\n": wide,  # the block's first line, on a new line
        "def f(x):\n    return x +|\n": 1,  # after code on the line
        "def f(x):\n    y = g(|\n": 1,
    }
    for src, candidates in cases.items():
        text, cursor = split(src)
        ctx = context.single_line(context.build_context(text, cursor, "python"), text, cursor)
        request, _ = inline.fill_request(ctx, settings, opts, len)
        assert request.settings.draft and request.candidates == 1, src
        again = inline.retry_request(request, ctx, opts)
        assert again is not None and again.candidates == candidates, src
        assert replace(again, candidates=1) == request
    # a fill that is not drafted retries as it was asked
    ctx = ctx_for("def f(x):\n    return x +|\n")
    request, _ = inline.fill_request(ctx, SamplerSettings(draft=False), opts, len)
    assert inline.retry_request(request, ctx, opts) is None


def test_a_column_0_cursor_on_a_blank_line_gets_its_indentation_typed_on_the_last_try():
    import asyncio

    from dfim.engine.api import FillRequest, FillResult

    src = "def f(xs):\n    out = []\n    for x in xs:\n|\n\n    return out\n"
    text, cursor = split(src)
    assert context.guess_indent(text, cursor) == "        "  # one deeper than the `for` line
    ctx = context.one_line(context.build_context(text, cursor, "python"))
    led = context.with_lead(ctx, text)
    assert led is not None and led.lead == "        " and led.prefix == ctx.prefix + "        "
    assert led.before_on_line == "" and ctx.lead == ""
    # the suggestion starts with the typed indentation, however the model began
    assert postprocess.clean("out.append(x)", led) == "        out.append(x)"
    assert postprocess.clean("  out.append(x)", led) == "        out.append(x)"
    # not after indentation the user typed, nor before code on the cursor's line
    for other in ("def f(xs):\n    for x in xs:\n    |\n", "def f(xs):\n    for x in xs:\n|out.append(x)\n"):
        t, c = split(other)
        assert context.with_lead(context.one_line(context.build_context(t, c, "python")), t) is None
    assert context.guess_indent("x = 1\n", 6) == ""  # top level: nothing to type

    asked: list[str] = []

    async def fill_once(request: FillRequest) -> FillResult:
        asked.append(request.prefix[len(ctx.prefix) :])
        text = "" if len(asked) == 1 else "out.append(x)"  # the plain try writes nothing
        return FillResult(
            text, 5, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
        )

    request = FillRequest(prefix=ctx.prefix, suffix=ctx.suffix, seed=7)
    last_try = (FillRequest(prefix=led.prefix, suffix=ctx.suffix, seed=7), led)
    out = asyncio.run(
        inline.fill_until_shown(fill_once, request, ctx, "", 1, lambda: False, last_try=last_try)
    )
    assert out == (["        out.append(x)"], 10, 2) and asked == ["", "        "]


def test_typed_ahead_serves_the_rest():
    shown = inline.ShownSuggestion("id", "x = fo", ")\n", "o(a, b")
    assert inline.typed_ahead(shown, "x = foo(", ")\n") == "a, b"
    assert inline.typed_ahead(shown, "x = fx", ")\n") is None  # typed something else
    assert inline.typed_ahead(shown, "x = foo(a, b", ")\n") is None  # typed all of it
    assert inline.typed_ahead(shown, "x = foo(", "]\n") is None  # the text after changed


def test_one_line_edit():
    text = "function f(x) {\n  \n}\n"
    start, end, cursor = 15, 19, 18
    assert inline.one_line_edit(text, start, end, "\n  return x;\n", cursor) == (18, 18, "return x;")
    text = "def f(x):\n    \n"
    assert inline.one_line_edit(text, 10, 14, "    return x", 14) == (14, 14, "return x")
    assert inline.one_line_edit("ab\ncd", 0, 5, "zz\nzz", 4) is None


def test_result_cache_is_lru():
    cache = inline.ResultCache(2)
    for k in "abc":
        cache.put(k, [k])
    assert cache.get("a") is None and cache.get("c") == ["c"]


# ---- actions ------------------------------------------------------------------------------------------


def test_available_actions():
    text, cursor = split("def f(x):\n    pa|ss\n")
    assert actions.available_actions(text, "python", cursor, cursor) == ["fillHole", "completeFunction"]
    text = "def f(x):\n    pass\n\ndef g():\n    ...\n"
    names = actions.available_actions(text, "python", 0, len(text))
    assert names == ["fillSelectionHoles", "rewriteSelection", "regenerateUnsure"]


def test_complete_function_adds_lines_below_the_cursors_line_never_into_it():
    text = "def add(a, b):\n    total = a + b\n    return total"
    assert "completeFunction" not in actions.available_actions(text, "python", 5, 5)  # on the signature
    assert "completeFunction" in actions.available_actions(text, "python", len(text), len(text))  # at its end
    mid_word = text.index("total") + 2
    plan = actions.plan_action("completeFunction", text, "python", mid_word, mid_word)
    line_end = text.index("\n", mid_word)
    assert (plan.start, plan.end, plan.lead) == (line_end, line_end, "\n    ")
    assert plan.ctx.prefix.endswith("total = a + b\n    ") and plan.ctx.suffix.startswith("\n    return")
    ((s, e, new),) = actions.finish_action(plan, "total *= 2")
    assert text[:s] + new + text[e:] == "def add(a, b):\n    total = a + b\n    total *= 2\n    return total"
    with pytest.raises(actions.ActionError):
        actions.plan_action("completeFunction", text, "python", 5, 5)
    # the indented blank line after the last statement is the usual place to ask; at column 0 it is not
    text = "def add(a, b):\n    return a + b\n    \n\nx = 1\n"
    blank = text.index("    \n") + 4
    assert "completeFunction" in actions.available_actions(text, "python", blank, blank)
    assert "completeFunction" not in actions.available_actions(text, "python", blank + 2, blank + 2)


def test_fill_hole_keeps_neither_a_loop_nor_a_tail_that_does_not_parse():
    text = "def close(xs, t):\n    for x in xs:\n        pass\n    return False\n"
    at = text.index("pass")
    plan = actions.plan_action("fillHole", text, "python", at, at)
    looping = "if abs(x) < t:\n            d = abs(x)\n            d = abs(x)\n            return True"
    ((s, e, new),) = actions.finish_action(plan, looping)
    assert text[:s] + new + text[e:] == text.replace("pass", "if abs(x) < t:\n            d = abs(x)")
    ((s, e, new),) = actions.finish_action(plan, "if x < t:\n            return True\n        x = (x +")
    assert text[:s] + new + text[e:] == text.replace("pass", "if x < t:\n            return True")


@pytest.mark.parametrize(
    ("text", "lang"),
    [
        ("def f(x):\r\n    # TODO: double\r\n    return x\r\n", "python"),
        ("fn f() {\r\n    // TODO: double\r\n}\r\n", "rust"),
        ("def f(x):\r\n    # TODO: double\r\n    pass\r\n", "python"),
    ],
)
def test_a_todo_comment_is_a_hole_in_a_crlf_document_too(text, lang):
    at = text.index("TODO")
    plan = actions.plan_action("fillHole", text, lang, at, at)  # was "no hole" (the node holds the \r)
    assert (
        text[plan.start : plan.end]
        == text[text.index("//" if lang == "rust" else "#") : text.index("\r", at)]
    )


@pytest.mark.parametrize(
    ("text", "lang", "want"),
    [
        ("function empty(x) {}\n", "javascript", "function empty(x) {\n    x = 1;\n    return x;\n}\n"),
        (
            "class A {\n    int f(int a) {}\n}\n",
            "java",
            "class A {\n    int f(int a) {\n        x = 1;\n        return x;\n    }\n}\n",
        ),
    ],
)
def test_fill_hole_of_a_one_line_empty_body_puts_the_body_on_lines_of_its_own(text, lang, want):
    at = text.index("{}") + 1
    plan = actions.plan_action("fillHole", text, lang, at, at)
    ((s, e, new),) = actions.finish_action(plan, " x = 1;\n" + plan.ctx.indent + "return x;")
    assert text[:s] + new + text[e:] == want


def test_an_action_fill_closes_the_blocks_and_strings_it_left_open():
    close = actions.close_what_it_opened
    assert close("if (a == b) {\n    return a", "javascript", "  ") == "if (a == b) {\n    return a\n  }"
    assert (
        close("for w in ws {\n    if w {\n        n += 1", "rust")
        == "for w in ws {\n    if w {\n        n += 1\n    }\n}"
    )
    assert close('x = 1\n"""Doc', "python") == "x = 1"  # a docstring it never ends goes
    assert close('"""', "python") == ""
    assert close("// a { in a comment\nreturn 1;", "javascript") == "// a { in a comment\nreturn 1;"


@pytest.mark.parametrize(
    ("text", "lang", "header"),
    [
        (
            "export function dist(p: Point): number {\n  return p.x;\n}\n",
            "typescript",
            "export function dist(p: Point): number {\n",
        ),
        ("const twice = (x) => {\n  return 2 * x;\n};\n", "javascript", "const twice = (x) => {\n"),
    ],
)
def test_plan_rewrite_finds_a_function_behind_export_or_an_assignment(text, lang, header):
    plan = actions.plan_action("rewriteSelection", text, lang, 0, len(text.rstrip()))
    assert plan.middle[0] == header


def test_rewrite_of_only_whitespace_is_refused_before_the_model_runs():
    with pytest.raises(actions.ActionError, match="select the code first"):
        actions.plan_action("rewriteSelection", "x = 1\n\n\ny = 2\n", "python", 6, 8)


def test_complete_function_does_not_indent_the_first_line_twice():
    text = "func f(x int) int {\n\tif x > 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}\n"
    at = text.index("if x > 0 {") + len("if x > 0 {")
    assert "\n\t\t\t" not in complete_function(text, at, "go", "\t y := 1")


def test_fill_hole_closes_the_brackets_its_fill_opened():
    text = "import math\n\n\ndef area(r):\n    pass\n"
    at = text.index("pass")
    plan = actions.plan_action("fillHole", text, "python", at, at)
    ((s, e, new),) = actions.finish_action(plan, "return math.isnan(r")
    assert text[:s] + new + text[e:] == text.replace("pass", "return math.isnan(r)")
    assert complete_function(text, at, "python", "return max(r, [0") == text.replace(
        "pass", "return max(r, [0])"
    )
    # only the last line's code counts: brackets in a comment or a docstring above it are their own
    fill = "# strip the spaces (the user's input)\n    return r.strip()"
    ((s, e, new),) = actions.finish_action(plan, fill)
    assert text[:s] + new + text[e:] == text.replace("pass", fill)
    fill = '"""Area.\n\n    Steps:\n      1) square r\n    """\n    return 3.14 * r * r'
    ((s, e, new),) = actions.finish_action(plan, fill)
    assert text[:s] + new + text[e:] == text.replace("pass", fill)


def complete_function(text: str, cursor: int, lang: str, fill: str) -> str:
    """The document after *Complete the function body* at `cursor`, the model having written `fill`."""
    plan = actions.plan_action("completeFunction", text, lang, cursor, cursor)
    ((s, e, new),) = actions.finish_action(plan, fill)
    return text[:s] + new + text[e:]


def test_complete_function_respects_closing_braces_statements_and_comments():
    c = "int f(int x) {\n    x += 1;\n}\n"
    assert complete_function(c, c.index("}"), "c", "x++;") == "int f(int x) {\n    x += 1;\n    x++;\n}\n"
    assert complete_function(c, c.index("}") + 1, "c", "x++;") == "int f(int x) {\n    x += 1;\n    x++;\n}\n"
    one_liner = "function f(x) { return x; }\n"
    with pytest.raises(actions.ActionError):
        actions.plan_action(
            "completeFunction", one_liner, "javascript", one_liner.index("}"), one_liner.index("}")
        )
    py = "def f(x):\n    y = (x +\n         1)\n    return y\n"
    assert complete_function(py, py.index("+") + 1, "python", "y *= 2") == (
        "def f(x):\n    y = (x +\n         1)\n    y *= 2\n    return y\n"
    )
    py = "def f(x):\n    if x:  # note: odd\n        x = 1\n    return x\n"
    at = py.index("odd") + 3
    assert (
        complete_function(py, at, "python", "x = 2")
        == "def f(x):\n    if x:  # note: odd\n        x = 2\n        x = 1\n    return x\n"
    )
    py = "def f(x):\n    y = x  # note:\n    return y\n"
    assert (
        complete_function(py, py.index("note:") + 5, "python", "y += 1")
        == "def f(x):\n    y = x  # note:\n    y += 1\n    return y\n"
    )


def test_complete_function_inside_blocks_allman_braces_and_one_liners():
    js = "function f(x) {\n  if (x) {\n    x = 1;\n  }\n  return x;\n}\n"
    after_if = js.index("if (x) {") + 8
    assert complete_function(js, after_if, "javascript", "x++;") == (
        "function f(x) {\n  if (x) {\n    x++;\n    x = 1;\n  }\n  return x;\n}\n"
    )
    allman = "int f(int x)\n{\n    int y = x;\n    return y;\n}\n"
    assert complete_function(allman, allman.rindex("}"), "c", "y++;") == (
        "int f(int x)\n{\n    int y = x;\n    return y;\n    y++;\n}\n"
    )
    for text, lang in (("def f(x): return 1\n", "python"), ("const g = (a) => a + 1;\n", "javascript")):
        at = text.index("1")
        assert "completeFunction" not in actions.available_actions(text, lang, at, at)


def test_a_holes_multi_line_fill_is_kept_whole_and_a_same_line_hole_gets_one_line():
    text = "def f(x):\n    pass\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    ((s, e, new),) = actions.finish_action(plan, "def f(x):\n    a = 1\n    return a\n")
    assert new == "a = 1\n    return a"
    text = "def f(x): pass\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    ((s, e, new),) = actions.finish_action(plan, "def f(x): y = 1\n    return y\n")
    assert new == "y = 1"


def test_a_python_body_after_a_blank_line_shows_its_fill_without_a_stray_line():
    from dfim.server.inline import fit_body_fill, one_line_edit

    text, cursor = split("def f():\n\n    |\n")
    ctx = context.build_context(text, cursor, "python")
    fill = fit_body_fill("    return 1\n    y = 2", text, ctx, cursor)
    assert one_line_edit(text, ctx.start, ctx.end, fill, cursor) == (cursor, cursor, "return 1\n    y = 2")


def test_plan_fill_selection_holes_pins_the_rest():
    text = "def f(x):\n    pass\n\ndef g():\n    ...\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    assert [type(m) for m in plan.middle] == [str, Hole, str, Hole, str]
    assert plan.middle[0] == "def f(x):\n    "
    edits = actions.finish_action(plan, "def f(x):\n    return x\n\ndef g():\n    return 2\n")
    assert [(text[s:e], new) for s, e, new in edits] == [("pass", "return x"), ("...", "return 2")]


def test_hole_fills_are_indented_like_the_hole_and_stay_in_its_block():
    text = "class Stack:\r\n    def push(self, x):\r\n        pass\r\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    head = "class Stack:\r\n    def push(self, x):\r\n        "
    result = head + " self.items.append(x)\n        return self\n    def pop(self):\n        pass\r\n"
    ((s, e, new),) = actions.finish_action(plan, result)
    assert text[s:e] == "pass"
    assert new == "self.items.append(x)\r\n        return self"
    # only `pass` selected (a double-click): the block's indentation still comes from the document
    text = "class A:\n    def f(self):\n        pass\n\n    def g(self):\n        return 2\n"
    start = text.index("pass")
    plan = actions.plan_action("fillSelectionHoles", text, "python", start, start + 4)
    ((s, e, new),) = actions.finish_action(plan, "return 1\n\n    def h(self):\n        pass")
    assert new == "return 1"
    plan = actions.plan_action("fillSelectionHoles", head + "pass", "python", 0, len(head) + 4)
    with pytest.raises(actions.ActionError):  # the pinned code did not come back: nothing is applied
        actions.finish_action(plan, "class Queue:\n    pass\n")


def test_plan_rewrite_pins_the_signature():
    text = "x = 1\ndef f(a, b):\n    return a+b\n"
    start = text.index("def")
    plan = actions.plan_action("rewriteSelection", text, "python", start, len(text))
    # up to the header's line break: the body's first line keeps its own indentation (pinned, the model
    # wrote it with a space more)
    assert plan.middle[0] == "def f(a, b):\n" and isinstance(plan.middle[1], Hole)
    assert plan.warm_start == "    return a+b\n"
    edits = actions.finish_action(plan, "def f(a, b):\n    return a + b")
    assert edits == [(start, len(text), "def f(a, b):\n    return a + b\n")]


@pytest.mark.parametrize(
    ("text", "lang", "header"),
    [
        ("fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n", "rust", "fn add(a: i32, b: i32) -> i32 {\n"),
        ("int add(int a, int b) {\n    return a + b;\n}\n", "cpp", "int add(int a, int b) {\n"),
        ("function add(a, b) {\n  return a + b;\n}\n", "javascript", "function add(a, b) {\n"),
        ("void f()\n{\n    g();\n}\n", "c", "void f()\n{\n"),
        ("def f(): return 1\n", "python", "def f(): "),
        ("@property\ndef area(self):\n    return 1\n", "python", "@property\ndef area(self):\n"),  # decorated
    ],
)
def test_plan_rewrite_of_a_whole_function_pins_its_header_with_the_brace(text, lang, header):
    # the brace is the header's (it was left to the model, which wrote over it), and a selection that
    # starts at JavaScript's `function` keyword is a function too
    plan = actions.plan_action("rewriteSelection", text, lang, 0, len(text.rstrip()))
    assert plan.middle[0] == header and isinstance(plan.middle[1], Hole)
    assert header + plan.warm_start == text.rstrip()


def test_plan_rewrite_of_an_annotated_method_pins_its_annotation_and_signature():
    text = "class A {\n    @Override\n    public int size() {\n        return n;\n    }\n}\n"
    start, end = text.index("@"), text.index("    }\n") + 5
    plan = actions.plan_action("rewriteSelection", text, "java", start, end)
    assert plan.middle[0] == "@Override\n    public int size() {\n"
    assert plan.middle[0] + plan.warm_start == text[start:end]


def test_a_selection_larger_than_a_canvas_is_refused_not_cut():
    body = "".join(f"    v{i} = xs[{i}] * {i} + {i * i}\n" for i in range(40))
    text = "def f(xs):\n" + body
    for name in ("rewriteSelection", "regenerateUnsure"):
        with pytest.raises(actions.ActionError, match="too long"):
            actions.plan_action(name, text, "python", text.index("    v0"), len(text))
    holes = "".join(f"def f{i}(x):\n    pass\n\n" for i in range(40))
    with pytest.raises(actions.ActionError, match="too long"):
        actions.plan_action("fillSelectionHoles", holes, "python", 0, len(holes))


def test_rewriting_a_whole_function_fits_signature_and_body_in_one_canvas():
    text = "def mean_and_spread(values):\n" + "".join(f"    a{i} = values[{i}] + {i}\n" for i in range(8))
    count = len  # one token per character: the selection is ~190 tokens
    plan = actions.plan_action(
        "rewriteSelection", text, "python", 0, len(text), max_canvas=256, count_tokens=count
    )
    header, hole = plan.middle
    assert header == "def mean_and_spread(values):\n" and isinstance(hole, Hole)
    assert len(header) + hole.width <= 256
    assert hole.width >= len(plan.warm_start)


def test_fill_hole_keeps_brace_layout():
    text, cursor = split("function f(x) {\n  |\n}\n")
    plan = actions.plan_action("fillHole", text, "javascript", cursor, cursor)
    ((s, e, new),) = actions.finish_action(plan, "\n  return x;\n")
    assert text[:s] + new + text[e:] == "function f(x) {\n  return x;\n}\n"


def test_unsure_skeleton():
    pieces = ["a", " =", " ", "1", "+", "2"]
    scores = [
        TokenScore("a", 0.9),
        TokenScore(" =", 0.2),
        TokenScore(" ", 0.1),
        TokenScore("1", 0.95),
        TokenScore("-", 0.9),
    ]
    # " =" is unsure, " " is blank (kept), "+" would be rewritten as "-", "2" has no score (kept)
    assert actions.unsure_skeleton(pieces, scores, 0.5) == ["a", Hole(2), " 1", Hole(2), "2"]
    assert actions.unsure_skeleton(pieces[:1], scores[:1], 0.5) is None


def test_action_errors():
    with pytest.raises(actions.ActionError):
        actions.plan_action("fillHole", "x = 1\n", "python", 2, 2)
    with pytest.raises(actions.ActionError):
        actions.plan_action("rewriteSelection", "x = 1\n", "python", 2, 2)


# ---- telemetry ----------------------------------------------------------------------------------------


def test_tracker_and_stats(tmp_path, capsys):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    tracker.shown(telemetry.Shown("1", "u", "abcdef", "python"), latencyMs=100.0, source="model")
    tracker.accepted("1")
    tracker.shown(telemetry.Shown("2", "u", "xyz", "python"), latencyMs=200.0, source="model")
    tracker.shown(telemetry.Shown("3", "u", "hello", "python"), latencyMs=50.0, source="cache")  # 2 rejected
    tracker.typed("u", 2)
    tracker.supersede("u")  # 3 partially accepted (typed 2 chars, then moved on)
    events = telemetry.read_events(t.path)
    assert [e["event"] for e in events] == ["shown", "accepted", "shown", "rejected", "shown", "partial"]
    summary = telemetry.summarize(events)
    assert summary["acceptance_rate"] == pytest.approx(1 / 3)
    assert summary["latency_p50"] == 100.0 and summary["model_latency_p95"] == 200.0
    assert summary["accepted_chars"] == 8
    from dfim.commands import stats

    assert stats.run(argparse.Namespace(data_dir=str(tmp_path), json=True)) == 0
    assert json.loads(capsys.readouterr().out)["shown"] == 3
    disabled = telemetry.Telemetry(tmp_path / "off", enabled=False)
    disabled.record("shown", id="x")
    assert not disabled.path.exists()


def test_percentile():
    assert telemetry.percentile([5, 1, 3, 2, 4], 50) == 3
    assert telemetry.percentile([1.0], 95) == 1.0


def test_context_budget_fits_the_trained_context() -> None:
    from dfim.engine.model.tokenizer import FIM_SPECIALS
    from dfim.server.windows import fit_context_budget

    # The shipped model was trained on 512 context tokens, suffix at most a third of them.
    prefix, suffix = fit_context_budget(1024, 256, 512)
    assert prefix + suffix + FIM_SPECIALS <= 512 and suffix <= 508 // 3 and prefix > 2 * suffix - 4
    assert fit_context_budget(1024, 256, None) == (1024, 256)  # a checkpoint that says nothing
    assert fit_context_budget(200, 100, 512) == (200, 100)  # already fits
    assert fit_context_budget(1024, 0, 512) == (508, 0)  # no suffix wanted: all room to the prefix
    assert fit_context_budget(1024, 256, 3) == (2, 0)  # absurd lengths still give a valid budget


def test_shipped_model_declares_its_trained_context() -> None:
    import json

    from dfim.engine import Engine
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR
    from dfim.server.engine_host import EngineHost

    info = json.loads((DEFAULT_MODEL_DIR / "dfim.json").read_text())
    assert info["context_tokens"] == 512 and info["objective"] == "diffusion"
    host = EngineHost()
    assert host.context_budget(1024, 256) == (1024, 256)  # nothing loaded yet: the options as set
    host.engine = Engine.load()
    assert host.engine.trained_context == 512
    assert host.context_budget(1024, 256) == (339, 169)


async def test_an_urgent_fill_runs_at_the_next_step_boundary_of_a_long_one(tmp_path) -> None:
    import asyncio
    import threading

    from dfim.engine import Engine, FillRequest, SamplerSettings
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    host.engine = Engine.load(write_random_checkpoint(tmp_path, DEFAULT_MODEL_DIR / "tokenizer.json"))
    steps: list[int] = []
    long = FillRequest(
        prefix="def f(x):\n    return ",
        suffix="\n",
        max_tokens=16,
        settings=SamplerSettings(max_steps=200, entropy_bound=0.0),  # a random model never stops early
        on_step=lambda info: steps.append(info.step),
    )
    background = asyncio.ensure_future(host.fill(long, threading.Event()))
    while not steps:  # the long fill is in the engine
        await asyncio.sleep(0.005)
    quick = FillRequest(prefix="import os\n", suffix="", max_tokens=16, settings=SamplerSettings(max_steps=2))
    result = await host.fill(quick, threading.Event(), urgent=True)
    assert result.steps == 2 and not background.done()
    assert host.preempted == 1 and len(steps) < 200
    assert (await background).steps == 200
    assert quick.cache_slot != long.cache_slot
    host.shutdown()


def test_a_partial_accept_can_grow_to_an_accept(tmp_path):
    t = telemetry.Telemetry(tmp_path)
    tracker = telemetry.SuggestionTracker(t)
    # VS Code: the watcher sees the whole insert first ("partial"), then the item's accept command runs
    tracker.shown(telemetry.Shown("1", "u", "abcdef", "python"), latencyMs=10.0, source="model")
    tracker.partially_accepted("1", 6)
    tracker.accepted("1")
    # accept word, accept word, then moved on
    tracker.shown(telemetry.Shown("2", "u", "one two three", "python"), latencyMs=10.0, source="model")
    tracker.partially_accepted("2", 4)
    tracker.partially_accepted("2", 8)
    tracker.partially_accepted("2", 4)  # a stale, smaller report changes nothing
    tracker.rejected("2")  # dismissing the rest keeps what was taken
    tracker.shown(telemetry.Shown("3", "u", "xyz", "python"), latencyMs=10.0, source="model")
    events = telemetry.read_events(t.path)
    assert [(e["event"], e.get("acceptedChars")) for e in events if e["event"] != "shown"] == [
        ("accepted", 6),
        ("partial", 4),
        ("partial", 8),
    ]
    summary = telemetry.summarize(events)
    assert (summary["shown"], summary["accepted"], summary["partial"], summary["rejected"]) == (3, 1, 1, 0)
    assert summary["accepted_chars"] == 6 + 8


@pytest.mark.parametrize(
    "doc, lang, model",
    [
        ("function add(a, b) {\n  |\n}\n", "javascript", "return a + b"),
        ("function add(a, b) {|\n}\n", "javascript", "return a + b"),
        ("func add(a, b int) int {\r\n\t// TO|DO\r\n}\r\n", "go", "return a + b"),
        ("int add(int a, int b) {\r\n    // TO|DO\r\n}\r\n", "java", "return a + b;"),
    ],
)
def test_fill_hole_indents_a_fill_the_model_left_at_column_0(doc, lang, model):
    text, cursor = split(doc)
    plan = actions.plan_action("fillHole", text, lang, cursor, cursor)
    ((s, e, new),) = actions.finish_action(plan, model)
    after = text[:s] + new + text[e:]
    body = after.splitlines()[1]
    assert body.strip() == model and body[:1] in (" ", "\t"), repr(after)
    assert after.rstrip().endswith("}") and after.count("}") == 1


def test_balance_brackets_closes_what_it_opened_after_a_cut():
    assert postprocess.balance_brackets("f([1)", "x = ", "\n", close_open=True) == "f([1])"
    assert postprocess.balance_brackets("f([1", "x = ", "\n", close_open=True) == "f([1])"
    assert postprocess.balance_brackets("f(1))", "x = ", "\n", close_open=True) == "f(1)"
    assert postprocess.balance_brackets("a[0])", "y = g(", ")\n") == "a[0]"  # the suffix has it


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


def test_a_fill_inside_a_word_does_not_write_the_line_again():
    cut = postprocess.cut_repeated_line_end
    assert cut("S = len(values)", "ETS = len(values)") == "S"
    assert cut("S = len(values)\n", "ETS = len(values)\n") == "S"
    assert cut("S", "ETS = len(values)") == "S"  # nothing repeated
    assert cut("ETS", "ETS = 1") == "ETS"  # the word itself is not a tail to cut (and " = 1" is short)
    text, cursor = split("values = [1]\nBUCK|ETS = len(values)\n")
    ctx = context.build_context(text, cursor, "python")
    assert postprocess.clean("S = len(values)", ctx) == "S"


def test_nested_urgent_fills_leave_the_action_a_step_and_never_move_the_model():
    from concurrent.futures import Future

    import torch

    from dfim.engine.api import EngineError, FillRequest
    from dfim.server.engine_host import EngineHost

    host = EngineHost()
    ran: list[str] = []

    def job(name: str, then=None):
        def run():
            ran.append(name)
            if then is not None:  # a keystroke arriving while this fill runs
                host._urgent.append((job(then), Future()))

        return run

    host._urgent.append((job("a", then="b"), Future()))
    host._run_urgent(nested=True)
    assert ran == ["a"] and len(host._urgent) == 1  # "b" waits for the action's next step
    host._run_urgent()
    assert ran == ["a", "b"] and not host._urgent  # on an idle worker, everything waiting runs

    class OutOfMemoryOnGpu:  # a CUDA engine whose fills always run out of memory (no GPU here)
        device = torch.device("cuda")
        caches: dict = {}

        def fill(self, request):
            raise torch.OutOfMemoryError("injected")

        def drop_idle_caches(self):
            pass

    engine = OutOfMemoryOnGpu()
    host.engine = engine
    work: Future = Future()
    host._urgent.append((lambda: host._fill(engine, FillRequest(prefix="x", suffix="")), work))
    host._run_urgent(nested=True)
    with pytest.raises(EngineError, match="while a code action runs"):
        work.result()
    assert host.engine is engine and not host.fell_back_to_cpu  # no move to the CPU for good


def test_hole_fills_split_by_the_engines_pinned_tokens():
    text = "def f(x):\n    pass\n\ndef g():\n    ...\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    first, _, middle, _, last = plan.middle
    # the first fill writes the text of the next pinned piece itself: a text search would split there
    fill_1, fill_2 = "return g()\n\ndef g():\n    return x", "return 2"
    tokens = [
        TokenScore(first, 1.0, True),
        TokenScore(fill_1[:10], 0.5),
        TokenScore(fill_1[10:], 0.5),
        TokenScore(middle, 1.0, True),
        TokenScore(fill_2, 0.5),
        TokenScore(last, 1.0, True),
    ]
    result = "".join(t.text for t in tokens)
    edits = actions.finish_action(plan, result, tokens)
    assert [(text[s:e], new) for s, e, new in edits][1] == ("...", "return 2")
    assert edits[0][2].startswith("return g()")
    searched = actions.finish_action(plan, result)  # without the tokens: split at the first "def g()"
    assert [new for _, _, new in searched] != [new for _, _, new in edits]
    # tokens that do not line up with the skeleton fall back to the text search
    assert actions.finish_action(plan, result, [TokenScore(result, 0.5)]) == searched


def test_an_unknown_action_is_named_before_the_selection_is_checked():
    with pytest.raises(actions.ActionError, match="unknown action 'zap'"):
        actions.plan_action("zap", "def f():\n    pass\n", "python", 13, 13)  # empty selection


def test_pushed_settings_are_dfims_only_where_they_say_so():
    from dfim.server.app import dfim_section

    ours = {"inline": {"enabled": False}}
    assert dfim_section({"dfim": ours, "pylsp": {}}) == ours
    assert dfim_section({"inline": {"enabled": False}}) == {"inline": {"enabled": False}}  # the section alone
    assert dfim_section({"maxSteps": 3, "sampling": {}}) == {"maxSteps": 3, "sampling": {}}  # ours, one typo
    assert dfim_section({"pylsp": {"plugins": {}}}) is None  # other servers' sections only: not ours
    assert dfim_section(None) is None and dfim_section({}) is None


def test_a_relative_telemetry_dir_is_refused_and_an_unwritable_one_is_named(tmp_path, caplog):
    merged, errors = options.merge_options(options.Options(), {"telemetry": {"dataDir": "rel/dir"}})
    assert merged.telemetry.data_dir == "" and "absolute path" in errors[0]  # not the user's project
    merged, errors = options.merge_options(options.Options(), {"telemetry": {"dataDir": "~/dfim-data"}})
    assert merged.telemetry.data_dir == "~/dfim-data" and errors == []
    assert telemetry.Telemetry(tmp_path / "new").problem() is None
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    broken = telemetry.Telemetry(blocker / "dir")
    assert "cannot be written" in broken.problem()
    with caplog.at_level("WARNING", logger="dfim.server"):
        broken.record("shown", id="1")
        broken.record("shown", id="2")
    assert len([r for r in caplog.records if "telemetry" in r.getMessage()]) == 1  # said once, never raised


def test_a_telemetry_dir_no_os_can_open_is_refused_and_the_previous_one_kept():
    """A NUL byte or a lone surrogate in telemetry.dataDir made every telemetry write raise ValueError: the
    setting was applied anyway, the change popped up "Error in server", and every inline request after it
    failed with an internal error."""
    before = options.merge_options(options.Options(), {"telemetry": {"dataDir": "/tmp/dfim-ok"}})[0]
    for bad in ("/tmp/a\x00b", "/tmp/\ud800x"):
        merged, errors = options.merge_options(before, {"telemetry": {"dataDir": bad}})
        assert merged.telemetry.data_dir == "/tmp/dfim-ok" and "NUL" in errors[0], errors
    # bytes that are not UTF-8 (os.fsdecode's escapes) still name a real directory
    assert options.merge_options(before, {"telemetry": {"dataDir": "/tmp/\udc80"}})[1] == []
    # a long non-object is quoted short in the popup
    assert len(options.merge_options(before, "x" * 100000)[1][0]) < 100


def test_the_inline_request_drafts_a_single_line_and_denoises_the_rest():
    """`inline.fill_request`: a single-line open hole is drafted on one canvas and stops at the line break;
    several lines or a pinned rest of the line denoise `inline.candidates` canvases from noise."""
    from dataclasses import replace

    from dfim.engine.api import Hole, SamplerSettings

    settings = SamplerSettings(draft=True)
    opts = options.Options()
    opts = replace(opts, sampling=replace(opts.sampling, entropy_bound=0.3, max_steps=9))
    count = len  # one token per character: the pinned hole's width is easy to predict

    line = context.one_line(ctx_for("def f(x):\n    y = x\n    return |\n"))
    request, pinned = inline.fill_request(line, settings, opts, count)
    assert (request.settings.draft, request.candidates, request.stop, pinned) == (True, 1, ("\n",), "")
    assert (request.settings.max_steps, request.settings.entropy_bound) == (9, 0.3)  # the server's settings
    assert request.prefix == line.prefix and request.suffix == line.suffix and request.middle == ()

    no_draft = replace(opts, inline=replace(opts.inline, draft=False))
    request, _ = inline.fill_request(line, settings, no_draft, count)
    assert (request.settings.draft, request.candidates) == (False, opts.inline.candidates)

    block = ctx_for("def f(x):\n    |\n")
    assert block.mode != "line"
    request, _ = inline.fill_request(block, settings, opts, count)
    assert (request.settings.draft, request.candidates, request.stop) == (False, opts.inline.candidates, ())

    inside = ctx_for("def f(x):\n    return g(|x, y, z)\n")
    assert inside.rest_of_line == "x, y, z)"
    pin = replace(opts, context=replace(opts.context, pin_rest_of_line=True))
    request, pinned = inline.fill_request(inside, settings, pin, count)
    assert pinned == "x, y, z)" and request.middle == (Hole(16), "x, y, z)")  # twice the rest's tokens
    assert request.suffix == inside.suffix[len(pinned) :]
    assert (request.settings.draft, request.candidates) == (False, opts.inline.candidates)

    above = ctx_for("def f(x):\n|    return x\n")
    assert above.opens_line
    request, _ = inline.fill_request(above, settings, opts, count)
    assert request.scored_suffix == "\n" + above.before_on_line + above.suffix
