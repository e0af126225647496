"""CPU threads for inference: one core fewer than this process may use, and every core while nothing else
runs on the machine.

Why not always all cores: a decoder step is ~1,000 small ops on 16-64-row tensors; only the matrix
products split across threads, and every split waits at a barrier for all threads. While other processes
(the editor, a build, other sessions) keep the cores busy, a descheduled thread stalls each barrier: on
the shared 2-core dev machine, fills with 2 threads had a p95 of 10.7 s against 1.2 s with 1 thread
(docs/benchmarks.md, CPU section; docs/decisions.md 16).

Why not always one: on a quiet machine a second thread makes a 512-token context encode 1.7x faster
(395 -> 233 ms here) and a step ~1.25x faster, and a cold fill (a new document, a jump elsewhere) is
mostly that encode. So `AdaptiveThreads` looks, before each fill, at how much CPU the *other* processes
used since the previous one (Linux `/proc/stat` minus this process's own time) and takes every core only
when they left them idle (decision 27).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

# torch's own thread count, read before any caller could set one: `limit_threads` leaves a count that a
# caller chose with torch.set_num_threads alone (when it differs from torch's default).
_TORCH_DEFAULT_THREADS = torch.get_num_threads()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def limit_threads(threads: int | None = None) -> bool:
    """Set torch's intra-op thread count for CPU inference: `threads` if given, else $DFIM_THREADS, else
    what the caller chose (torch.set_num_threads, $OMP_NUM_THREADS), else one core fewer than this
    process may use (at least 1, at most torch's default).

    Returns True when the count is this policy's own choice (nobody fixed one): only then may
    `AdaptiveThreads` raise it for a fill."""
    if threads is None and os.environ.get("DFIM_THREADS", "").strip():
        threads = int(os.environ["DFIM_THREADS"])
    if threads is not None:
        torch.set_num_threads(max(1, threads))
        return False
    if "OMP_NUM_THREADS" in os.environ or torch.get_num_threads() != _TORCH_DEFAULT_THREADS:
        return False
    torch.set_num_threads(max(1, min(torch.get_num_threads(), usable_cores() - 1)))
    return True


def busy_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU time the whole machine spent not idle since boot (all cores, seconds); None where there is no
    /proc/stat (macOS) or it cannot be read."""
    try:
        with open(stat, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 5:
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


class AdaptiveThreads:
    """Threads for the next fill: `wide` while the other processes on this machine used less than
    `quiet_cores` of CPU (on average) since the previous look, else `base`.

    A look needs `min_interval` seconds since the previous one (/proc/stat counts in 10 ms ticks); a
    sooner fill keeps the last verdict. Without /proc/stat the answer is always `base`."""

    def __init__(
        self,
        base: int,
        wide: int,
        quiet_cores: float = 0.25,
        min_interval: float = 0.5,
        read_busy=busy_seconds,
        clock=time.monotonic,
        own_cpu=time.process_time,
    ) -> None:
        self.base, self.wide = base, wide
        self.quiet_cores, self.min_interval = quiet_cores, min_interval
        self._read_busy, self._clock, self._own_cpu = read_busy, clock, own_cpu
        self._last = self._sample()
        self.quiet = False  # the last verdict
        self.others_cores: float | None = None  # what the last look measured

    def _sample(self) -> tuple[float, float, float] | None:
        busy = self._read_busy()
        return None if busy is None else (self._clock(), busy, self._own_cpu())

    def choose(self) -> int:
        now = self._sample()
        if now is None or self._last is None:
            self._last = now
            return self.base
        wall = now[0] - self._last[0]
        if wall >= self.min_interval and wall > 0:
            others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / wall
            self.others_cores = others
            self.quiet = others < self.quiet_cores
            self._last = now
        return self.wide if self.quiet else self.base

    @contextmanager
    def applied(self) -> Iterator[int]:
        """torch's thread count for the body of a fill (in the calling thread), restored after."""
        threads = self.choose()
        before = torch.get_num_threads()
        if threads != before:
            torch.set_num_threads(threads)
        try:
            yield threads
        finally:
            if threads != before:
                torch.set_num_threads(before)
