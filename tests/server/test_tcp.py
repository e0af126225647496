"""`dfim serve --tcp` (server/tcp.py) under attack, with a real process and raw sockets.

issue 34: any local process could connect without initializing, read documents, and take the editor's
replies; a connect-and-close (a port scan) shut the server down. Here a port scan, a client that skips
initialize, a wrong token and a second client holding the right token all fail, and the owner keeps working.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time

import pytest

from tests.server.test_transport import frame, request
from tests.server_helpers import ROOT


class Peer:
    """One TCP connection speaking raw frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> dict | None:
        """The next message, or None when the server closed the connection."""
        while True:
            head, sep, rest = self.buf.partition(b"\r\n\r\n")
            if sep:
                length = int(re.search(rb"Content-Length: (\d+)", head).group(1))
                if len(rest) >= length:
                    self.buf = rest[length:]
                    return json.loads(rest[:length])
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:  # closed with our bytes unread: refused all the same
                return None
            if not data:
                return None
            self.buf += data

    def answer(self, msg_id) -> dict | None:
        while (message := self.read()) is not None:
            if message.get("id") == msg_id and "method" not in message:
                return message
        return None

    def close(self) -> None:
        self.sock.close()


def initialize(msg_id, token) -> bytes:
    options = {"telemetry": {"enabled": False}, **({"token": token} if token is not None else {})}
    return frame(request(msg_id, "initialize", {"capabilities": {}, "initializationOptions": options}))


@pytest.fixture
def tcp_server(tmp_path):
    token_file = tmp_path / "token"
    env = {**os.environ, "DFIM_DATA_DIR": str(tmp_path / "data"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dfim",
            "serve",
            "--model",
            "/no/such/model",
            "--tcp",
            "0",
            "--token-file",
            str(token_file),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=str(ROOT),
        env=env,
    )
    line = proc.stderr.readline().decode()
    assert "--model /no/such/model: no such folder" in line  # said at once; the server starts anyway
    line = proc.stderr.readline().decode()
    match = re.search(r"listening on (\S+):(\d+); the token is in (.+)$", line.strip())
    assert match, line
    yield proc, match.group(1), int(match.group(2)), token_file
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_tcp_is_loopback_with_a_private_token_file(tcp_server):
    proc, host, port, token_file = tcp_server
    assert host == "127.0.0.1"  # no host given: loopback
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(token_file.read_text().strip()) >= 32


def test_only_the_client_with_the_token_owns_the_server(tcp_server):
    proc, _, port, token_file = tcp_server
    token = token_file.read_text().strip()

    scan = Peer(port)  # a port scan: connect and close, many times
    scan.close()
    for _ in range(5):
        Peer(port).close()
    time.sleep(0.3)
    assert proc.poll() is None

    sneaky = Peer(port)  # skips initialize: answered with an error, then closed
    sneaky.send(frame(request(1, "dfim/documentText", {"uri": "file:///secret.py"})))
    assert sneaky.answer(1)["error"]["code"] == -32002
    assert sneaky.read() is None

    for wrong in (None, "nope", token + "x"):
        guess = Peer(port)
        guess.send(initialize(1, wrong))
        assert guess.answer(1)["error"]["code"] == -32001
        assert guess.read() is None
    assert proc.poll() is None

    owner = Peer(port)
    owner.send(initialize(1, token))
    assert "capabilities" in owner.answer(1)["result"]
    owner.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    doc = {"uri": "file:///secret.py", "languageId": "python", "version": 1, "text": "KEY = 'hunter2'\n"}
    owner.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": doc}}))

    second = Peer(port)  # even with the token: refused, and it cannot take the owner's replies
    second.send(initialize(1, token) + frame(request(2, "dfim/documentText", {"uri": doc["uri"]})))
    assert second.read() is None

    owner.send(frame(request(3, "dfim/documentText", {"uri": doc["uri"]})))
    assert owner.answer(3)["result"]["text"] == doc["text"]
    owner.send(frame(request(4, "shutdown")) + frame({"jsonrpc": "2.0", "method": "exit", "params": None}))
    assert owner.answer(4) == {"jsonrpc": "2.0", "id": 4, "result": None}
    assert proc.wait(timeout=30) == 0


def test_a_silent_connection_does_not_block_the_owner(tcp_server):
    proc, _, port, token_file = tcp_server
    silent = Peer(port)  # connected, says nothing: the real client still gets in
    owner = Peer(port)
    owner.send(initialize(1, token_file.read_text().strip()))
    assert "result" in owner.answer(1)
    silent.close()
    owner.close()  # the owner leaving ends the server
    assert proc.wait(timeout=30) == 0


def test_the_token_file_goes_with_the_server(tcp_server):
    """A stopped server's token is no use: SIGTERM (as a launcher or `kill` stops it) ends the server
    cleanly and removes the file, instead of leaving one per port in the data dir."""
    proc, _, _, token_file = tcp_server
    assert token_file.exists()
    proc.terminate()
    assert proc.wait(timeout=30) == 0
    assert not token_file.exists()
