"""Unit tests of server/postprocess.py: what a raw fill becomes before it is shown."""

from __future__ import annotations

import pytest

from dfim.server import context, postprocess, rules
from dfim.server.post_context import post_context
from tests.server.helpers import ctx_for, single, split


def test_suffix_overlap_and_duplicated_closers_are_removed():
    ctx = ctx_for("x = foo(|)\n")
    assert postprocess.clean("a, b)", ctx) == "a, b"
    assert postprocess.clean("bar(1))", ctx) == "bar(1)"
    ctx = ctx_for("print(f(|))\n")
    assert postprocess.clean("x)", ctx) == "x"
    ctx = ctx_for("def f(x):\n    |\n    return y\n")
    assert postprocess.clean("y = x + 1\n    return y", ctx) == "y = x + 1"


def test_a_fill_that_writes_the_line_again_from_before_the_cursor_loses_that_head():
    ctx = ctx_for(
        "func f() {\n\tfor i, j := 0, 1; i < j; i, j = i+1, j-1 {\n\t\trunes[i], runes[j] = |\n\t}\n}\n", "go"
    )
    assert postprocess.clean("runes[i], runes[j] = runes[j], runes[i]", ctx) == "runes[j], runes[i]"
    text = "function find(id: number): User | undefined {\n  return undefined;\n}\n"
    ts = context.build_context(text, text.index("{"), "typescript")  # (the type's `|` is no cursor mark)
    assert postprocess.clean("| undefined {", ts) is None  # nothing left worth showing
    assert postprocess.clean("| null", ts) == "| null"
    ctx = ctx_for("total = price * quantity + |\n")
    assert postprocess.clean("tax", ctx) == "tax"
    assert postprocess.clean("quantity + tax", ctx) == "tax"
    assert postprocess.clean("x + tax", ctx) == "x + tax"  # a repeat too short to tell from real code


def test_an_opener_right_after_the_cursor_is_not_opened_twice():
    ctx = ctx_for("function find(id: number): User |{\n  return undefined;\n}\n", "typescript")
    assert postprocess.clean("| undefined {", ctx) == "| undefined"
    ctx = ctx_for("func f() {\n\tif ready |{\n\t\tgo()\n\t}\n}\n", "go")
    assert postprocess.clean("&& ok {", ctx) == "&& ok"
    assert postprocess.clean("&& ok", ctx) == "&& ok"  # nothing doubled: untouched


def test_a_lone_colon_or_semicolon_after_the_cursor_is_not_doubled():
    assert postprocess.clean("0:", ctx_for("if x > |:\n    pass\n")) == "0"
    assert postprocess.clean("w * 2;", ctx_for("int a = |;\n", "c")) == "w * 2"
    assert postprocess.clean("length;", ctx_for("const n = xs.|;\n", "javascript")) == "length"
    assert postprocess.clean("0", ctx_for("if x > |:\n    pass\n")) == "0"  # nothing doubled: untouched


def test_a_fill_never_doubles_the_closing_quote_or_the_text_after_the_cursor():
    ctx = ctx_for('greeting = f"Hello {name}|"\n')
    assert postprocess.clean('!"', ctx) == "!"
    assert rules.drop_duplicate_quote(' and "x"', '"') == ' and "x"'  # opens and closes its own string: kept
    assert postprocess.clean(' and "x"', ctx) is None  # though the line no longer parses
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


def test_only_several_line_fills_are_cut_where_they_loop():
    # a single line is never cut
    ctx = ctx_for("def f(xs):\n    |\n")
    assert ctx.mode != "line"
    assert postprocess.clean("total = 0\n    x = 1\n    x = 1", ctx) == "total = 0\n    x = 1"


def test_a_block_fill_loses_a_tail_that_does_not_parse():
    ctx = ctx_for("def f(xs):\n    total = 0\n    |\n    return total\n")
    broken = "for x in xs:\n        total += x\n    numbersbers len(num(num)"
    assert postprocess.clean(broken, ctx) == "for x in xs:\n        total += x"
    # a loop cut that would leave a bracket open is not made
    ctx = ctx_for("def f():\n    |\n    return m\n")
    table = 'm = {\n        "a": 1,\n        "a": 1,\n    }'
    assert postprocess.clean(table, ctx) == table


def test_broken_characters_are_never_shown():
    ctx = ctx_for('name = "|"\n')
    assert postprocess.clean("H\ufffdüße", ctx) == "Hüße"
    ctx = ctx_for('bad = "\ufffd"\nname = "|"\n')  # the user's own replacement character may be copied
    assert postprocess.clean("\ufffd!", ctx) == "\ufffd!"


