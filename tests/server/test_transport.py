"""The transport (server/transport.py) under attack: raw frames written to a real `dfim serve` over stdio.

Each attack of issue 34 that broke the server (one frame killed it; a lowercase header, an LF-only header or a
wrong length swallowed the next messages; a request without "jsonrpc" was never answered; an object nested in
params was answered as a message; a client that never answers the server's requests left a command
unanswered) is sent, then a following request must still be answered. The reader itself is also tested in
process, frame by frame.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time

import pytest

from dfim.server.transport import FrameReader, Message, peek_request
from tests.server_helpers import ROOT, random_checkpoint

FAST = {"sampling": {"maxSteps": 2, "actionMaxSteps": 2, "maxCanvas": 32}, "telemetry": {"enabled": False}}


def frame(obj, name: str = "Content-Length", eol: str = "\r\n", delta: int = 0) -> bytes:
    body = json.dumps(obj).encode()
    return f"{name}: {len(body) + delta}{eol}{eol}".encode() + body


def request(msg_id, method: str, params=None) -> dict:
    return {"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}


def initialize(msg_id=1, capabilities=None) -> dict:
    return request(msg_id, "initialize", {"capabilities": capabilities or {}, "initializationOptions": FAST})


class RawServer:
    """`dfim serve` driven with raw bytes; what it writes is parsed into messages by a reader thread."""

    def __init__(self, tmp_path, model="/no/such/model", args: tuple[str, ...] = ()) -> None:
        env = {**os.environ, "DFIM_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
        self.stderr_path = tmp_path / "stderr.txt"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dfim", "serve", "--model", str(model), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.stderr_path, "wb"),  # noqa: SIM115 (closed with the process)
            cwd=str(ROOT),
            env=env,
        )
        self.inbox: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        out = self.proc.stdout
        while True:
            length = None
            while True:
                line = out.readline()
                if not line:
                    self.inbox.put(None)
                    return
                if not line.strip():
                    break
                name, _, value = line.decode().partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            self.inbox.put(json.loads(out.read(length)))

    def send(self, data: bytes) -> None:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def next(self, timeout: float = 30.0) -> dict | None:
        message = self.inbox.get(timeout=timeout)
        if message is not None:
            self.seen.append(message)
        return message

    def answer(self, msg_id, timeout: float = 30.0) -> dict:
        """The server's answer to request `msg_id` (messages on the way are kept in `seen`)."""
        deadline = time.monotonic() + timeout
        for message in self.seen:
            if message.get("id") == msg_id and "method" not in message:
                return message
        while time.monotonic() < deadline:
            message = self.next(timeout=max(0.01, deadline - time.monotonic()))
            if message is None:
                raise AssertionError(
                    f"the server closed its output before answering {msg_id!r}: {self.stderr()}"
                )
            if message.get("id") == msg_id and "method" not in message:
                return message
        raise AssertionError(f"no answer to {msg_id!r}; seen {self.seen}")

    def server_request(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        for message in self.seen:
            if message.get("method") == method:
                return message
        while time.monotonic() < deadline:
            message = self.next(timeout=max(0.01, deadline - time.monotonic()))
            if message is not None and message.get("method") == method:
                return message
        raise AssertionError(f"the server sent no {method}; seen {self.seen}")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Until the server's status says the model is loaded."""
        deadline = time.monotonic() + timeout
        while not any(
            m.get("method") == "dfim/status" and m["params"].get("state") == "ready" for m in self.seen
        ):
            assert time.monotonic() < deadline, self.seen
            self.next(timeout=timeout)

    def still_serves(self, msg_id) -> None:
        """A request after the attack is answered: the server kept reading."""
        self.send(frame(request(msg_id, "dfim/documentText", {"uri": "file:///nothing.py"})))
        assert self.answer(msg_id) == {"jsonrpc": "2.0", "id": msg_id, "result": None}

    def close(self) -> int:
        self.send(
            frame(request("bye", "shutdown")) + frame({"jsonrpc": "2.0", "method": "exit", "params": None})
        )
        self.proc.stdin.close()
        code = self.proc.wait(timeout=30)
        return code


@pytest.fixture
def server(tmp_path):
    s = RawServer(tmp_path)
    s.send(frame(initialize()))
    assert "result" in s.answer(1)
    s.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    yield s
    if s.proc.poll() is None:
        s.proc.kill()
        s.proc.wait()


# ---- end to end: attacks over stdio -------------------------------------------------------------------


def test_a_huge_content_length_then_eof_exits_cleanly(tmp_path):
    # issue 34: `printf 'Content-Length: 99999999999999\r\n\r\n{}' | dfim serve` raised MemoryError, exit 1
    s = RawServer(tmp_path)
    s.send(b"Content-Length: 99999999999999\r\n\r\n{}")
    s.proc.stdin.close()
    assert s.proc.wait(timeout=30) == 0
    assert "MemoryError" not in s.stderr() and "Traceback" not in s.stderr()
    assert "over the limit" in s.stderr()


def test_a_huge_content_length_is_answered_and_the_next_message_read(tmp_path):
    s = RawServer(tmp_path)
    big = json.dumps(initialize("big")).encode()
    s.send(b"Content-Length: 99999999999999\r\n\r\n" + big + frame(initialize(1)))
    error = s.answer("big")["error"]
    assert error["code"] == -32600 and "over the limit" in error["message"]
    assert "capabilities" in s.answer(1)["result"]
    s.still_serves(2)
    assert s.close() == 0


def test_a_message_over_the_cap_is_skipped_without_holding_it(tmp_path):
    s = RawServer(tmp_path, args=("--max-message-mb", "0.01"))  # 10 KB
    s.send(frame(initialize()))
    s.answer(1)
    text = "x = 1\n" * 20_000  # 120 KB
    did_open = {"uri": "file:///big.py", "languageId": "python", "version": 1, "text": text}
    s.send(frame(request(2, "textDocument/didOpen", {"textDocument": did_open})))  # a request: answered
    assert "over the limit" in s.answer(2)["error"]["message"]
    s.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": did_open}}))
    s.send(frame(request(3, "dfim/documentText", {"uri": "file:///big.py"})))
    assert s.answer(3)["result"] is None  # the document was never opened
    assert s.close() == 0


@pytest.mark.parametrize(
    "attack",
    [
        pytest.param({"name": "content-length"}, id="lowercase-name"),
        pytest.param({"name": "CONTENT-LENGTH"}, id="uppercase-name"),
        pytest.param({"eol": "\n"}, id="lf-only"),
        pytest.param({"delta": -7}, id="length-too-short"),
        pytest.param({"delta": 9}, id="length-too-long"),
    ],
)
def test_odd_headers_and_wrong_lengths_do_not_swallow_the_next_messages(server, attack):
    # issue 34: after a lowercase header, an LF-only header or a wrong length, the next messages were lost
    server.send(frame(request(10, "dfim/documentText", {"uri": "file:///a.py"}), **attack))
    server.send(frame(request(11, "dfim/documentText", {"uri": "file:///b.py"})))
    server.send(frame(request(12, "dfim/documentText", {"uri": "file:///c.py"})))
    assert server.answer(11)["result"] is None
    assert server.answer(12)["result"] is None
    answer = server.answer(10)  # recovered: with the right name, or its length mended from the next frame
    assert answer["result"] is None
    server.still_serves(13)
    assert server.close() == 0


def test_junk_between_frames_is_dropped_and_reading_goes_on(server):
    server.send(b"hello\r\n\r\nX-Nothing: 1\r\n\r\n" + b"\x00\xff" * 5000 + b"\r\n")
    server.send(
        b"Content-Length: abc\r\n\r\n" + frame(request(20, "dfim/documentText", {"uri": "file:///a.py"}))
    )
    assert server.answer(20)["result"] is None
    assert server.close() == 0


def test_a_request_without_jsonrpc_is_answered(server):
    # issue 34: it was never answered
    server.send(frame({"id": 30, "method": "dfim/documentText", "params": {"uri": "file:///a.py"}}))
    assert server.answer(30)["error"]["code"] == -32600
    server.send(frame({"jsonrpc": "1.0", "id": 31, "method": "shutdown"}))
    assert server.answer(31)["error"]["code"] == -32600
    server.still_serves(32)
    assert server.close() == 0


def test_malformed_json_with_a_readable_id_is_answered(server):
    body = b'{"jsonrpc": "2.0", "id": 40, "method": "dfim/documentText", "params": {"uri": nope}}'
    server.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert server.answer(40)["error"]["code"] == -32600
    server.send(frame([request(41, "dfim/documentText", {"uri": "file:///a.py"})]))  # a batch: not LSP
    server.send(
        frame({"jsonrpc": "2.0", "id": {"x": 1}, "method": "dfim/documentText"})
    )  # an id no one can use
    server.still_serves(42)
    assert not any(m.get("id") in (41, {"x": 1}) for m in server.seen)
    assert server.close() == 0


def test_an_object_nested_in_params_is_never_answered(server):
    # issue 34: a JSON-RPC-like object nested in params made the server answer an id the client never sent
    nested = request(999, "textDocument/inlineCompletion", {"bad": 1})
    server.send(frame(request(50, "dfim/documentText", {"uri": "file:///a.py", "x": nested})))
    server.send(
        frame(request(51, "workspace/executeCommand", {"command": "dfim.nothing", "arguments": [nested]}))
    )
    server.answer(50)
    server.answer(51)
    server.still_serves(52)
    assert server.close() == 0
    assert not any(m.get("id") == 999 for m in server.seen)


def test_the_server_goes_on_after_every_attack_in_one_stream(tmp_path):
    s = RawServer(tmp_path)
    s.send(
        b"Content-Length: 99999999999999\r\n\r\n{}"
        + frame(initialize())
        + frame(request(2, "dfim/documentText", {"uri": "file:///a.py"}), name="content-length")
        + frame(request(3, "dfim/documentText", {"uri": "file:///a.py"}), eol="\n")
        + frame(request(4, "dfim/documentText", {"uri": "file:///a.py"}), delta=-4)
        + frame(request(5, "dfim/documentText", {"uri": "file:///a.py"}), delta=+6)
        + frame({"id": 6, "method": "dfim/documentText", "params": {}})
        + b"Content-Length: 10\r\n\r\n{not json}"
    )
    assert "result" in s.answer(1)
    for msg_id in (2, 3, 4, 5):
        assert s.answer(msg_id)["result"] is None
    assert "error" in s.answer(6)
    s.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    doc = {"uri": "file:///t.py", "languageId": "python", "version": 1, "text": "def f(x):\n    return \n"}
    s.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}}))
    inline = {
        "textDocument": {"uri": "file:///t.py"},
        "position": {"line": 1, "character": 11},
        "context": {"triggerKind": 1},
    }
    s.send(frame(request(7, "textDocument/inlineCompletion", inline)))
    assert "error" not in s.answer(7)  # no model: an answer with no completions
    assert s.close() == 0
    assert "Traceback" not in s.stderr()


