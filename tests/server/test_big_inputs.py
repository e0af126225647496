"""Big and odd documents over stdio: a 5 MB file, binary junk, NUL bytes, a 20,000-character line, an
unknown language. Each is answered (a completion or none) or refused with a JSON-RPC error, never a hang;
typing into a 5 MB file keeps the server's copy right.

The limits are generous "it finished" bounds for a loaded 2-core machine, not latency measurements (those are
`scripts/bench_server.py` and `scripts/soak.py`).
"""

from __future__ import annotations

import asyncio
import random
import time

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.robustness_helpers import FAST, ServerSession
from tests.server_helpers import random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")

ANSWER_WITHIN = 60.0  # seconds; a hang is what this catches
# A request beside a 5 MB single line: read and answered while the loop serves the line (issue 34: 2-9 s before
# the line was cut to the model's window by characters).
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


async def answer(session: ServerSession, uri: str, line: int, character: int):
    """The inline answer (or the JSON-RPC error) and how long it took."""
    start = time.perf_counter()
    try:
        result = await asyncio.wait_for(session.inline(uri, line, character), ANSWER_WITHIN)
    except JsonRpcException as exc:
        result = exc
    elapsed = time.perf_counter() - start
    print(f"{uri} {line}:{character} answered in {elapsed * 1000:.0f} ms")
    return result, elapsed


def check_item(result, line: int) -> None:
    if isinstance(result, types.InlineCompletionList):
        for item in result.items:
            assert item.range.start.line == item.range.end.line == line


def five_megabytes() -> str:
    block = (
        "def handler_{i}(request, retries=3):\n"
        "    '''Handle one request; emoji 😋 and tabs\tstay.'''\n"
        "    for attempt in range(retries):\n"
        "        if request.ok:\n"
        "            return request.value + {i}\n"
        '    raise TimeoutError("gave up")\n\n\n'
    )
    parts, size, i = [], 0, 0
    while size < 5 * 2**20:
        part = block.format(i=i)
        parts.append(part)
        size += len(part.encode("utf-8"))
        i += 1
    return "".join(parts)


async def test_five_megabyte_file(session):
    uri = "file:///big/huge.py"
    text = five_megabytes()
    lines = text.split("\n")
    session.open(uri, text)
    for line in (len(lines) // 2 + 4, len(lines) - 5, 4):  # middle, near the end, the start
        character = len(lines[line])
        result, _ = await answer(session, uri, line, character)
        assert not isinstance(result, JsonRpcException) or result.code != -32603, result
        check_item(result, line)
    # typing 30 characters in the middle, then the end, keeps the server's copy right
    middle = len(lines) // 2 + 4
    for i in range(30):
        pos = types.Position(middle, len(lines[middle]) + i)
        session.change(uri, "x", types.Range(start=pos, end=pos))
    lines[middle] += "x" * 30
    end = types.Position(len(lines) - 1, 0)
    session.change(uri, "# end\n", types.Range(start=end, end=end))
    result, _ = await answer(session, uri, middle, len(lines[middle]))
    check_item(result, middle)
    mirror = await session.document_text(uri)
    assert mirror.text == "\n".join(lines) + "# end\n"
    session.client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )


async def test_binary_file(session):
    rnd = random.Random(8)
    raw = bytes(rnd.randrange(256) for _ in range(300_000))
    for n, (text, language) in enumerate(
        [(raw.decode("utf-8", "replace"), "plaintext"), (raw.decode("latin-1"), "python")]
    ):
        uri = f"file:///big/blob{n}.bin"
        session.open(uri, text, language)
        line_count = text.count("\n") + text.count("\r") + 1  # an upper bound: \r\n counts once
        for line in (0, min(line_count, 40) // 2):
            result, _ = await answer(session, uri, line, 0)
            assert not isinstance(result, JsonRpcException) or result.code != -32603, result
            check_item(result, line)
        assert (await session.document_text(uri)).text == text


async def test_nul_bytes(session):
    uri = "file:///big/nul.py"
    text = "def f():\n    x = '\x00\x00\x00'\n    return \x00\n" + "\x00" * 5000 + "\n"
    session.open(uri, text)
    for line, character in ((1, 9), (2, 11), (3, 2500), (4, 0)):
        result, _ = await answer(session, uri, line, character)
        assert not isinstance(result, JsonRpcException), result
        check_item(result, line)


async def test_twenty_thousand_character_line(session):
    uri = "file:///big/long.js"
    line = "const table = [" + ", ".join(str(i % 997) for i in range(5200))
    assert len(line) > 20_000
    session.open(uri, f"// data\n{line}\n\nfunction f() {{\n  return \n}}\n", "javascript")
    for character in (len(line), len(line) // 2, 0):
        result, _ = await answer(session, uri, 1, character)
        assert not isinstance(result, JsonRpcException), result
        check_item(result, 1)
    result, _ = await answer(session, uri, 4, 9)  # the function after it still works
    assert not isinstance(result, JsonRpcException), result


async def test_typing_at_the_end_of_a_200k_character_line_keeps_up(session):
    """Minified code: each keystroke's position was converted by walking the line in Python (0.2 s per change
    at the end of 200,000 characters in UTF-16), so 50 keystrokes kept the server busy for 10 s."""
    uri = "file:///big/minified.js"
    line = "var t=[" + ",".join(str(i % 997) for i in range(60000))
    line = line[:200_000] + "😋"  # one astral character: the line is not pure BMP
    session.open(uri, line, "javascript")
    width = len(line) + 1  # UTF-16 units
    start = time.perf_counter()
    for i in range(50):
        position = types.Position(line=0, character=width + i)
        session.change(uri, "1", types.Range(start=position, end=position))
    mirror = await asyncio.wait_for(session.document_text(uri), ANSWER_WITHIN)
    elapsed = time.perf_counter() - start
    assert mirror.text == line + "1" * 50
    print(f"50 keystrokes at the end of a 200,000-character line: {elapsed:.2f} s")
    assert elapsed < 4.0, f"50 keystrokes took {elapsed:.1f} s"


async def test_unknown_language(session):
    uri = "file:///big/program.zz9"
    text = "PROCEDURE MAIN.\n    DISPLAY 'HELLO'.\n    \nEND.\n"
    session.open(uri, text, "cobol-2099")
    result, _ = await answer(session, uri, 2, 4)
    assert not isinstance(result, JsonRpcException), result
    check_item(result, 2)


async def test_the_server_is_still_up_and_not_backlogged(session):
    stats = await session.stats()
    assert stats.status.state == "ready" and stats.engine_queued == 0
    assert session.alive


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