def test_single_line_mode_keeps_one_line_and_closes_its_own_brackets():
    ctx = ctx_for("total = |\n")
    assert postprocess.clean("sum(values\nprint(total)", ctx) == "sum(values)"


def test_a_line_that_opens_what_the_deeper_lines_below_already_hold_is_left_open():
    # the loop's body and its closing brace are already below the cursor's line
    ctx = ctx_for("void f(int n) {\n  for (i = 0; i < n; i++|\n    g(i);\n  }\n}\n", "c")
    assert postprocess.clean(") {", ctx) == ") {"
    ctx = ctx_for("func (r *Route) Handler(h Handler) *Route|\n\tif r.err == nil {\n\t}\n}\n", "go")
    assert postprocess.clean(" {", ctx) == " {"
    # the call's arguments follow on deeper lines
    ctx = ctx_for("parser.add_a|\n    '--stdio', action='store_true')\n")
    assert postprocess.clean("rgument(", ctx) == "rgument("
    # nothing deeper below: the line still closes what it opens
    ctx = ctx_for("if x:\n    total = |\n    print(total)\n")
    assert postprocess.clean("sum(values", ctx) == "sum(values)"


def test_brackets_inside_the_string_the_cursor_is_in_close_nothing():
    ctx = ctx_for('route = "/{v1|\nprint(route)\n')
    assert postprocess.clean(':[0-9]{3}}/{v2}",', ctx) == ':[0-9]{3}}/{v2}",'
    ctx = ctx_for("x = 'a (b|\n")
    assert postprocess.clean(") c'", ctx) == ") c'"
    # after the string's end the fill is code again: it closes `f(`, and a closer of nothing is cut
    ctx = ctx_for("x = f('a (b|\n")
    assert postprocess.clean("') + g(y))", ctx) == "') + g(y)"


def test_a_row_that_ends_as_the_row_below_begins_is_kept():
    ctx = ctx_for("static const int T[] = {\n  NONA,  NONA,|\n  NONA,  NONA,  NONA,  NONA,\n};\n", "c")
    assert postprocess.clean("  NONA,  NONA,", ctx) == "  NONA,  NONA,"


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


def test_alternatives_that_break_the_code_are_dropped_once_one_does_not():
    ctx = ctx_for("def f(x):\n    return |\n")
    ranked = postprocess.rank_candidates(["x +* 1", "x + 1", "x - 1"], ctx)
    assert ranked == ["x + 1", "x - 1", "x +* 1"]
    assert postprocess.without_breaking(ranked, ctx) == ["x + 1", "x - 1"]
    broken = postprocess.rank_candidates(["x +* 1", "x */ 2"], ctx)
    assert len(broken) == 2
    assert postprocess.without_breaking(broken, ctx) == broken  # none is clean: the model's best still shows


def test_a_fill_inside_a_word_does_not_write_the_line_again():
    text, cursor = split("values = [1]\nBUCK|ETS = len(values)\n")
    ctx = context.build_context(text, cursor, "python")
    assert postprocess.clean("S = len(values)", ctx) == "S"


def names(src: str, lang: str | None = "python") -> list[str]:
    return postprocess.inline_chain(post_context(ctx_for(src, lang))).names


def test_the_chain_holds_only_the_rules_that_apply_in_todays_order():
    assert names("x = foo(|)\n") == [
        "drop_broken_characters",
        "limit_scope",
        "cut_stutter",
        "cut_repeat_of_line_start",
        "trim_space_after_opener",
        "trim_repeated_operator",
        "remove_suffix_overlap",
        "drop_duplicate_quote",
        "balance_brackets",
        "drop_blank",
        "drop_repetitive",
        "drop_copy_of_line_above",
        "drop_copy_of_line_below",
        "drop_start_of_what_follows",
        "drop_end_of_what_follows",
        "drop_glued_to_the_next_word",
        "drop_new_syntax_errors",
    ]
    assert "cut_repeated_line_end" in names("BUCK|ETS = 1\n")  # inside a word only
    assert "drop_glued_to_the_next_word" not in names(
        "BUCK|ETS = 1\n"
    )  # an edit inside a word glues by nature
    assert "drop_new_syntax_errors" not in names("x = foo(|)\n", None)  # no grammar to ask
    assert "drop_new_syntax_errors" not in names("x = |\n")  # nothing after the cursor to spoil
    assert "strip_trailing_space" in names("x = |\n")  # a fill that ends its line
    several = names("def f(xs):\n    |\n")
    assert several.index("cut_stutter") < several.index("cut_loop") < several.index("cut_to_parsing_lines")
    assert "drop_duplicate_quote" not in several and "drop_start_of_what_follows" not in several
    assert "cut_repeat_of_line_start" not in several  # a line of its own repeats nothing before it
    assert names("def f(x):\n    y = x\n    |return y\n")[-2:] == ["fit_new_line_indent", "open_line_above"]
    ctx = context.build_context("a = 1\r\nb = \r\n", 11, "python")
    assert "normalize_newlines" in postprocess.inline_chain(post_context(ctx)).names