# ---- end to end: the client never answers the server's requests ---------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("model"))


def test_commands_and_resolve_answer_when_the_client_never_answers(tmp_path, checkpoint):
    # issue 34: resolve or a dfim.* command waited for ever on window/workDoneProgress/create or
    # workspace/applyEdit that the client did not answer; workspace/configuration held the model load too
    s = RawServer(tmp_path, model=checkpoint, args=("--client-timeout", "1"))
    capabilities = {
        "window": {"workDoneProgress": True},
        "workspace": {"applyEdit": True, "configuration": True},
        "textDocument": {"codeAction": {"resolveSupport": {"properties": ["edit"]}, "dataSupport": True}},
    }
    s.send(frame(initialize(capabilities=capabilities)))
    s.answer(1)
    s.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    s.server_request("workspace/configuration")  # never answered
    s.wait_ready()
    text = "def f(x):\n    return x\n\n\ndef g(y):\n    pass\n"
    doc = {"uri": "file:///t.py", "languageId": "python", "version": 1, "text": text}
    s.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}}))
    whole = {"start": {"line": 4, "character": 0}, "end": {"line": 6, "character": 0}}

    started = time.monotonic()
    command = {"command": "dfim.rewriteSelection", "arguments": [doc["uri"], whole, "make it shorter"]}
    s.send(frame(request(2, "workspace/executeCommand", command)))
    answer = s.answer(2, timeout=60)
    assert any(m.get("method") == "window/workDoneProgress/create" for m in s.seen)  # sent, never answered
    if "result" in answer:  # the model wrote an edit: applyEdit was sent, never answered, and timed out
        assert any(m.get("method") == "workspace/applyEdit" for m in s.seen)
        assert answer["result"]["applied"] is False and answer["result"]["edit"]
    else:  # a random model may write nothing usable: an error, but an answer
        assert answer["error"]["message"].startswith("dfim")
    assert time.monotonic() - started < 60

    params = {"textDocument": {"uri": doc["uri"]}, "range": whole, "context": {"diagnostics": []}}
    s.send(frame(request(3, "textDocument/codeAction", params)))
    actions = s.answer(3)["result"]
    assert actions
    s.send(frame(request(4, "codeAction/resolve", actions[0])))
    assert "result" in s.answer(4, timeout=60) or "error" in s.answer(4)
    assert "did not answer" in s.stderr() or "window/workDoneProgress/create" in s.stderr()
    assert s.close() == 0


