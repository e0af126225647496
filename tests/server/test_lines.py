"""Unit tests of server/lines.py: bracket scanning."""

from __future__ import annotations

from dfim.server import lines


def test_open_brackets():
    assert lines.open_brackets("x = foo(a, [1, 2") == ["(", "["]
    assert lines.open_brackets("s = '(' + f(") == ["("]
