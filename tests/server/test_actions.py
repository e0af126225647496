"""Unit tests of server/actions.py: the code-action planners and how their fills are applied."""

from __future__ import annotations

import pytest

from dfim.engine.api import Hole, TokenScore
from dfim.server import actions
from tests.server.helpers import split


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


def test_complete_function_after_a_braceless_if_writes_its_statement_one_level_deeper():
    text = "int f(int x) {\n  if (x > 0)\n}\n"
    at = text.index("(x > 0)") + len("(x > 0)")
    plan = actions.plan_action("completeFunction", text, "c", at, at)
    assert plan.lead == "\n    "
    ((s, e, new),) = actions.finish_action(plan, "return x;\n  return -x;")
    assert text[:s] + new + text[e:] == "int f(int x) {\n  if (x > 0)\n    return x;\n  return -x;\n}\n"


def test_complete_function_reads_the_body_indent_below_a_brace_on_its_own_line():
    """`where` clauses put a Rust function's `{` on a line of its own: the body is still one level in, and
    a struct literal's closing `}` there is the body's line, not the end of the fill's scope."""
    text = "fn f<I>(iter: I) -> W<I>\nwhere I: Iterator,\n{\n    W {\n        iter,\n}\n"
    at = text.index("iter,\n") + len("iter,")
    plan = actions.plan_action("completeFunction", text, "rust", at, at)
    ((s, e, new),) = actions.finish_action(plan, "n: 0,\n    }")
    assert text[:s] + new + text[e:] == text.replace("iter,\n", "iter,\n        n: 0,\n    }\n")


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


def test_too_long_says_what_the_planner_would_refuse():
    """The code action handler shows an action as disabled where its planner would refuse the selection
    as too long: the two must agree, at every size around the canvas's edge."""
    from dfim.server.windows import guess_tokens

    def refused(name: str, text: str, start: int, end: int) -> bool:
        try:
            actions.plan_action(name, text, "python", start, end, max_canvas=128, count_tokens=guess_tokens)
        except actions.ActionError as exc:
            return "too long" in str(exc)
        return False

    for lines in range(1, 30, 2):
        body = "".join(f"    v{i} = xs[{i}] * {i}\n" for i in range(lines))
        text = "def f(xs):\n" + body
        start = text.index("    v0")
        for name in ("rewriteSelection", "regenerateUnsure"):
            why = actions.too_long(name, text, "python", start, len(text), 128, guess_tokens)
            assert (why is not None) == refused(name, text, start, len(text)), (name, lines, why)
        holes = "".join(f"def f{i}(x):\n    v = {i}\n    pass\n\n" for i in range(lines))
        why = actions.too_long("fillSelectionHoles", holes, "python", 0, len(holes), 128, guess_tokens)
        assert (why is not None) == refused("fillSelectionHoles", holes, 0, len(holes)), (lines, why)
    # an action that takes no selection is never too long
    assert actions.too_long("fillHole", text, "python", 0, len(text), 128, guess_tokens) is None
    huge = "x = 1\n" * 100_000  # refused without tokenizing it
    assert "too long" in actions.too_long("rewriteSelection", huge, "python", 0, len(huge), 128, len)


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


def test_complete_function_goes_on_past_the_cursors_block_to_the_end_of_the_body():
    # at the end of a line that opens a block, and on a blank line inside one: the rest of the function
    # (the block's closer and the statements after it) is kept, not cut at the block's end
    text = "func f(x int) int {\n\tif x > 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}\n"
    cursor = text.index("{\n\t\treturn") + 1
    doc = text[:cursor] + text[text.index("\n}\n") :]
    want = text
    assert complete_function(doc, cursor, "go", "return 1\n\t}\n\treturn 0") == want
    doc = "int f(int x) {\n  if (x > 0) {\n    g();\n    \n}\n"
    cursor = doc.index("    \n") + 4
    got = complete_function(doc, cursor, "c", "h();\n  }\n  return 0;")
    assert got == "int f(int x) {\n  if (x > 0) {\n    g();\n    h();\n  }\n  return 0;\n}\n"


def test_fill_hole_of_empty_braces_after_a_several_line_header_closes_at_the_headers_indentation():
    text = "void Env::Init() {\n  init_ = true;\n}\n\nbool Env::Exists(\n    const std::string& name) {}\n"
    cursor = text.index("{}") + 1
    plan = actions.plan_action("fillHole", text, "cpp", cursor, cursor)
    ((s, e, new),) = actions.finish_action(plan, "return true;")
    assert text[:s] + new + text[e:] == text.replace("{}", "{\n  return true;\n}")