# ---- the reader in process ------------------------------------------------------------------------------


class ListSource:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    async def read_some(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def read_all(data: bytes | list[bytes], max_bytes: int = 1 << 20) -> list:
    async def go():
        reader = FrameReader(ListSource(data if isinstance(data, list) else [data]), max_bytes)
        out = []
        while (item := await reader.next()) is not None:
            out.append(item.value if isinstance(item, Message) else item)
        return out

    return asyncio.run(go())


def test_the_reader_takes_any_case_crlf_or_lf_and_other_headers():
    one, two = request(1, "a"), request(2, "b")
    body = json.dumps(two).encode()
    data = frame(one, name="cOnTeNt-LeNgTh") + b"Content-Type: application/vscode-jsonrpc; charset=utf-8\n"
    data += b"content-length:%d\n\n" % len(body) + body
    assert read_all(data) == [one, two]


def test_the_reader_recovers_wrong_lengths_split_across_reads():
    one, two, three = request(1, "a"), request(2, "b"), request(3, "c")
    data = frame(one, delta=5) + frame(two, delta=-3) + frame(three)
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]
    assert read_all(chunks) == [one, two, three]


def test_the_reader_skips_an_oversized_frame_and_keeps_its_id():
    big = request(7, "textDocument/didOpen", {"text": "x" * 5000})
    (bad, after) = read_all(frame(big) + frame(request(8, "b")), max_bytes=1000)
    assert (bad.msg_id, bad.method) == (7, "textDocument/didOpen") and "over the limit" in bad.reason
    assert after == request(8, "b")


