"""Actions asked for code never answer with a comment or a docstring alone (issue 31, must-have 5)."""

from __future__ import annotations

import pytest

from dfim.engine.api import FillResult
from dfim.server.actions import NO_CODE, ActionError, finish_action, plan_action
from dfim.server.code_actions import finish_with_the_first_usable
from dfim.server.rules import writes_code

BODY = "def mean(xs):\n    pass\n"


@pytest.mark.parametrize(
    ("text", "lang", "expected"),
    [
        ("# compute the mean\n", "python", False),
        ('"""Return the mean."""\n', "python", False),
        ('"""Return the mean.\n\n    Args: xs\n', "python", False),  # a docstring the canvas cut open
        ('"just a string"', "python", False),
        ("// TODO\n/* long\n comment */\n", "go", False),
        ("return sum(xs) / len(xs)\n", "python", True),
        ('"""Doc."""\nreturn 1\n', "python", True),
        ('x = "#not a comment"', "python", True),
        ("return x + 1; // done\n", "java", True),
    ],
)
def test_writes_code(text: str, lang: str, expected: bool) -> None:
    assert writes_code(text, lang) is expected


def result(text: str, *alternatives: str) -> FillResult:
    return FillResult(
        text=text,
        steps=1,
        canvas_length=32,
        tokens=8,
        encoded_tokens=0,
        context_tokens=10,
        latency_ms=1.0,
        stop_reason="stable",
        alternatives=list(alternatives),
    )


@pytest.mark.parametrize("action", ["fillHole", "completeFunction"])
def test_a_comment_alone_is_refused_where_code_was_asked_for(action: str) -> None:
    cursor = BODY.index("pass") if action == "fillHole" else BODY.index("pass") + 2
    plan = plan_action(action, BODY, "python", cursor, cursor)
    with pytest.raises(ActionError, match="only comments or a docstring"):
        finish_action(plan, "# return the mean of xs\n")
    with pytest.raises(ActionError, match="only comments or a docstring"):
        finish_action(plan, '"""Return the mean of xs."""\n')
    assert NO_CODE.startswith("the model wrote only")


def test_the_next_candidate_with_code_is_taken() -> None:
    cursor = BODY.index("pass")
    plan = plan_action("fillHole", BODY, "python", cursor, cursor)
    edits = finish_with_the_first_usable(
        plan, result('"""Mean."""', "# the mean", "return sum(xs) / len(xs)")
    )
    ((start, end, new),) = edits
    assert BODY[:start] + new + BODY[end:] == "def mean(xs):\n    return sum(xs) / len(xs)\n"
    with pytest.raises(ActionError, match="only comments"):  # none usable: the first choice's reason
        finish_with_the_first_usable(plan, result("# the mean", "# mean again"))


def test_a_rewrite_of_code_into_a_comment_is_refused_but_a_comment_may_be_rewritten() -> None:
    text = "def f(x):\n    return x * 2\n"
    start, end = text.index("return"), len(text) - 1
    plan = plan_action("rewriteSelection", text, "python", start, end)
    with pytest.raises(ActionError, match="only comments"):
        finish_action(plan, "# double x")
    comment = "# a note\nx = 1\n"
    plan = plan_action("rewriteSelection", comment, "python", 0, comment.index("\n"))
    assert finish_action(plan, "# a better note") == [(0, comment.index("\n"), "# a better note")]
