"""The confidence gate through the real server (`dfim serve` over stdio) with the shipped checkpoint: a
strict threshold hides the suggestion a spot gets, the gate off shows it, and both are in telemetry; a request
the user invoked is never hidden."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dfim.server.telemetry import read_events
from tests.server_helpers import Session

pytestmark = pytest.mark.asyncio

DEMO = Path(__file__).resolve().parents[2] / "fixtures" / "demo.py"


STRICT = {"inline": {"gate": {"enabled": True, "threshold": 1.0}}}  # hides every suggestion
URI = "file:///demo.py"


async def strict_session(tmp_path: Path, **more) -> Session:
    """The server with the shipped checkpoint and the strict gate (plus `more` settings), ready, with the
    demo file open at URI."""
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR

    s = Session()
    await s.start(DEFAULT_MODEL_DIR, tmp_path, init_options={**STRICT, **more})
    try:
        assert (await s.wait_state()).state == "ready"
    except BaseException:
        await s.stop()
        raise
    s.open(URI, DEMO.read_text())
    return s


async def test_a_strict_gate_hides_what_the_gate_off_shows(tmp_path):
    s = await strict_session(tmp_path, telemetry={"enabled": True})
    uri = URI
    try:
        hidden = await s.inline(uri, 7, 11)  # `    return ▮` after the loop: the model writes `result`
        stats = await s.stats()
        assert hidden is None or not hidden.items
        assert stats.gate.hidden == 1 and stats.gate.last.shown is False
        score = stats.gate.last.gateScore
        assert 0.0 < score < 1.0 and stats.gate.last.confidence.tokens >= 1
        # the status says the server answered and chose silence, and why (a status bar shows it)
        assert stats.status.lastHidden == f"unsure: min_probability {score:.3f} < 1"  # the default measure

        s.configure({"inline": {"gate": {"enabled": False}}})
        await asyncio.sleep(0.2)
        shown = await s.inline(uri, 7, 11)
        after = await s.stats()
        assert shown is not None and shown.items and shown.items[0].insert_text.strip() == "result"
        # answered from the result cache, judged again with the fill's own confidence
        assert after.cache_hits == stats.cache_hits + 1 and after.fills == stats.fills
        assert after.gate.hidden == 1 and after.gate.last.shown is True
        assert after.status.lastHidden is None
        assert after.gate.last.gateScore == score

        s.configure({"inline": {"gate": {"enabled": True, "threshold": 0.0}}})  # on, but lenient
        await asyncio.sleep(0.2)
        s.open("file:///demo2.py", DEMO.read_text())
        assert (await s.inline("file:///demo2.py", 7, 11)) is not None
    finally:
        await s.stop()
    events = read_events(tmp_path / "telemetry.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds.count("hidden") == 1 and kinds.count("shown") == 2
    hidden_event = next(e for e in events if e["event"] == "hidden")
    assert hidden_event["gateScore"] == score and hidden_event["confidence"]["tokens"] >= 1
    assert all(e["gateScore"] == score for e in events if e["event"] == "shown")


async def test_an_invoked_request_is_answered_where_the_gate_hides_an_automatic_one(tmp_path):
    s = await strict_session(tmp_path)
    try:
        hidden = await s.inline(URI, 7, 11)
        assert hidden is None or not hidden.items
        asked = await s.inline(URI, 7, 11, invoked=True)
        stats = await s.stats()
        assert asked is not None and asked.items and asked.items[0].insert_text.strip() == "result"
        # scored as any other, shown because it was asked for; only the automatic one counts as hidden
        assert stats.gate.hidden == 1 and stats.gate.last.shown is True
        assert 0.0 < stats.gate.last.gateScore < 1.0
    finally:
        await s.stop()
