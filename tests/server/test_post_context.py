"""Unit tests of server/post_context.py: what post-processing reads around a fill, worked out once."""

from __future__ import annotations

from dfim.server import post_context
from tests.server.helpers import ctx_for


def test_brackets_open_before_the_fill_and_those_the_suffix_closes():
    pc = post_context.post_context(ctx_for("y = g(a, [|])\n"))
    assert pc.outer == ("(", "[") and pc.may_close == 0  # the suffix closes both
    pc = post_context.post_context(ctx_for("y = g(a, [|\n"))
    assert pc.outer == ("(", "[") and pc.may_close == 2
    pc = post_context.post_context(ctx_for("s = '(' + f(|\n"))  # a bracket in a string opens nothing
    assert pc.outer == ("(",)


def test_brackets_in_comments_and_docstrings_below_close_nothing():
    src = 'class C:\n    def f(self, n|\n        """All rows at once (one pass)."""\n'
    assert post_context.post_context(ctx_for(src)).may_close == 1  # the fill closes the signature itself
    src = 'class C:\n    def f(self, n|\n        """All rows\n        at once)."""\n'
    assert post_context.post_context(ctx_for(src)).may_close == 1
    src = "total = f(a,|\n    # b (and c)\n    d)\n"
    assert post_context.post_context(ctx_for(src)).may_close == 0  # the code below closes it


def test_the_lines_around_the_cursor():
    pc = post_context.post_context(ctx_for("def f(a):\n    if a:  # positive\n\n    |\n    return a\n"))
    assert pc.line_above == "    if a:  # positive" and pc.line_above_opens
    assert pc.repeat_above == "if a:  # positive"  # the cursor's line is blank
    assert pc.following == "    return a" and pc.before_on_line == "    "
    pc = post_context.post_context(ctx_for("x = 1\ny = |\n"))
    assert pc.line_above == "x = 1" and not pc.line_above_opens
    assert pc.repeat_above == ""  # code before the cursor on its line
    assert pc.ends_line and not pc.in_word
    pc = post_context.post_context(ctx_for("BUCK|ETS = 1\n"))
    assert pc.in_word and not pc.ends_line


def test_whether_the_lines_below_are_deeper_than_the_fills_line():
    assert post_context.post_context(ctx_for("def f(a|\n    return a\n")).body_follows
    assert post_context.post_context(ctx_for("\tif (x|\n\t\ty();\n", "c")).body_follows
    assert not post_context.post_context(ctx_for("x = f(|\ny = 2\n")).body_follows
    assert not post_context.post_context(ctx_for("def f():\n    x = f(|\n\n")).body_follows  # nothing below


def test_syntax_errors_are_counted_once_per_fill():
    pc = post_context.post_context(ctx_for("def f(x):\n    return |\n"))
    assert pc.errors("x + 1") == 0 and pc.errors("x +* 1") > 0
    assert pc.errors.cache_info().misses == 2
    pc.errors("x + 1")
    assert pc.errors.cache_info().hits == 1


def test_the_parse_window_starts_at_a_top_level_line_and_ends_at_a_line_end():
    prefix = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(400)) + "def g(xs):\n    "
    suffix = "\n    return xs\n" + "x = 1\n" * 1000
    before, after = post_context.parse_window(prefix, suffix, before=4000, after=2000)
    assert prefix.endswith(before) and before.startswith("def f") and len(before) <= 4000
    assert suffix.startswith(after) and after.endswith("x = 1") and 2000 <= len(after) <= 2010
    assert post_context.parse_window("x = 1\n", "y\n") == ("x = 1\n", "y\n")  # short text stays whole
