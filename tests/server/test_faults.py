"""Faults, end to end over stdio: a broken checkpoint, an engine that throws, memory that runs out.

One server process for the module, started on a missing checkpoint with `DFIM_TEST_FAULTS=1` (the test hook
of `server/engine_host.py`: markers in the document make the engine worker raise) and a log file. Broken
checkpoints are loaded in turn through `model.path` (a reload each), then a good one for the engine faults.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil

import pytest
import pytest_asyncio
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from tests.robustness_helpers import FAST, ServerSession
from tests.server_helpers import random_checkpoint

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    good = random_checkpoint(tmp_path_factory.mktemp("good"))
    root = tmp_path_factory.mktemp("broken")
    made = {"good": good, "missing": root / "no-such-model"}
    for name in ("truncated", "corrupt", "bad-config", "no-tokenizer"):
        shutil.copytree(good, root / name)
        made[name] = root / name
    (weights,) = made["truncated"].glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    (weights,) = made["corrupt"].glob("*.safetensors")
    data = bytearray(weights.read_bytes())
    data[:64] = b"\xff" * 64  # the header length and the start of the JSON header
    weights.write_bytes(bytes(data))
    (made["bad-config"] / "config.json").write_text('{"model_type": "diffusion_gemma", ', encoding="utf-8")
    (made["no-tokenizer"] / "tokenizer.json").unlink()
    return made


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def session(checkpoints, tmp_path_factory):
    s = ServerSession()
    log = tmp_path_factory.mktemp("log") / "server.log"
    await s.start(
        checkpoints["missing"],
        tmp_path_factory.mktemp("data"),
        # no Tab-Tab speculation: its fills would hit the same injected faults and add to the counts
        init_options={**FAST, "inline": {"speculate": False}},
        args=("--log-file", str(log)),
        env={"DFIM_TEST_FAULTS": "1"},
    )
    s.log = log
    yield s
    await s.stop()


async def load(session: ServerSession, path) -> object:
    count = len(session.statuses)
    session.configure({"model": {"path": str(path)}})
    return await session.settled_after(count)


async def still_serves_without_a_model(session: ServerSession, uri: str) -> None:
    session.open(uri, "def f(x):\n    return \n")
    assert await session.inline(uri, 1, 11) is None  # no model: an answer, no completions
    stats = await session.stats()
    assert stats.status.state == "error" and stats.engine_fills_started == 0
    with pytest.raises(JsonRpcException) as info:  # an action says why it cannot run
        await session.client.workspace_execute_command_async(
            types.ExecuteCommandParams(
                command="dfim.fillHole",
                arguments=[uri, {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 4}}],
            )
        )
    assert "not ready" in info.value.message
    assert info.value.code == -32803  # RequestFailed: the request is fine, the server cannot serve it now


async def test_missing_checkpoint_is_a_clear_error_and_the_server_answers(session):
    status = await session.wait_state()
    assert status.state == "error"
    assert "no-such-model" in status.message and "not found" in status.message
    assert await session.wait_message("no-such-model")  # window/showMessage
    await still_serves_without_a_model(session, "file:///faults/missing.py")
    assert "no-such-model" in session.log.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "name, words",
    [
        ("truncated", (".safetensors", "corrupt")),
        ("corrupt", (".safetensors", "corrupt")),
        ("bad-config", ("config.json", "not valid JSON")),
        ("no-tokenizer", ("tokenizer.json", "missing")),
    ],
)
async def test_broken_checkpoint_is_a_clear_error_and_the_server_answers(session, checkpoints, name, words):
    status = await load(session, checkpoints[name])
    assert status.state == "error", status
    for word in (name, *words):
        assert word in status.message, status.message
    assert status.message in session.log.read_text(encoding="utf-8")
    await still_serves_without_a_model(session, f"file:///faults/{name}.py")
    assert session.alive


async def test_good_checkpoint_after_broken_ones_serves(session, checkpoints):
    status = await load(session, checkpoints["good"])
    assert status.state == "ready", status
    uri = "file:///faults/good.py"
    session.open(uri, "def f(x):\n    return \n")
    result = await session.inline(uri, 1, 11)
    assert result is not None and result.items


async def test_an_engine_exception_fails_that_request_only(session, checkpoints):
    if session.statuses[-1].state != "ready":
        assert (await load(session, checkpoints["good"])).state == "ready"
    bad, good = "file:///faults/engine-error.py", "file:///faults/fine.py"
    session.open(bad, "# <<dfim-fault:error>>\ndef f(x):\n    return \n\n\ndef h():\n    pass\n")
    session.open(good, "def g(y):\n    return \n")
    before = await session.stats()
    with pytest.raises(JsonRpcException) as info:
        await session.inline(bad, 2, 11)
    assert info.value.code == -32603 and "injected engine fault" in info.value.message
    with pytest.raises(JsonRpcException) as info:  # a code action on it fails the same way
        await session.client.workspace_execute_command_async(
            types.ExecuteCommandParams(
                command="dfim.fillHole",
                arguments=[bad, {"start": {"line": 6, "character": 6}, "end": {"line": 6, "character": 6}}],
            )
        )
    assert "injected engine fault" in info.value.message
    result = await session.inline(good, 1, 11)  # the next request is served
    assert result is not None and result.items
    after = await session.stats()
    assert after.failed == before.failed + 1 and after.completed == before.completed + 1
    assert after.status.state == "ready" and after.engine_queued == 0
    assert session.alive


async def test_out_of_memory_retries_on_a_smaller_canvas(session, checkpoints):
    if session.statuses[-1].state != "ready":
        assert (await load(session, checkpoints["good"])).state == "ready"
    uri = "file:///faults/oom-once.py"
    session.open(uri, "# <<dfim-fault:oom>>\ndef f(x):\n    return \n")
    before = await session.stats()
    result = await session.inline(uri, 2, 11)
    after = await session.stats()
    assert after.oom_retries == before.oom_retries + 1
    assert after.completed == before.completed + 1 and after.failed == before.failed
    assert result is None or result.items  # answered from the smaller canvas
    assert "out of memory" in session.log.read_text(encoding="utf-8")


async def test_out_of_memory_every_time_fails_that_request_only(session, checkpoints):
    if session.statuses[-1].state != "ready":
        assert (await load(session, checkpoints["good"])).state == "ready"
    uri = "file:///faults/oom-always.py"
    session.open(uri, "# <<dfim-fault:oom-always>>\ndef f(x):\n    return \n")
    before = await session.stats()
    with pytest.raises(JsonRpcException) as info:
        await session.inline(uri, 2, 11)
    assert info.value.code == -32603 and "out of memory" in info.value.message
    after = await session.stats()
    assert after.oom_retries == before.oom_retries + 2  # the full canvas, then the smaller one
    result = await session.inline("file:///faults/good.py", 1, 11)
    assert result is not None and result.items
    assert (await session.stats()).status.state == "ready"


async def test_params_that_do_not_validate_leave_one_line_in_the_log_not_a_traceback(session):
    """pygls logged such a message as a 30-120 line traceback at ERROR, then a warning naming an internal
    object; the server answers a request InvalidParams and logs an ignored notification in one line."""
    protocol, answer = session.client.protocol, concurrent.futures.Future()
    protocol._request_futures["bad-params"] = answer
    bad = {"textDocument": {"uri": "file:///work/log.py"}, "position": {"line": -1, "character": 0}}
    method = types.TEXT_DOCUMENT_INLINE_COMPLETION
    protocol._send_data({"jsonrpc": "2.0", "id": "bad-params", "method": method, "params": bad})
    with pytest.raises(JsonRpcException) as info:
        await asyncio.wait_for(asyncio.wrap_future(answer), 10)
    assert info.value.code == -32602  # InvalidParams
    change = {"textDocument": {"uri": "file:///work/log.py", "version": None}, "contentChanges": []}
    protocol._send_data({"jsonrpc": "2.0", "method": types.TEXT_DOCUMENT_DID_CHANGE, "params": change})
    await session.stats()  # the notification was read before this request was answered
    log = session.log.read_text(encoding="utf-8")
    assert "Traceback" not in log and "Unable to deserialize" not in log and "Unreadable" not in log, log
    ignored = [line for line in log.splitlines() if "textDocument/didChange notification" in line]
    assert len(ignored) == 1 and "do not match the protocol" in ignored[0], log
