"""End to end, Tab-Tab and cycling: the real `dfim serve` over stdio, driven by pygls's LanguageClient.

An accept (a didChange inserting the item, as an editor does) followed by a request at the new cursor is
answered from the fill the server started when the suggestion was shown; typing something else drops it;
an explicit request (triggerKind Invoked) gets several distinct items.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio
from lsprotocol import types

from dfim.server.telemetry import read_events
from tests.server_helpers import Session, random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAST = {"sampling": {"maxSteps": 2, "maxCanvas": 32}, "telemetry": {"enabled": True}}
PY = "def add(a, b):\n    return \n\n\ndef main():\n    print(add(1, 2))\n"
AFTER_RETURN = (1, 11)


def source(name: str) -> str:
    """PY with a comment of its own at the end: each test's fills miss the result cache of the others."""
    return PY + f"# {name}\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(tmp_path_factory):
    s = Session()
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("ckpt"))
    await s.start(checkpoint, tmp_path_factory.mktemp("data"), init_options=FAST)
    assert (await s.wait_state()).state == "ready"
    yield s
    await s.stop()


async def ask(session: Session, uri: str, line: int, character: int, invoked: bool = False):
    kind = (
        types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    )
    return await session.client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(trigger_kind=kind),
        )
    )


def accept(session: Session, uri: str, item: types.InlineCompletionItem) -> tuple[int, int]:
    """Insert `item` as an editor does when the user presses Tab; the cursor after it."""
    session.change(uri, item.insert_text, item.range)
    assert "\n" not in item.insert_text
    return item.range.start.line, item.range.start.character + len(item.insert_text.encode("utf-16-le")) // 2


async def last_trace(session: Session):
    return await session.client.protocol.send_request_async("dfim/lastTrace", {})


def first_texts(result) -> str | None:
    return result.items[0].insert_text if result is not None and result.items else None


async def test_an_accept_is_answered_from_the_speculation_with_a_fresh_fills_answer(session):
    uri = "file:///work/tab.py"
    session.open(uri, source("tab"))
    first = await ask(session, uri, *AFTER_RETURN)
    assert first is not None and first.items
    shown_trace = (await last_trace(session)).fill
    await asyncio.sleep(0.5)  # the speculation finishes (a tiny model, two steps)
    before = await session.stats()
    assert before.speculation_fills > 0
    # the canvas of the suggestion on the screen stays the last trace while the next one is computed
    assert (await last_trace(session)).fill == shown_trace
    line, character = accept(session, uri, first.items[0])
    second = await ask(session, uri, line, character)
    after = await session.stats()
    speculated_trace = (await last_trace(session)).fill  # now the speculation's canvas is the one shown
    assert after.speculation_hits == before.speculation_hits + 1
    assert after.fills == before.fills  # the request ran no fill of its own
    assert after.speculations >= before.speculations + 1  # ...and the next one is speculated already
    if second is not None:  # telemetry says where the suggestion shown came from
        shown = [e for e in read_events(session.data_dir / "telemetry.jsonl") if e.get("event") == "shown"]
        assert shown[-1]["source"] == "speculation"

    # the same state in a fresh document, with speculation off: a fill of its own gives the same answer
    session.configure({"inline": {"speculate": False}})
    await asyncio.sleep(0.1)
    text = (await session.client.protocol.send_request_async("dfim/documentText", {"uri": uri})).text
    copy = "file:///work/tab-copy.py"
    session.open(copy, text)
    fresh = await ask(session, copy, line, character)
    assert (await session.stats()).fills > after.fills
    assert first_texts(fresh) == first_texts(second)
    assert (await last_trace(session)).fill == speculated_trace != shown_trace
    session.configure({"inline": {"speculate": True}})
    await asyncio.sleep(0.1)


async def test_tab_tab_tab_chains_speculations(session):
    uri = "file:///work/chain.py"
    session.open(uri, source("chain"))
    result = await ask(session, uri, *AFTER_RETURN)
    before = await session.stats()
    accepted = 0
    while result is not None and result.items and accepted < 3:
        position = accept(session, uri, result.items[0])
        result = await ask(session, uri, *position)
        accepted += 1
    after = await session.stats()
    assert accepted >= 2
    assert after.speculation_hits == before.speculation_hits + accepted and after.fills == before.fills


async def test_typing_something_else_drops_the_speculation(session):
    uri = "file:///work/other.py"
    session.open(uri, source("other"))
    first = await ask(session, uri, *AFTER_RETURN)
    assert first is not None and first.items
    item = first.items[0]
    here = types.Range(start=types.Position(*AFTER_RETURN), end=types.Position(*AFTER_RETURN))
    session.change(uri, "\x01", here)  # not the suggestion's first character
    session.change(uri, "", types.Range(start=here.start, end=types.Position(1, 12)))  # deleted again
    before = await session.stats()
    position = accept(session, uri, item)
    await ask(session, uri, *position)
    after = await session.stats()
    assert after.speculation_hits == before.speculation_hits  # dropped: the request filled anew
    assert after.fills > before.fills


async def test_a_request_elsewhere_stops_a_running_speculation(session):
    uri = "file:///work/elsewhere.py"
    session.open(uri, source("elsewhere"))
    session.configure({"sampling": {"maxSteps": 200, "entropyBound": 0.0}})  # a random model never settles
    await asyncio.sleep(0.1)
    try:
        first = await ask(session, uri, *AFTER_RETURN)
        assert first is not None and first.items
        before = await session.stats()
        await ask(session, uri, 5, 10)  # `print(add(` in main: the user went elsewhere
        after = await session.stats()
        assert after.speculation_cancelled > before.speculation_cancelled
    finally:
        session.configure({"sampling": {"maxSteps": 2, "entropyBound": 0.1}})
        await asyncio.sleep(0.1)


async def test_an_invoked_request_returns_several_distinct_items(session):
    uri = "file:///work/cycle.py"
    session.open(uri, source("cycle"))
    automatic = await ask(session, uri, *AFTER_RETURN)
    invoked = await ask(session, uri, *AFTER_RETURN, invoked=True)
    assert invoked is not None
    texts = [item.insert_text for item in invoked.items]
    assert len(texts) > 1 and len(set(texts)) == len(texts)
    assert automatic is None or len(automatic.items) <= 2  # `inline.candidates` (2) at most
    assert all(item.range.start == types.Position(*AFTER_RETURN) for item in invoked.items)
