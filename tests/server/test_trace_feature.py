"""`dfim/lastTrace` end to end: the real `dfim serve` over stdio keeps the canvas of its last fill and answers
with `dfim trace`'s page (the VS Code extension shows it in a webview)."""

from __future__ import annotations

import json
import re

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.server_helpers import Session, apply_edits, random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")

# Different step caps, so a trace tells an inline fill (2 steps a canvas) from an action's (3).
SETTINGS = {
    "sampling": {"maxSteps": 2, "actionMaxSteps": 3, "maxCanvas": 32},
    "telemetry": {"enabled": False},
}
NONCE = "dGVzdC1ub25jZS0xMjM0NTY3OA"
PY = "def add(a, b):\n    return \n\n\ndef main():\n    print(add(1, 2))\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(tmp_path_factory):
    s = Session()
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("ckpt"))
    # --stdio as vscode-languageclient appends it for TransportKind.stdio: the default, accepted
    await s.start(checkpoint, tmp_path_factory.mktemp("data"), init_options=SETTINGS, args=("--stdio",))
    status = await s.wait_state()
    assert status.state == "ready", status
    yield s
    await s.stop()


async def last_trace(session: Session, params: dict | None = None):
    return await session.client.protocol.send_request_async("dfim/lastTrace", params or {})


def embedded(page: str) -> dict:
    m = re.search(r'<script id="trace-data" type="application/json">(.*?)</script>', page, re.S)
    assert m, "no trace data in the page"
    return json.loads(m.group(1))


def final_pre(page: str) -> str:
    import html

    m = re.search(r'<pre id="final" class="code">(.*?)</pre>', page, re.S)
    assert m
    return html.unescape(m.group(1))


async def test_nothing_before_the_first_fill(session):
    assert await last_trace(session) is None


async def test_inline_fill_is_traced_to_its_final_frame(session):
    uri = "file:///work/add.py"
    session.open(uri, PY)
    result = await session.inline(uri, 1, 11)
    assert result is not None and result.items
    answer = await last_trace(session)
    assert answer is not None
    data = embedded(answer.html)
    frames = data["frames"]
    assert answer.frames == len(frames) == answer.steps >= 1
    assert {f["max_steps"] for f in frames} == {2}  # the inline step cap
    assert answer.fill == data["fill"]
    # The last frame reads as the committed fill; a single-line fill is cut at its first newline
    # (FillRequest.stop), so there the canvas may go on after it.
    last = frames[-1]["text"]
    assert last == answer.fill or (last.startswith(answer.fill) and last[len(answer.fill) :].startswith("\n"))
    assert final_pre(answer.html) == answer.fill
    assert answer.randomModel is True and answer.model
    # the suggestion shown in the editor came out of this fill (post-processing trims it, may close brackets)
    assert result.items[0].insert_text.strip()[:5] in answer.fill
    # the page shows the context around the fill, not the whole window the model saw (less what token
    # healing backed off: the canvas's first token writes that, and the page draws it once)
    assert (data["prefix"] + data["heal"]).endswith("def add(a, b):\n    return ")
    for f in frames:
        assert len(f["tokens"]) == len(f["confidence"]) == len(f["kept"]) == len(f["pinned"])


async def test_an_action_replaces_the_trace_and_a_cache_hit_keeps_it(session):
    uri = "file:///work/hole.py"
    text = "def f(x):\n    \n\n\ndef g(y):\n    return y\n"
    session.open(uri, text)
    rng = {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 4}}
    applied_before = len(session.applied)
    try:
        result = await session.client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="dfim.fillHole", arguments=[uri, rng])
        )
    except JsonRpcException as exc:  # the untrained model may write nothing usable: the fill still ran
        assert "dfim" in exc.message
        result = None
    answer = await last_trace(session)
    frames = embedded(answer.html)["frames"]
    assert {f["max_steps"] for f in frames} == {3}  # the action's step cap: this is the action's fill
    assert frames[-1]["text"] == answer.fill
    if result is not None:
        assert result["applied"] is True
        (edit,) = session.applied[applied_before:]
        new = apply_edits(text, edit.document_changes[0].edits)
        assert answer.fill.strip()[:20] in new

    # an inline request served from the cache runs no fill: the trace stays the action's
    await session.inline("file:///work/add.py", 1, 11)
    again = await last_trace(session)
    assert again.fill == answer.fill and again.steps == answer.steps


async def test_nonce_page_for_a_webview(session):
    answer = await last_trace(session, {"nonce": NONCE})
    page = answer.html
    assert f"script-src 'nonce-{NONCE}'" in page and "unsafe-inline" not in page
    assert f'<script nonce="{NONCE}">' in page and f'<style nonce="{NONCE}">' in page
    assert " style=" not in page  # inline style attributes would be refused by the policy
    for bad in ("short", "x" * 200, "a b c d e f g h i j", 12345, "<script>alert(1)</script>xx"):
        with pytest.raises(JsonRpcException) as info:
            await last_trace(session, {"nonce": bad})
        assert "nonce" in info.value.message
    assert (await last_trace(session)).fill == answer.fill  # the server keeps serving


async def test_stdio_and_tcp_exclude_each_other(capsys):
    from dfim.cli import main

    assert main(["serve", "--stdio", "--tcp", "127.0.0.1:9"]) == 2
    assert "exclude each other" in capsys.readouterr().err