def test_the_state_says_which_rules_changed_the_text_and_a_drop_ends_the_chain():
    pc = post_context(ctx_for("x = foo(|)\n"))
    state = postprocess.inline_chain(pc).run("bar(1))", pc)
    assert state.text == "bar(1)" and state.trace == ["balance_brackets"]
    state = postprocess.inline_chain(pc).run("  \n", pc)
    assert state.text is None and state.trace == ["limit_scope", "trim_space_after_opener", "drop_blank"]
    pc = post_context(ctx_for("def f(x):\n    |\n    return y\n"))
    state = postprocess.inline_chain(pc).run("y = x + 1\n    return y", pc)
    assert state.text == "y = x + 1" and "remove_suffix_overlap" in state.trace


def test_the_rules_that_read_only_the_context():
    pc = post_context(ctx_for('bad = "\ufffd"\nx = |\n'))
    assert postprocess.drop_broken_characters("a\x00\ufffd", pc) == "a\ufffd"  # the user's own U+FFFD stays
    pc = post_context(ctx_for("x = |\n"))
    assert postprocess.drop_broken_characters("a\x00\ufffd", pc) == "a"
    pc = post_context(ctx_for("y = compute(x)\n|\nz = 2\n"))
    assert postprocess.drop_copy_of_line_above("y = compute(x)", pc) is None
    assert postprocess.drop_copy_of_line_below("z = 2", pc) is None
    assert postprocess.drop_copy_of_line_below("z=2", pc) == "z=2"  # not the same text
    assert postprocess.drop_copy_of_line_below("z = 2\n", pc) == "z = 2\n"  # only one-line fills
    pc = post_context(ctx_for("y = 1\n|\nzeta = 2\n"))
    assert postprocess.drop_copy_of_line_below("  zeta = 2", pc) is None
    pc = post_context(ctx_for("BUCK|ETS = (16, 32)\n"))
    assert postprocess.drop_start_of_what_follows("ETS", pc) is None
    assert postprocess.drop_start_of_what_follows("ET_SIZES", pc) == "ET_SIZES"
    assert (
        postprocess.drop_blank(" \n", pc) is None
        and postprocess.drop_repetitive("abababababababab", pc) is None
    )


@pytest.mark.parametrize(
    ("src", "lang", "fill", "kept"),
    [
        ("    return 2 * (|this.w + this.h);\n", "typescript", "this.h + this.h", False),  # this.hthis.w
        ("    return 2 * (|this.w + this.h);\n", "typescript", "2 * ", True),
        ("x = |foo(1)\n", "python", "not ", True),
        ("x = |foo(1)\n", "python", "self.", True),
        ("    return users.find(|u => u.id === id);\n", "typescript", "id, id", False),  # id(u) => ...
        ("    return users.find(|u => u.id === id);\n", "typescript", "(", False),  # leaves `(` open
        ("    return users.find(|u => u.id === id);\n", "typescript", "async ", True),
        ("total = compute(|, 2)\n", "python", "values", True),  # mends the line
    ],
)
def test_a_fill_before_code_on_its_line_must_not_spoil_it(src, lang, fill, kept):
    assert (postprocess.clean(fill, ctx_for(src, lang)) is not None) is kept


def test_the_hole_chain_trims_several_lines_and_drops_nothing_else():
    pc = post_context(ctx_for("def f(xs):\n    |\n"))
    chain = postprocess.hole_chain(pc)
    assert chain.names == [
        "limit_scope",
        "cut_loop",
        "cut_to_parsing_lines",
        "normalize_newlines",
        "drop_blank",
    ]
    assert chain.run("x = 1\n    y = 2\n    y = 2", pc).text == "x = 1\n    y = 2"
    assert chain.run("\n  ", pc).text is None


def test_a_several_line_fill_keeps_its_block_at_an_access_specifier_and_a_preprocessor_line():
    ctx = ctx_for("class A {|\n  void g();\n};\n", "cpp")
    raw = "\n public:\n  A();\n#if DEBUG\n  void dump();\n#endif\n  int n;\n};\nint x;"
    assert postprocess.clean(raw, ctx) == "\n public:\n  A();\n#if DEBUG\n  void dump();\n#endif\n  int n;"


def test_an_inner_blocks_closer_is_not_taken_for_the_suffixs():
    ctx = ctx_for("fn f(v: &[u8]) {\n    for x in v {|\n    }\n}\n", "rust")
    raw = "\n        if *x > 0 {\n            g(x);\n        }"
    assert postprocess.clean(raw, ctx) == raw
    # the suffix's own closer at its indentation is still dropped
    assert postprocess.clean("\n        g(x);\n    }", ctx) == "\n        g(x);"


