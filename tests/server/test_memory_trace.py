"""server/memory_trace.py: the soak's diagnostic names the line whose live memory grew."""

from __future__ import annotations

import tracemalloc

from dfim.server.memory_trace import growth_lines, start_if_asked


def test_growth_lines_name_the_growing_site(monkeypatch):
    monkeypatch.delenv("DFIM_TRACE_MEMORY", raising=False)
    assert start_if_asked() is False  # off by default: no tracing cost
    tracemalloc.start(1)
    try:
        before = tracemalloc.take_snapshot()
        kept = [bytearray(10_000) for _ in range(200)]  # about 2 MB, live at the second snapshot
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    top = growth_lines(before, after, 3)
    assert "test_memory_trace.py" in top[0] and float(top[0].split()[0]) > 1.9
    assert len(kept) == 200
