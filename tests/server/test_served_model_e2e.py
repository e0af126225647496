"""End to end: the real `dfim serve` process with its model path pointing at a served vLLM (a local stand-in
that speaks vLLM's JSON, tests/fake_vllm.py): the team-serving path of docs/gpu.md."""

from __future__ import annotations

import pytest

from tests.fake_vllm import MODEL, FakeVllm
from tests.server_helpers import Session

pytestmark = pytest.mark.asyncio(loop_scope="function")

PY = "def add(a, b):\n    return \n\n\ndef main():\n    print(add(1, 2))\n"


async def test_inline_fill_from_a_served_model(tmp_path):
    with FakeVllm(reply="a + b") as fake:
        session = Session()
        await session.start(fake.url, tmp_path)
        try:
            status = await session.wait_state()
            assert status.state == "ready", status
            assert status.model == MODEL  # the name the server lists, not the URL
            session.open("file:///work/add.py", PY)
            result = await session.inline("file:///work/add.py", 1, 11)
            assert result is not None and [item.insert_text for item in result.items] == ["a + b"]
            body = fake.chat_bodies()[0]  # later ones may be the server's speculation past the shown item
            assert body["model"] == MODEL and body["add_special_tokens"] is False
            assert "def add(a, b):\n    return <|fill|>" in body["messages"][0]["content"]
        finally:
            await session.stop()


async def test_an_unreachable_server_is_a_load_error(tmp_path):
    session = Session()
    await session.start("http://127.0.0.1:9/v1", tmp_path)  # the discard port: nothing listens there
    try:
        status = await session.wait_state()
        assert status.state == "error" and "cannot reach the vLLM server" in status.message
    finally:
        await session.stop()
