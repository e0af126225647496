"""Unit tests of server/holes.py: holes found in the syntax tree."""

from __future__ import annotations

from dfim.server import holes, languages


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
