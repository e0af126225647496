"""`dfim serve --tcp`: one authenticated session, on loopback unless a host is named.

pygls's `start_tcp` let any local process connect without initializing, made the latest connection the one
the server answered (the editor's replies then went to it), and shut the server down when any connection
closed (a port scan stopped it). Here:

- a token is generated at start and written to a 0600 file (`token_path`); the client passes it as
  `initializationOptions.token` in `initialize`, which must be its first message. A connection whose first
  message is anything else, or a wrong token, gets an error and is closed; one that says nothing within
  `AUTH_TIMEOUT_S` is closed;
- the first connection that initializes owns the server for its lifetime: a later connection is closed at
  once, and nothing it sends reaches the server;
- connections that close before initializing change nothing; the server ends when its owner's connection
  closes (or on `exit`), as on stdio when the input ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import signal
import sys
from pathlib import Path

from dfim.server.transport import FrameReader, Message, StreamSource, valid_id

log = logging.getLogger("dfim.server.tcp")

AUTH_TIMEOUT_S = 10.0
MAX_WAITING = 8  # connections not yet initialized, at once
UNAUTHORIZED = -32001  # JSON-RPC server error range: the token is missing or wrong
SERVER_NOT_INITIALIZED = -32002


def token_path(data_dir: Path, port: int) -> Path:
    return Path(data_dir) / f"serve-{port}.token"


def write_token(path: Path, token: str) -> None:
    """The token in a file only its owner can read (0600; the folder is made 0700 when new)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # a file that was already there keeps its mode otherwise
        os.write(fd, token.encode() + b"\n")
    finally:
        os.close(fd)


def error_frame(msg_id, code: int, message: str) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class TcpSessions:
    """Accepts connections for one `DfimServer` and hands the authenticated one to it."""

    def __init__(self, ls, token: str) -> None:
        self.ls = ls
        self.token = token
        self.owner: asyncio.StreamWriter | None = None
        self.waiting = 0
        self.finished = asyncio.Event()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self.owner is not None or self.waiting >= MAX_WAITING:
            why = "a client already owns this server" if self.owner is not None else "too many connections"
            log.warning("refused a connection from %s: %s", peer, why)
            await _close(writer)
            return
        self.waiting += 1
        frames = FrameReader(StreamSource(reader), self.ls.max_message_bytes)
        try:
            item = await asyncio.wait_for(frames.next(), AUTH_TIMEOUT_S)
        except asyncio.TimeoutError:
            item = None
            log.warning("closed a connection from %s: no initialize within %g s", peer, AUTH_TIMEOUT_S)
        finally:
            self.waiting -= 1
        if not self._admit(item, writer, peer):
            await _close(writer)
            return
        self.owner = writer
        log.info("the client at %s owns the server", peer)
        self.ls.protocol.set_writer(writer)
        try:
            self.ls.protocol.receive(item.value)
            await self.ls.serve_frames(frames)
        finally:
            log.info("the client at %s is gone: stopping", peer)
            self.finished.set()

    def _admit(self, item, writer: asyncio.StreamWriter, peer) -> bool:
        """Whether the first message is `initialize` with the right token (it is then taken out of the
        options); anything else is answered with an error where it has an id."""
        value = item.value if isinstance(item, Message) else None
        if not isinstance(value, dict):
            if item is not None:
                log.warning("closed a connection from %s: its first frame is not a message", peer)
            return False
        msg_id = value.get("id")
        answerable = valid_id(msg_id) and "method" in value
        if value.get("method") != "initialize":
            log.warning("closed a connection from %s: its first message is not initialize", peer)
            if answerable:
                writer.write(error_frame(msg_id, SERVER_NOT_INITIALIZED, "initialize first, with the token"))
            return False
        params = value.get("params")
        options = params.get("initializationOptions") if isinstance(params, dict) else None
        given = options.pop("token", None) if isinstance(options, dict) else None
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self.token.encode()):
            log.warning("closed a connection from %s: %s token", peer, "a wrong" if given else "no")
            if answerable:
                message = (
                    "dfim serve --tcp: initializationOptions.token is missing or wrong (see the token file)"
                )
                writer.write(error_frame(msg_id, UNAUTHORIZED, message))
            return False
        if self.owner is not None:  # another connection initialized first
            if answerable:
                writer.write(error_frame(msg_id, UNAUTHORIZED, "a client already owns this server"))
            return False
        return True


async def _close(writer: asyncio.StreamWriter) -> None:
    try:
        writer.close()
        await writer.wait_closed()
    except (ConnectionError, OSError):
        pass


def serve_tcp(ls, host: str, port: int, token_file: Path | None = None) -> None:
    """Listen on host:port until the owning client's connection closes (or `exit`). The token is written
    once the port is known (`--tcp HOST:0` picks one), before any connection is handled."""
    from dfim.server.telemetry import data_dir

    token = secrets.token_urlsafe(32)

    async def main() -> None:
        sessions = TcpSessions(ls, token)
        ls._server = await asyncio.start_server(sessions.connection, host, port)
        bound = ls._server.sockets[0].getsockname()
        path = Path(token_file) if token_file else token_path(data_dir(), bound[1])
        write_token(path, token)
        try:  # a token of a server that is gone is no use to anyone: it goes with the server
            with contextlib.suppress(NotImplementedError, RuntimeError):  # no signal handlers here
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, sessions.finished.set)
            # on stderr whatever the log level: the user (or the editor's launcher) needs both
            print(
                f"dfim serve: listening on {bound[0]}:{bound[1]}; the token is in {path}",
                file=sys.stderr,
                flush=True,
            )
            if not ipaddress.ip_address(bound[0]).is_loopback:
                log.warning("listening on %s, not on loopback: other machines can reach the port", bound[0])
            async with ls._server:
                await sessions.finished.wait()
        finally:
            path.unlink(missing_ok=True)

    asyncio.run(main())
