"""A 5 MB single line does not stall the message loop (issue 34, must-have 3): while an inline request is
served there, another request sent meanwhile is read and answered within a bounded time. Before the text
was cut to the model's window by characters, the loop was blocked 2-9 s."""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio

from tests.robustness_helpers import FAST, ServerSession
from tests.server_helpers import random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")

BOUND = (
    1.0  # seconds: ~0.15 s here now; the old code took 1.7-2.8 s on this 2-core machine, 2-9 s in issue 34
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(checkpoint, tmp_path_factory):
    s = ServerSession()
    await s.start(checkpoint, tmp_path_factory.mktemp("data"), init_options=FAST)
    assert (await s.wait_state()).state == "ready"
    yield s
    await s.stop()


@pytest.mark.parametrize("where", ["start", "middle", "end"])
async def test_a_request_beside_a_5mb_line_is_read_quickly(session, where):
    line = "x = [" + ", ".join(f"'{i:06d}'" for i in range(5 * 2**20 // 10)) + "]"
    uri = f"file:///long_{where}.py"
    session.open(uri, line + "\n")
    await session.stats()  # the open is read (its cost is document sync, not this test's)
    character = {"start": 5, "middle": len(line) // 2, "end": len(line)}[where]
    inline = asyncio.ensure_future(session.inline(uri, 0, character))
    await asyncio.sleep(0.05)  # the inline request is on the loop
    start = time.perf_counter()
    await asyncio.wait_for(session.stats(), 60)
    beside = time.perf_counter() - start
    start = time.perf_counter()
    await asyncio.wait_for(inline, 60)
    total = beside + time.perf_counter() - start
    print(f"{where}: a request beside it in {beside * 1000:.0f} ms, inline done {total * 1000:.0f} ms later")
    assert beside < BOUND
