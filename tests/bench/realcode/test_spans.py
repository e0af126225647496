"""dfim.bench.realcode.spans on fixtures/realcode/project: spans of every kind, with their exact text."""

from __future__ import annotations

from pathlib import Path

from dfim.bench.realcode.spans import find_spans

PROJECT = Path(__file__).resolve().parents[3] / "fixtures" / "realcode" / "project"


def test_spans_of_every_kind_with_exact_text():
    text = (PROJECT / "textkit" / "stats.py").read_text()
    data = text.encode()
    spans = find_spans(text)
    texts = {(s.kind, data[s.start : s.end].decode()) for s in spans}
    assert ("line", "    middle = n // 2\n") in texts
    assert ("condition", "n % 2 == 1") in texts
    assert ("call", "max(low, min(value, high))") in texts
    assert any(k == "block" and t.startswith("    ordered = sorted(values)\n") for k, t in texts)
    assert not any("Small statistics" in t for _, t in texts)  # module docstring: not inside a function