def test_peek_request_reads_only_the_top_level():
    nested = b'{"params": {"id": 5, "method": "x"}, "jsonrpc": "2.0", "id": 3, "method": "m", "x": [tru'
    assert peek_request(nested) == (3, "m", False)
    assert peek_request(b'{"params": {"id": 5, "method": "x"}, "id"') == (None, None, False)
    assert peek_request(b'{"id": true, "method": "m"}') == (None, "m", False)
    assert peek_request(b'{"id": "r1", "result": [1, 2') == ("r1", None, True)


def test_an_unreadable_answer_to_apply_edit_fails_the_edit_at_once(tmp_path, checkpoint):
    # `result: null` to workspace/applyEdit (the protocol wants `{"applied": ...}`): pygls could not read it,
    # showed "Error in server: Invalid Params" and the command waited out the client timeout (30 s)
    s = RawServer(tmp_path, model=checkpoint)
    s.send(frame(initialize(capabilities={"workspace": {"applyEdit": True}})))
    s.answer(1)
    s.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    s.wait_ready()
    text = "def f(x):\n    return x\n\n\ndef g(y):\n    pass\n"
    # plain text: a random model's rewrite of Python would not parse, and is refused before any applyEdit
    doc = {"uri": "file:///t.txt", "languageId": "plaintext", "version": 1, "text": text}
    s.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}}))
    whole = {"start": {"line": 4, "character": 0}, "end": {"line": 6, "character": 0}}
    command = {"command": "dfim.rewriteSelection", "arguments": [doc["uri"], whole, "make it shorter"]}
    s.send(frame(request(2, "workspace/executeCommand", command)))
    apply = s.server_request("workspace/applyEdit", timeout=120)
    started = time.monotonic()
    s.send(frame({"jsonrpc": "2.0", "id": apply["id"], "result": None}))
    answer = s.answer(2, timeout=60)
    assert time.monotonic() - started < 10  # not the 30 s client timeout
    assert answer["result"]["applied"] is False and answer["result"]["edit"]
    shown = [m["params"]["message"] for m in s.seen if m.get("method") == "window/showMessage"]
    assert not any("Error in server" in message for message in shown), shown
    assert "could not be read" in s.stderr()
    s.still_serves(3)
    assert s.close() == 0