@pytest.mark.parametrize(
    "doc, lang, fill, want",
    [
        (
            "func f(x int) int {\n\tif x > 0 {\n\t\treturn 1\n}\n",
            "go",
            "}\n\treturn 0",
            "func f(x int) int {\n\tif x > 0 {\n\t\treturn 1\n\t}\n\treturn 0\n}\n",
        ),
        (
            "int f(int x) {\n  if (x > 0 &&\n      x < 9) {\n    return 1;\n}\n",
            "c",
            "}\n  return 0;",
            "int f(int x) {\n  if (x > 0 &&\n      x < 9) {\n    return 1;\n  }\n  return 0;\n}\n",
        ),
    ],
)
def test_complete_function_puts_a_closer_it_starts_with_under_its_opener(doc, lang, fill, want):
    # at the end of a block's last line the lead types that line's indentation; a fill that closes the
    # block first puts its `}` where the block's statement starts, not one level in
    cursor = doc.index("return 1") + len("return 1" + (";" if lang == "c" else ""))
    assert complete_function(doc, cursor, lang, fill) == want


def test_complete_function_is_offered_inside_blocks_not_closed_yet():
    # typed without an editor that closes brackets: the `if` block is still open and the function's `}`
    # below closes it for the parser, so tree-sitter finds no function; with the blocks closed at the
    # cursor it does, and the fill's lines go at the cursor, the document's text after it untouched
    doc = "fn f(v: &[u8]) -> u8 {\n    if v.len() > 1 {\n        let a = v[0];\n        \n}\n\nfn g() {}\n"
    cursor = doc.index("        \n}") + 8
    assert "completeFunction" in actions.available_actions(doc, "rust", cursor, cursor)
    got = complete_function(doc, cursor, "rust", "return a;\n    }\n    0")
    assert got == doc.replace("        \n}", "        return a;\n    }\n    0\n}")
    # a balanced file with an error elsewhere offers nothing at the top level
    doc = "fn g() {}\n\nlet x = ;\n"
    assert "completeFunction" not in actions.available_actions(doc, "rust", len(doc) - 1, len(doc) - 1)


def test_complete_function_in_python_inside_an_open_call_and_after_a_dict_literal():
    doc = "def f(xs):\n    total = sum(\n        \n\n\ndef g():\n    pass\n"
    cursor = doc.index("        \n") + 8
    assert "completeFunction" in actions.available_actions(doc, "python", cursor, cursor)
    got = complete_function(doc, cursor, "python", "xs)\n    return total")
    assert got == doc.replace("        \n", "        xs)\n    return total\n", 1)
    # a body whose last line ends with `}` (a dict literal) is no brace body: the new lines go below it
    doc = "def f():\n    d = {}\n"
    cursor = doc.index("{}") + 2
    assert complete_function(doc, cursor, "python", "return d") == "def f():\n    d = {}\n    return d\n"


def test_what_tree_sitter_tolerates_is_still_refused():
    # a new user's second trial: Python's own parser, a rewrite's brackets, and a half-typed line elsewhere
    text = "def load(path):\n    lines = read(path)\n    if lines:\n        return lines\n    return []\n"
    start = text.index("    if")
    plan = actions.plan_action("rewriteSelection", text, "python", start, text.index("    return []"))
    with pytest.raises(actions.ActionError, match="does not parse"):  # an unindented block
        actions.finish_action(plan, "    if lines:\n    return lines\n")
    text = "def f(x):\n    pass\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    with pytest.raises(actions.ActionError, match="does not parse"):  # an unexpected indent
        actions.finish_action(plan, "def f(x):\n    y = x\n     return y\n")
    go = "package main\n\nfunc main() {\n\tfmt.Println(1)\n}\n\nfunc g() {}\n"
    plan = actions.plan_action("rewriteSelection", go, "go", go.index("func main"), go.index("\nfunc g"))
    with pytest.raises(actions.ActionError, match="does not parse"):  # the function's `}` dropped
        actions.finish_action(plan, "func main() {\n\tfmt.Println(2)\n")
    c = "int f(int x) {\n    return x;\n}\n\nint main() {\n    f(1\n}\n"  # `f(1` half-typed below
    plan = actions.plan_action("rewriteSelection", c, "c", 0, c.index("\n\nint main"))
    with pytest.raises(actions.ActionError, match="does not parse"):
        actions.finish_action(plan, "int f(int x) {\n    int n = = 0;\n    return x;\n}")


def test_the_bracket_check_reads_brackets_as_the_language_does():
    # a review: `//`, a docstring, a block comment and a Rust attribute hid or made brackets to a text scan
    cases = [  # (language, document, the selection, its rewrite)
        ("python", "def f(a, b, c):\n    y = a // (b +\n         c)\n    return y\n",
         "    y = a // (b +\n         c)\n", "    y = a // (b + c)\n"),
        ("python", 'def f():\n    """Do it (see\n    below)."""\n    return 1\n',
         '    """Do it (see\n    below)."""\n', '    """Do it."""\n'),
        ("c", "int f(void) {\n    /* (old\n    */ return 1;\n}\n", "    /* (old\n    */ return 1;\n", "    return 1;\n"),
        ("rust", "#[cfg(any(\n    unix,\n    windows))]\nfn f() {}\n", "#[cfg(any(\n    unix,\n    windows))]\n",
         "#[cfg(any(unix, windows))]\n"),
    ]  # fmt: skip
    for lang, text, selected, rewrite in cases:
        start = text.index(selected)
        plan = actions.plan_action("rewriteSelection", text, lang, start, start + len(selected))
        assert actions.finish_action(plan, rewrite), (lang, rewrite)


