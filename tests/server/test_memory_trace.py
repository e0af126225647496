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


def test_object_growth_names_the_tensors_that_stay_alive():
    import torch

    from dfim.server.memory_trace import live_objects, object_growth_lines

    before = live_objects()
    kept = [torch.zeros(123, 457) for _ in range(20)]  # 20 x 225 kB: a shape nothing else has
    lines = object_growth_lines(before, live_objects(), 12)
    assert any(line.startswith("  tensor (123, 457) float32: 20 live") for line in lines), lines
    assert any("objects Tensor" in line and "(+20)" in line for line in lines), lines
    assert len(kept) == 20
