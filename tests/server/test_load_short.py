"""A short version of `scripts/soak.py`: 5 documents, 20 inline requests a second for 5 s, over stdio.

Every request is answered (after the load, within a generous drain), nothing is left queued in the engine
worker, at most one live fill per document was ever queued (superseded and cancelled requests free their
work), no request failed, and the server's memory grew by at most 100 MB. No timing assertions.
"""

from __future__ import annotations

import asyncio
import importlib.util

from tests.robustness_helpers import FAST, ServerSession
from tests.server_helpers import ROOT, random_checkpoint

DOCS = 5


def load_soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLE_INPUT = {
    "docs": 1,
    "rate": 1.0,
    "seconds": 1.0,
    "requests": 1,
    "answered": 1,
    "unanswered": 0,
    "answers": {"items": 1, "null": 0, "cancelled": 0, "error": 0},
    "latency_ms": {"p50": 1.0, "p95": 2.0, "max": 3.0},
    "engine": {"fills_started": 1, "fills_completed": 1, "cancelled": 0, "failed": 0, "cache_hits": 0},
    "backlog": {"queued_peak": 1, "live_peak": 1, "queued_end": 0, "drain_ms": 4.0},
    "rss_mb": {"before": 300.0, "peak": 310.0, "end": 305.0, "growth": 5.0, "timeline": []},
}


def test_short_load_no_backlog_bounded_memory(tmp_path):
    soak = load_soak()

    async def run() -> dict:
        session = ServerSession()
        await session.start(random_checkpoint(tmp_path / "ckpt"), tmp_path, init_options=FAST)
        try:
            assert (await session.wait_state()).state == "ready"
            files = sorted(p for p in (ROOT / "fixtures").glob("example.*") if p.suffix in soak.LANGUAGES)
            m = await soak.soak(session, files, docs=DOCS, rate=20, seconds=5, drain_timeout=120)
            m["alive"] = session.alive
            return m
        finally:
            await session.stop()

    m = asyncio.run(run())
    print(soak.table(m))
    assert m["alive"]
    assert m["requests"] >= 20 and m["unanswered"] == 0 and m["answered"] == m["requests"]
    assert m["answers"]["error"] == 0, m["errors"]
    assert m["backlog"]["queued_end"] == 0
    assert m["backlog"]["live_peak"] <= DOCS  # one live fill per document at most: the rest was freed
    assert m["rss_mb"]["growth"] <= 100, m["rss_mb"]


def test_soak_table_prints_every_measure():
    soak = load_soak()
    m = TABLE_INPUT
    text = soak.table(m)
    for needle in ("p95", "RSS growth", "5.0 MB", "1 (1) / 0 / 4.0 ms"):
        assert needle in text


def test_levelling_tells_a_flat_rss_from_a_growing_one():
    soak = load_soak()
    # a noisy but flat series over 30 minutes, then one that keeps growing 1 MB a minute
    flat = [(t, 400.0 + (8.0 if (t // 10) % 2 else -8.0)) for t in range(0, 1801, 10)]
    growing = [(t, 400.0 + t / 60.0) for t in range(0, 1801, 10)]
    assert soak.levelling(flat, 10.0)["flat"]
    level = soak.levelling(growing, 10.0)
    assert not level["flat"]
    assert abs(level["slope_mb_per_min"] - 1.0) < 0.01 and level["last_half_from_s"] == 900
    m = {"rss_mb": {"before": 1, "peak": 1, "end": 1, "growth": 0, "timeline": growing, "levelling": level}}
    assert "still growing" in soak.table({**TABLE_INPUT, **m})
    assert "over 30.0 min" in soak.plot(growing)