def test_a_lone_surrogate_in_a_broken_document_does_not_crash_an_action():
    text = "def f():\n    s = '\ud83d'\n    t = (\n    return s + 1\n"
    start = text.index("return s + 1")
    plan = actions.plan_action("rewriteSelection", text, "python", start, start + 12)
    try:
        actions.finish_action(plan, "return s + 2")
    except actions.ActionError:
        pass  # refusing is fine; an exception of another kind is not


def test_fills_that_break_code_that_parsed_are_refused():
    # a new user's trial: `..` for a `pass`, and an `else:` with no `if` at a function body's level
    text = "def area(w, h):\n    pass\n\nprint(area(2, 3))\n"
    at = text.index("pass")
    for action in ("fillHole", "completeFunction"):
        plan = actions.plan_action(action, text, "python", at, at)
        with pytest.raises(actions.ActionError, match="does not parse here"):
            actions.finish_action(plan, "..")
        ((s, e, new),) = actions.finish_action(plan, "return w * h")
        assert "return w * h" in text[:s] + new + text[e:]
    text = "def f(x):\n    pass\n\ndef g():\n    ...\n"
    plan = actions.plan_action("fillSelectionHoles", text, "python", 0, len(text))
    with pytest.raises(actions.ActionError, match="does not parse here"):
        actions.finish_action(plan, "def f(x):\n    return x\n\ndef g():\n    else:\n")
    assert actions.finish_action(plan, "def f(x):\n    return x\n\ndef g():\n    return 2\n")


def test_a_rewrite_that_changes_nothing_says_so():
    text = "def mul(a, b):\n    return a * b\n"
    plan = actions.plan_action("rewriteSelection", text, "python", 0, len(text))
    with pytest.raises(actions.NothingToChange, match="as it was"):
        actions.finish_action(plan, text)


def test_a_rewrite_keeps_the_names_of_the_functions_it_holds():
    # a new user's trial: two functions selected, the second came back as `def div(a, b)`
    text = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\nprint(add(1, 2), mul(3, 4))\n"
    end = text.index("print")
    for action in ("rewriteSelection", "regenerateUnsure"):
        plan = actions.plan_action(action, text, "python", 0, end)
        renamed = "def add(a, b):\n    return a + b\n\ndef div(a, b):\n    return a / b\n\n"
        with pytest.raises(actions.ActionError, match="renames or drops mul"):
            actions.finish_action(plan, renamed)
        kept = "def add(a, b):\n    return b + a\n\ndef mul(a, b):\n    return b * a\n\n"
        ((s, e, new),) = actions.finish_action(plan, kept)
        assert text[:s] + new + text[e:] == kept + "print(add(1, 2), mul(3, 4))\n"
    # in Rust too; an added helper is fine
    text = "fn cube(x: i32) -> i32 {\n    x * x * x\n}\n"
    plan = actions.plan_action("rewriteSelection", text, "rust", 0, len(text))
    with pytest.raises(actions.ActionError, match="renames or drops cube"):
        actions.finish_action(plan, "fn walk(x: i32) -> i32 {\n    x * x * x\n}\n")
    assert actions.finish_action(
        plan, "fn sq(x: i32) -> i32 {\n    x * x\n}\n\nfn cube(x: i32) -> i32 {\n    sq(x) * x\n}\n"
    )


def test_a_rewrite_that_breaks_code_that_parsed_is_refused():
    text = "def stddev(values):\n    m = sum(values) / len(values)\n    return m\n"
    start = text.index("    m =")
    plan = actions.plan_action("rewriteSelection", text, "python", start, len(text))
    with pytest.raises(actions.ActionError, match="does not parse"):
        actions.finish_action(plan, "    m = mean(values)\n}\n    return m\n")  # a stray brace
    ((s, e, new),) = actions.finish_action(plan, "    return sum(values) / len(values)\n")
    assert text[:s] + new + text[e:] == "def stddev(values):\n    return sum(values) / len(values)\n"
    # broken already (a half-typed line elsewhere, the normal state while editing): a rewrite is judged by
    # whether it adds errors, so the check still holds
    broken = "def f(:\n    x = 1\n"
    plan = actions.plan_action("rewriteSelection", broken, "python", broken.index("    x"), len(broken))
    assert actions.finish_action(plan, "    x = 2\n")
    with pytest.raises(actions.ActionError, match="does not parse"):
        actions.finish_action(plan, "    x = (\n")
