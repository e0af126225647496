"""Where the server's Python memory grows, for the soak (`DFIM_TRACE_MEMORY=FILE python scripts/soak.py`).

Off unless the server process has `DFIM_TRACE_MEMORY=FILE`: then tracemalloc records allocations (with
10 frames, which slows the server down) and a daemon thread writes, every `interval` seconds, the
allocation sites whose live memory grew most since a baseline taken after `warmup` seconds (model load,
first fills and compiled kernels are over by then). If the RSS grows and these lines do not, the growth
is outside Python's allocator (torch's buffers, the C allocator's arenas): each report also counts the live
torch tensors by shape, whose storage tracemalloc does not see, and the object types that grew.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import tracemalloc
from pathlib import Path

ENV = "DFIM_TRACE_MEMORY"


def start_if_asked(warmup: float | None = None, interval: float = 60.0, top: int = 25) -> bool:
    """Start tracing when `DFIM_TRACE_MEMORY` names a file; True if it did. The baseline is taken after
    `warmup` seconds (`DFIM_TRACE_MEMORY_WARMUP`, default 120)."""
    path = os.environ.get(ENV)
    if not path:
        return False
    if warmup is None:
        try:
            warmup = float(os.environ.get(ENV + "_WARMUP", "120"))
        except ValueError:
            warmup = 120.0
    # tracemalloc with 10 frames slows a busy server several times over (a soak then measures its backlog);
    # DFIM_TRACE_MEMORY_TRACEMALLOC=0 keeps only the census of live objects, which costs a pause a report.
    if os.environ.get(ENV + "_TRACEMALLOC", "1") != "0":
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


def traceback_lines(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, top: int, frames: int = 6):
    """The `top` growing allocation sites again, each with the `frames` innermost frames of its traceback."""
    stats = after.compare_to(before, "traceback")
    stats.sort(key=lambda s: s.size_diff, reverse=True)
    out = []
    for s in stats[:top]:
        out.append(f"{s.size_diff / 1e6:+9.3f} MB {s.count_diff:+8d} blocks")
        out.extend(f"      {f.filename}:{f.lineno}" for f in list(s.traceback)[:frames])
    return out


def live_objects() -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """(count of live gc-tracked objects by type name, torch tensors by "shape dtype": (count, bytes)).
    Tensors are counted by their own size, views included (a view's storage is its base's)."""
    import torch

    by_type: dict[str, int] = {}
    tensors: dict[str, tuple[int, int]] = {}
    for obj in gc.get_objects():
        name = type(obj).__name__
        by_type[name] = by_type.get(name, 0) + 1
        if issubclass(type(obj), torch.Tensor):  # type(): no __class__ lookup
            try:
                key = f"{tuple(obj.shape)} {str(obj.dtype).removeprefix('torch.')}"
                count, size = tensors.get(key, (0, 0))
                tensors[key] = (count + 1, size + obj.numel() * obj.element_size())
            except Exception:  # a tensor subclass or a meta tensor: skip it
                continue
    return by_type, tensors


def object_growth_lines(before: tuple, after: tuple, top: int) -> list[str]:
    """The object types and tensor shapes whose live count grew most from `before` to `after`
    (both from `live_objects`)."""
    (types_before, tensors_before), (types_after, tensors_after) = before, after
    grown = sorted(
        ((n - types_before.get(name, 0), name, n) for name, n in types_after.items()), reverse=True
    )[:top]
    lines = [f"  objects {name}: {n:,} ({d:+,})" for d, name, n in grown if d > 0]
    total_before = sum(b for _, b in tensors_before.values())
    total_after = sum(b for _, b in tensors_after.values())
    lines.append(
        f"  tensors: {sum(c for c, _ in tensors_after.values()):,} live, {total_after / 1e6:.1f} MB "
        f"({(total_after - total_before) / 1e6:+.1f} MB)"
    )
    by_growth = sorted(
        ((b - tensors_before.get(k, (0, 0))[1], k, c, b) for k, (c, b) in tensors_after.items()), reverse=True
    )[:top]
    lines.extend(
        f"  tensor {k}: {c:,} live, {b / 1e6:.1f} MB ({d / 1e6:+.1f} MB)" for d, k, c, b in by_growth if d > 0
    )
    return lines


def _report(path: Path, warmup: float, interval: float, top: int) -> None:
    from dfim.server.engine_host import heap_usage

    time.sleep(warmup)
    traced = tracemalloc.is_tracing()
    baseline = tracemalloc.take_snapshot() if traced else None
    objects = live_objects()
    started = time.monotonic()
    while True:
        time.sleep(interval)
        lines = [f"{time.monotonic() - started:.0f} s after the baseline; C heap {heap_usage()}"]
        if baseline is not None:
            now = tracemalloc.take_snapshot()
            current, _peak = tracemalloc.get_traced_memory()
            lines.append(f"traced {current / 1e6:.1f} MB; growth by site:")
            lines += growth_lines(baseline, now, top)
            lines += ["tracebacks of the top sites:", *traceback_lines(baseline, now, 5)]
        lines += ["live objects against the baseline:", *object_growth_lines(objects, live_objects(), 12)]
        with path.open("a", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n\n")
