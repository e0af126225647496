"""Unit tests of server/speculation.py (Tab-Tab) and server/cycling.py, on a server object with a real
(random, tiny) engine: which states a speculation answers, and what cancels or drops it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dfim.engine.api import FillRequest, FillResult, SamplerSettings
from dfim.server import context
from dfim.server.cycling import add_distinct, cycle_key, cycle_plan, is_invoked
from dfim.server.documents import Document
from dfim.server.inline import fill_for_inline, inline_context
from dfim.server.inline_plan import FillPlan
from dfim.server.post_context import post_context
from dfim.server.speculation import Speculation, digest
from tests.server.helpers import ctx_for

URI = "file:///spec.py"
TEXT = "def add(a, b):\n    return \n\n\ndef main():\n    print(add(1, 2))\n"
CURSOR = TEXT.index("return ") + len("return ")


def accepted(insert: str) -> tuple[str, int]:
    return TEXT[:CURSOR] + insert + TEXT[CURSOR:], CURSOR + len(insert)


def test_a_speculation_lives_on_while_the_user_types_the_suggestion():
    text, cursor = accepted("a + b")
    spec = Speculation(URI, (URI, digest(TEXT), CURSOR), text, CURSOR, "a + b")
    assert spec.cursor == cursor
    assert spec.could_become(text)  # accepted
    assert spec.could_become(TEXT)  # nothing typed yet (or typed and deleted again)
    assert spec.could_become(TEXT[:CURSOR] + "a +" + TEXT[CURSOR:])  # typing through it
    assert not spec.could_become(TEXT[:CURSOR] + "a -" + TEXT[CURSOR:])  # something else typed
    assert not spec.could_become(TEXT[:CURSOR] + "a + b)" + TEXT[CURSOR:])  # past it
    assert not spec.could_become("x" + text[1:])  # an edit elsewhere
    assert not spec.could_become(text + "\n")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from dfim.engine import Engine
    from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint

    folder = tmp_path_factory.mktemp("ckpt")
    return Engine.load(write_random_checkpoint(folder, DEFAULT_MODEL_DIR / "tokenizer.json"))


@pytest.fixture
def server(engine, tmp_path, monkeypatch):
    from dfim.server.app import DfimServer

    monkeypatch.setenv("DFIM_DATA_DIR", str(tmp_path))
    ls = DfimServer()
    ls.host.engine = engine
    ls.apply_settings({"sampling": {"maxSteps": 2, "maxCanvas": 32}, "telemetry": {"enabled": False}}, "test")
    return ls


def shown(ls, insert: str = "a + b"):
    """Start the speculation of `insert` shown at the end of `return ` (as inline_items does)."""
    return ls.speculations.start(ls, Document(URI, TEXT, 1, "python"), CURSOR, CURSOR, insert)


def key_at(ls, text: str, cursor: int) -> str:
    return inline_context(ls, Document(URI, text, language_id="python"), cursor, ls.options)[1]


async def test_the_request_after_an_accept_takes_what_a_fresh_fill_gives(server):
    spec = shown(server)
    assert spec is not None and spec.running
    text, cursor = accepted("a + b")
    key = key_at(server, text, cursor)
    taken = await server.speculations.take(URI, text, cursor, key)  # waits for it to finish
    assert taken and spec.key == key  # the random model writes something at this spot
    ctx = inline_context(server, Document(URI, text, language_id="python"), cursor, server.options)[0]

    async def fresh(request: FillRequest) -> FillResult:
        return await server.host.fill(request, threading.Event(), urgent=True)

    assert taken == (await fill_for_inline(server, ctx, text, server.options, fresh, lambda: False))[0]
    # asked again (the client repeats itself): the same answer, no new fill
    fills = server.counters["speculation_fills"]
    assert await server.speculations.take(URI, text, cursor, key) == taken
    assert server.counters["speculation_fills"] == fills
    # the same suggestion shown again does not start over
    assert shown(server) is spec and server.counters["speculations"] == 1


async def test_only_the_assumed_state_with_the_same_key_is_answered(server):
    shown(server)
    text, cursor = accepted("a + b")
    key = key_at(server, text, cursor)
    assert await server.speculations.take(URI, text, cursor - 1, key_at(server, text, cursor - 1)) is None
    # an explicit request's key (several candidates) is not the automatic one the speculation filled for:
    # asked before the speculation worked its key out (it waits for it) and after
    spec = shown(server)
    assert spec.key is None
    assert await server.speculations.take(URI, text, cursor, cycle_key(key, server.options)) is None
    assert spec.key == key
    shown(server)
    await asyncio.sleep(0.01)
    assert await server.speculations.take(URI, text, cursor, cycle_key(key, server.options)) is None


async def test_a_request_elsewhere_cancels_a_running_speculation_but_not_one_at_its_origin(server):
    server.apply_settings({"sampling": {"maxSteps": 200, "entropyBound": 0.0}}, "test")  # runs long
    spec = shown(server)
    await asyncio.sleep(0)
    origin_key = key_at(server, TEXT, CURSOR)
    assert await server.speculations.take(URI, TEXT, CURSOR, origin_key) is None  # asked again where shown
    assert spec.running and not spec.flag.is_set()
    elsewhere = TEXT.index("print(") + len("print(")
    assert await server.speculations.take(URI, TEXT, elsewhere, key_at(server, TEXT, elsewhere)) is None
    assert spec.flag.is_set() and server.counters["speculation_cancelled"] == 1
    assert await spec.task is None  # stopped at a step boundary, not after 200 steps
    text, cursor = accepted("a + b")
    assert len(server.speculations) == 0
    assert await server.speculations.take(URI, text, cursor, key_at(server, text, cursor)) is None


async def test_typing_something_else_drops_the_speculation_and_typing_the_suggestion_keeps_it(server):
    spec = shown(server)
    server.speculations.changed(URI, TEXT[:CURSOR] + "a " + TEXT[CURSOR:])  # typing the suggestion
    assert len(server.speculations) == 1 and not spec.flag.is_set()
    server.speculations.changed("file:///other.py", "x")  # another document
    assert len(server.speculations) == 1
    server.speculations.changed(URI, TEXT[:CURSOR] + "a -" + TEXT[CURSOR:])
    assert len(server.speculations) == 0 and spec.flag.is_set()
    assert await spec.task is None
    shown(server)
    server.speculations.closed(URI)
    assert len(server.speculations) == 0


async def test_no_speculation_when_turned_off_or_while_a_code_action_runs(server):
    server.apply_settings({"inline": {"speculate": False}}, "test")
    assert shown(server) is None
    server.apply_settings({"inline": {"speculate": True}}, "test")
    action = threading.Event()
    server.actions_running[URI] = {action}
    assert shown(server) is None
    action.set()  # finished (its flag raised)
    assert shown(server) is not None
    server.speculations.closed(URI)


def test_only_an_invoked_request_cycles():
    from lsprotocol import types

    def params(kind):
        return types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=URI),
            position=types.Position(line=1, character=11),
            context=types.InlineCompletionContext(trigger_kind=kind),
        )

    assert is_invoked(params(types.InlineCompletionTriggerKind.Invoked))
    assert not is_invoked(params(types.InlineCompletionTriggerKind.Automatic))
    assert is_invoked({"context": {"triggerKind": 1}}) and not is_invoked({"context": {"triggerKind": 2}})
    assert not is_invoked({})


def cycling_plan() -> FillPlan:
    ctx = context.one_line(ctx_for("def f(x):\n    y = x\n    |\n    return y\n"))
    drafted = FillRequest(
        prefix=ctx.prefix, suffix=ctx.suffix, seed=7, settings=SamplerSettings(draft=True), candidates=1
    )
    return FillPlan(drafted, "", post_context(ctx), None, drafted)


def test_an_invoked_request_denoises_more_canvases_and_fills_again_for_a_second_candidate():
    plan = cycle_plan(cycling_plan(), 4)
    assert plan.request.candidates == plan.again.candidates == 4
    asked: list[tuple[int | None, tuple[str, ...]]] = []

    def run(outcome, texts):
        async def fill_once(request: FillRequest) -> FillResult:
            asked.append((request.seed, request.avoid))
            text, *alternatives = texts[len(asked) - 1]
            return FillResult(text, 1, 32, 3, 0, 0, 1.0, "stable", alternatives=alternatives)

        asked.clear()
        return asyncio.run(add_distinct(fill_once, plan, outcome, lambda: False))

    # two already: nothing more to ask
    assert run((["y += 1", "z = y"], 2, 1), []) == (["y += 1", "z = y"], 2, 1)
    assert asked == []
    # one: one more fill at the next seed, avoiding it; only new candidates are added
    assert run((["y += 1"], 2, 1), [["y += 1", "y = y * 2"]]) == (["y += 1", "y = y * 2"], 3, 2)
    assert asked == [(8, ("y += 1",))]


def test_digest_of_a_long_text_reads_its_length_and_ends():
    long = "x = 1\n" * 100_000  # 600 k characters: over DIGEST_SPAN
    assert digest(long) == digest("".join(long))  # an equal text that is another object
    assert digest(long) != digest(long + "y")
    assert digest(long) != digest("y" + long[1:])  # the same length, another first character
    assert digest("a") != digest("b")


def test_a_first_candidate_that_also_rewrites_before_the_cursor_counts_as_shown(server):
    """An edit whose range starts before the cursor is on screen like any other: telemetry follows it (so
    its accept or reject is counted), while typed-ahead reuse and Tab-Tab, which assume an insertion at the
    cursor, leave it alone."""
    import dataclasses
    import time

    from dfim.server.inline import inline_items
    from dfim.server.inline_plan import Place

    src = "def f(x):\n    y = x.fo|\n    return y\n"
    ctx = ctx_for(src)
    text, cursor = src.replace("|", ""), src.index("|")
    ctx = dataclasses.replace(ctx, start=cursor - 2, end=cursor)  # the hole covers the typed "fo"
    place = Place(Document(URI, text, 1, "python"), cursor, "utf-16", time.perf_counter())
    answer = inline_items(server, place, ["bar"], ctx, "model")
    assert answer is not None
    (item,) = answer.items
    assert item.insert_text == "bar" and item.range.start.character == len("    y = x.")
    pending = server.tracker.pending.get(URI)
    assert pending is not None and pending.text == "bar"  # counted as shown
    assert URI not in server.shown and len(server.speculations) == 0
