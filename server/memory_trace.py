"""Where the server's Python memory grows, for the soak (`DFIM_TRACE_MEMORY=FILE python scripts/soak.py`).

Off unless the server process has `DFIM_TRACE_MEMORY=FILE`: then tracemalloc records allocations (with
10 frames, which slows the server down) and a daemon thread writes, every `interval` seconds, the
allocation sites whose live memory grew most since a baseline taken after `warmup` seconds (model load,
first fills and compiled kernels are over by then). If the RSS grows and these lines do not, the growth
is outside Python's allocator (torch's buffers, the C allocator's arenas).
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

ENV = "DFIM_TRACE_MEMORY"


def start_if_asked(warmup: float = 120.0, interval: float = 60.0, top: int = 25) -> bool:
    """Start tracing when `DFIM_TRACE_MEMORY` names a file; True if it did."""
    path = os.environ.get(ENV)
    if not path:
        return False
    tracemalloc.start(10)
    thread = threading.Thread(
        target=_report, args=(Path(path), warmup, interval, top), name="dfim-memory-trace", daemon=True
    )
    thread.start()
    return True


def growth_lines(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int) -> list[str]:
    """The `top` allocation sites (innermost frame) by growth of live bytes from `before` to `after`."""
    stats = after.compare_to(before, "lineno")
    stats.sort(key=lambda s: s.size_diff, reverse=True)
    return [
        f"{s.size_diff / 1e6:+9.3f} MB {s.count_diff:+8d} blocks  {s.traceback[0].filename}:{s.traceback[0].lineno}"
        for s in stats[:top]
    ]


def _report(path: Path, warmup: float, interval: float, top: int) -> None:
    time.sleep(warmup)
    baseline = tracemalloc.take_snapshot()
    started = time.monotonic()
    while True:
        time.sleep(interval)
        now = tracemalloc.take_snapshot()
        current, _peak = tracemalloc.get_traced_memory()
        lines = growth_lines(baseline, now, top)
        header = (
            f"{time.monotonic() - started:.0f} s after the baseline; traced {current / 1e6:.1f} MB; "
            f"growth by site:\n"
        )
        with path.open("a", encoding="utf-8") as out:
            out.write(header + "\n".join(lines) + "\n\n")