def test_a_several_line_fill_does_not_write_the_line_above_again():
    # a new user's trial: *Complete the function body* after `rows.append(row)` wrote it once more
    src = "def load(rows, items):\n    for row in items:\n        rows.append(row)\n        |\n    return rows\n"
    ctx = ctx_for(src)
    assert ctx.mode != "line"
    assert postprocess.clean("rows.append(row)\n        n += 1", ctx) == "n += 1"
    assert postprocess.clean("rows.append(row)\n        rows.append(row)", ctx) is None
    assert postprocess.clean("print(row)", ctx) == "print(row)"  # anything else stays


def test_a_line_with_nothing_typed_before_it_is_indented_only_where_a_block_opens():
    ctx, _, _ = single("|\n")  # an empty file
    assert postprocess.clean("        self.x = 1", ctx) == "self.x = 1"
    ctx, _, _ = single("x = 1\n|\n")
    assert postprocess.clean("    y = 2", ctx) == "y = 2"
    ctx, _, _ = single("def f():\n|\n")
    assert postprocess.clean("    return 1", ctx) == "    return 1"


def test_a_placeholders_brace_is_not_written_twice():
    ctx, _, _ = single('def greet(name):\n    print(f"Hello, {|}")\n')
    assert postprocess.clean("name}", ctx) == "name"
    ctx, _, _ = single("function greet(name) {\n  console.log(`Hello, ${|}`);\n}\n", "javascript")
    assert postprocess.clean("name}", ctx) == "name"


def test_a_fill_that_breaks_the_brackets_after_it_on_its_line_is_dropped():
    ctx, _, _ = single("const total = xs.reduce((acc, x) => |, 0);\n", "typescript")
    assert not postprocess.clean("{", ctx)
    assert postprocess.clean("acc + x", ctx) == "acc + x"


def test_a_fill_may_not_take_the_closer_its_lines_own_bracket_needs():
    ctx, _, _ = single("const top = Math.max(|);\n", "typescript")
    assert not postprocess.clean("a, f(", ctx)  # `max(` would lose its `)`
    assert postprocess.clean("a, b", ctx) == "a, b"
    ctx, _, _ = single("expect(|);\n", "typescript")
    assert postprocess.clean("n).toBe(1", ctx) == "n).toBe(1"  # it closes `expect(` and reopens `toBe(`


def test_a_block_header_at_a_lines_end_is_left_open():
    ctx, _, _ = single("func f(x int) {\n\tfor {\n\t\t|\n\t}\n}\n", "go")
    assert postprocess.clean("if x == 0 {", ctx) == "if x == 0 {"
    ctx, _, _ = single("x = |\n")
    assert postprocess.clean("foo(1, 2", ctx) == "foo(1, 2)"  # a call is still closed


def test_a_fill_after_an_opener_starts_without_the_models_indentation():
    ctx, _, _ = single("fn f() {\n    let v = vec![|];\n}\n", "rust")
    assert postprocess.clean("  1, 2, 3", ctx) == "1, 2, 3"
    ctx, _, _ = single("func f() *User {\n\treturn &User{|}\n}\n", "go")
    assert postprocess.clean("\tID: 1", ctx) == " ID: 1"


def test_a_fill_that_leaves_a_slot_broken_is_dropped_though_the_empty_slot_is_an_error():
    ctx, _, _ = single("const add = (a: number, b: number): number => |;\n", "typescript")
    assert not postprocess.clean("{", ctx)  # `=> {;`: the block would take the line's `;`
    assert postprocess.clean("a + b", ctx) == "a + b"
    ctx, _, _ = single('console.log("a " + |);\n', "javascript")
    assert not postprocess.clean('msg + " "b " + msg + " +', ctx)
    assert postprocess.clean("msg", ctx) == "msg"


def test_a_fill_between_operands_does_not_write_their_operators_again():
    ctx, _, _ = single('const id = "item-" + | + "-end";\n', "javascript")
    assert postprocess.clean('+ "-" +', ctx) == '"-"'
    assert postprocess.clean("n", ctx) == "n"
    ctx, _, _ = single("y = x - |\n")
    assert postprocess.clean("-1", ctx) == "-1"  # a unary minus is not a repeat


def test_a_fill_that_is_the_end_of_its_line_again_is_dropped():
    ctx, _, _ = single('const id = "item-" + | + "-end";\n', "javascript")
    assert not postprocess.clean('"-end";', ctx)
    assert not postprocess.clean('+ "-end";', ctx)
    assert postprocess.clean("n", ctx) == "n"
