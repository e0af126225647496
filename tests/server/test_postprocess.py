"""Unit tests of server/postprocess.py: what a raw fill becomes before it is shown."""

from __future__ import annotations

import pytest

from dfim.server import context, postprocess
from tests.server.helpers import ctx_for, single, split


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


def test_balance_brackets_closes_what_it_opened_after_a_cut():
    assert postprocess.balance_brackets("f([1)", "x = ", "\n", close_open=True) == "f([1])"
    assert postprocess.balance_brackets("f([1", "x = ", "\n", close_open=True) == "f([1])"
    assert postprocess.balance_brackets("f(1))", "x = ", "\n", close_open=True) == "f(1)"
    assert postprocess.balance_brackets("a[0])", "y = g(", ")\n") == "a[0]"  # the suffix has it


def test_a_fill_inside_a_word_does_not_write_the_line_again():
    cut = postprocess.cut_repeated_line_end
    assert cut("S = len(values)", "ETS = len(values)") == "S"
    assert cut("S = len(values)\n", "ETS = len(values)\n") == "S"
    assert cut("S", "ETS = len(values)") == "S"  # nothing repeated
    assert cut("ETS", "ETS = 1") == "ETS"  # the word itself is not a tail to cut (and " = 1" is short)
    text, cursor = split("values = [1]\nBUCK|ETS = len(values)\n")
    ctx = context.build_context(text, cursor, "python")
    assert postprocess.clean("S = len(values)", ctx) == "S"
