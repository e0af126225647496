"""Unit tests of server/rules.py: each post-processing rule as a pure function of text and context."""

from __future__ import annotations

import functools

from dfim.server import rules
from dfim.server.post_context import post_context
from tests.server.helpers import ctx_for


def test_a_stutter_inside_a_docstring_is_prose():
    assert rules.cut_stutter('x = """\nfoo foo foo foo\n"""\ny') == 'x = """\nfoo foo foo foo\n"""\ny'


def test_a_block_fill_stops_where_the_model_loops_over_its_own_lines():
    cut = rules.cut_loop
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


def test_a_block_fill_loses_a_tail_that_does_not_parse():
    ctx = ctx_for("def f(xs):\n    total = 0\n    |\n    return total\n")
    assert ctx.mode != "line"
    broken = "for x in xs:\n        total += x\n    numbersbers len(num(num)"
    assert rules.cut_to_parsing_lines(broken, post_context(ctx)) == "for x in xs:\n        total += x"
    # lines that parse only together stay together; a fill that never parses is left as it is
    whole = "for x in xs:\n        if x:\n            total += x"
    assert rules.cut_to_parsing_lines(whole, post_context(ctx)) == whole
    assert rules.cut_to_parsing_lines("x = (\n    1 +", post_context(ctx)) == "x = (\n    1 +"
    # a block header left without its body at the end goes with the broken tail
    headed = "for x in xs:\n        total += x\n    if x > 3:\n        total -= (x"
    assert rules.cut_to_parsing_lines(headed, post_context(ctx)) == "for x in xs:\n        total += x"
    # an unfinished line above the cursor (as while typing) does not turn the cut off
    ctx = ctx_for("def f(xs):\n    total = foo(xs,\n    |\n    return total\n")
    assert rules.cut_to_parsing_lines(broken, post_context(ctx)) == "for x in xs:\n        total += x"


def test_a_brace_fill_does_not_end_in_a_braceless_header():
    ctx = ctx_for("function f(t) {\n  let n = 0;\n  |\n  return t;\n}\n", "javascript")
    fill = "n += 1;\n  if (t > 10)\n  t = (t +"
    assert rules.cut_to_parsing_lines(fill, post_context(ctx)) == "n += 1;"


def test_repetitive_text():
    assert rules.is_repetitive("a = 1\na = 1\na = 1\n")
    assert rules.is_repetitive("abababababababab")
    assert not rules.is_repetitive("for i in range(10):\n    total += i")


def test_balance_brackets_closes_what_it_opened_after_a_cut():
    assert rules.balance_brackets("f([1)", (), 0, close_open=True) == "f([1])"
    assert rules.balance_brackets("f([1", (), 0, close_open=True) == "f([1])"
    assert rules.balance_brackets("f(1))", (), 0, close_open=True) == "f(1)"
    assert rules.balance_brackets("a[0])", ("(",), 0) == "a[0]"  # the suffix has it (`y = g(▮)`)
    assert rules.balance_brackets("a[0]), 1", ("(",), 1) == "a[0]), 1"  # no suffix closes it: the fill may
    # the code after the cursor on its line (an editor's closing `)`) closes what the fill reopens
    balance = rules.balance_brackets
    assert balance("runs).toBe(1", ("(",), 0, rest_of_line=");") == "runs).toBe(1"  # `expect(▮);`
    assert balance(").array().min(2", ("(", "("), 0, rest_of_line="),") == ").array().min(2"
    done = 'g.json").write(dumps(c'  # `(folder / "confi▮))`: the string ends, then two `(` the `))` close
    assert balance(done, ("(",), 0, in_string='"', rest_of_line="))") == done
    assert balance("runs].toBe(1", ("(",), 0, rest_of_line=");") == "runs"  # a closer of another kind
    assert balance("a[0])", ("(",), 0, rest_of_line=")") == "a[0]"  # the line would close one too many
    assert balance("b)", ("(",), 0) == "b"  # no code after it on the line: the next lines' `)` closes it
    assert balance("} catch (E e) {", ("{",), 0, close_open=True) == "} catch (E e) {"  # closed, reopened


def test_a_fill_in_a_placeholder_ends_before_the_brace_the_line_holds():
    balance = rules.balance_brackets
    # `print(f"Hello, {▮}")` and `` `Hello, ${▮}` ``: the `}` after the cursor closes the placeholder
    assert balance("name}", ("(",), 0, in_string='"', rest_of_line='}")', in_placeholder=True) == "name"
    assert balance("name}, {age", ("(",), 0, in_string='"', rest_of_line='}")', in_placeholder=True) == "name"
    assert balance("d[k]}", (), 0, in_string="`", rest_of_line="}`;", in_placeholder=True) == "d[k]"
    # no `}` after the cursor: the fill closes the placeholder itself
    assert balance('name}")', ("(",), 1, in_string='"', in_placeholder=True) == 'name}")'
    # a string's text without a placeholder keeps its braces
    assert balance(":[0-9]{3}}", (), 0, in_string='"', rest_of_line='"') == ":[0-9]{3}}"


def test_a_fill_that_leaves_the_rest_of_its_line_closing_another_bracket_is_dropped():
    balance = rules.balance_brackets
    balance = functools.partial(rules.balance_brackets, one_line=True)
    assert balance("{", ("(",), 0, rest_of_line=", 0);") == ""  # `reduce((acc, x) => ▮, 0);` -> `{, 0);`
    assert balance("{", ("(",), 0, rest_of_line=");") == ""  # `a.map((x) => ▮);`
    assert balance("x + 1", ("(",), 0, rest_of_line=", 0);") == "x + 1"
    assert balance("{ a: 1 }", ("(",), 0, rest_of_line=");") == "{ a: 1 }"
    assert balance("status ?? {", ("{",), 0, rest_of_line="}") == "status ?? {"  # the editor's closer
    # a block's fill may leave its last block open above the closer that follows
    assert (
        rules.balance_brackets("\n  if (x) {\n    y(", ("{",), 0, rest_of_line="}") == "\n  if (x) {\n    y("
    )


def test_a_fill_inside_a_word_does_not_write_the_line_again():
    cut = rules.cut_repeated_line_end
    assert cut("S = len(values)", "ETS = len(values)") == "S"
    assert cut("S = len(values)\n", "ETS = len(values)\n") == "S"
    assert cut("S", "ETS = len(values)") == "S"  # nothing repeated
    assert cut("ETS", "ETS = 1") == "ETS"  # the word itself is not a tail to cut (and " = 1" is short)


def test_the_parse_window_closes_the_blocks_the_file_closes_beyond_it():
    # the suffix is longer than the parse window, so the namespace's `}` lies beyond it; the fill that opens
    # the loop whose body and `}` follow is the file's own code and must not count as an error
    filler = "".join(f"void g{i}() {{\n  h({i});\n}}\n\n" for i in range(150))
    src = (
        "namespace n {\n\nvoid f(int* x, int n) {\n  x[0] = 1;\n|\n    x[i] = 0;\n  }\n}\n\n" + filler + "}\n"
    )
    ctx = ctx_for(src, "cpp")
    assert len(ctx.suffix) < len(src) - src.index("|") - 1  # the suffix's window ends before the file
    fill = "  x[1] = 2;\n  for (int i = 0; i < n; i++) {"
    assert rules.cut_to_parsing_lines(fill, post_context(ctx)) == fill
