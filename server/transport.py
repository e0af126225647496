"""The wire: LSP base-protocol framing that no frame can kill and no bad frame can desynchronise.

pygls reads frames with `run_async` (pygls/io_.py): a header must be exactly `Content-Length: N\\r\\n`
(a lowercase name or an LF line end is not seen, and the frame is skipped together with the next ones),
`N` bytes are read in one call whatever `N` is (`Content-Length: 99999999999999` raised MemoryError and the
server exited), and `json.loads(..., object_hook=structure_message)` turns every JSON-RPC-like object nested
in params into a message of its own (the server then answered an id the client never sent).

`FrameReader` replaces that loop; `DfimProtocol.receive` (server/app.py) takes what it reads:

- header names are compared without case, lines end in CRLF (a lone LF is accepted too);
- a frame longer than the cap (`dfim serve --max-message-mb`, 32 MB by default) is never held in memory:
  its first 64 KB are kept to find its id (the request is answered with an error), the rest is skipped;
- a header block without a usable `Content-Length`, or bytes between frames, are dropped with a log line,
  and reading goes on at the next `Content-Length` header;
- a body that is not JSON is answered with an error when its top-level id and method can be read. When a
  wrong `Content-Length` is the cause, the message is recovered: a length too long swallows the start of
  the next frame, whose header is found in the body and put back; a length too short leaves the body's
  end in front of the next header, where it is found and joined back.

A header inside a body cannot be mistaken for a frame: `Content-Length: 12` followed by a raw line end is
not valid JSON anywhere (outside strings it is a bare word, inside them a raw line end is not allowed).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import re
import threading
from dataclasses import dataclass
from typing import Any

from pygls.exceptions import JsonRpcException

log = logging.getLogger("dfim.server.transport")

DEFAULT_MAX_MESSAGE_BYTES = 32 * 1024 * 1024
HEAD_BYTES = 64 * 1024  # of an oversized frame, kept to read its id and method
MAX_HEADER_LINE = 8 * 1024  # a longer "header line" is junk
CHUNK = 1 << 20
TRUNCATED_WAIT_S = 0.2  # how long a truncated body waits for the rest of itself to show up

HEADER_LINE = re.compile(rb"^([-!#$%&'*+.^_`|~0-9A-Za-z]+)[ \t]*:[ \t]*(.*?)[ \t]*\r?\n$")
# where a frame starts inside other bytes: a Content-Length or Content-Type header and its line end
FRAME_START = re.compile(rb"content-(?:length[ \t]*:[ \t]*\d{1,20}|type[ \t]*:[^\r\n{}\"]{0,200})\r?\n", re.I)
LENGTH_NAME = re.compile(rb"content-length[ \t]*:", re.I)


class ClientTimeout(JsonRpcException):
    """The client did not answer a request of the server's in time (`DfimProtocol.send_request`)."""

    def __init__(self, method: str, seconds: float) -> None:
        super().__init__(f"the client did not answer {method} within {seconds:g} s", code=-32803)


@dataclass
class Message:
    """A frame whose body is JSON (any JSON value: `DfimProtocol.receive` decides what is a message)."""

    value: Any


@dataclass
class Bad:
    """A frame that cannot be handled. `msg_id`/`method` are the body's top-level ones where they could be
    read (a request is then answered with an error); `reason` is for the log and the error message."""

    reason: str
    msg_id: int | str | None = None
    method: str | None = None
    is_response: bool = False


class ThreadSource:
    """Bytes from a blocking binary stream (stdin), read on demand by a daemon thread: one read in flight at a
    time, so nothing is read ahead of what the reader asked for, and a read still blocked when the server
    exits does not hold the process (pygls read stdin in its thread pool, whose shutdown waits for it)."""

    def __init__(self, stream, chunk: int = CHUNK) -> None:
        self._read = getattr(stream, "read1", None) or stream.read
        self._chunk = chunk
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    async def read_some(self) -> bytes:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="dfim-stdin", daemon=True)
            self._thread.start()
        self._requests.put((loop, future))
        return await future

    def _run(self) -> None:
        while True:
            loop, future = self._requests.get()
            try:
                data = self._read(self._chunk)
            except (OSError, ValueError) as exc:  # closed or broken: the end of the input
                log.warning("reading the input failed: %s", exc)
                data = b""
            try:
                loop.call_soon_threadsafe(_resolve, future, bytes(data or b""))
            except RuntimeError:  # the loop has closed
                return
            if not data:
                return


def _resolve(future: asyncio.Future, data: bytes) -> None:
    if not future.done():
        future.set_result(data)


class StreamSource:
    """Bytes from an asyncio stream (a TCP connection)."""

    def __init__(self, reader: asyncio.StreamReader, chunk: int = CHUNK) -> None:
        self._reader, self._chunk = reader, chunk

    async def read_some(self) -> bytes:
        try:
            return await self._reader.read(self._chunk)
        except (ConnectionError, OSError) as exc:
            log.info("the connection failed: %s", exc)
            return b""


class FrameReader:
    """Frames from a byte source: `await next()` gives a `Message`, a `Bad` frame, or None at the end."""

    def __init__(self, source, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.source = source
        self.max_bytes = max_bytes
        self.buf = bytearray()
        self.eof = False
        self._pending: asyncio.Future | None = None
        self._skipping = 0  # bytes of an oversized frame still to drop

    # ---- bytes ---------------------------------------------------------------------------------------

    async def _fill(self, timeout: float | None = None) -> bool:
        """Read more into the buffer; False at the end of the input or when `timeout` passes first (the read
        then stays in flight, and its bytes are kept by the next call)."""
        if self.eof:
            return False
        if self._pending is None:
            self._pending = asyncio.ensure_future(self.source.read_some())
        done, _ = await asyncio.wait({self._pending}, timeout=timeout)
        if not done:
            return False
        data, self._pending = self._pending.result(), None
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def _readline(self) -> bytes | None:
        """One line with its line end; an overlong run of bytes without one comes back as it is (junk, its
        last bytes kept in case a header starts there); None at the end of the input."""
        while True:
            end = self.buf.find(b"\n")
            if end >= 0:
                line = bytes(self.buf[: end + 1])
                del self.buf[: end + 1]
                return line
            if len(self.buf) > MAX_HEADER_LINE:
                line = bytes(self.buf[:-32])
                del self.buf[:-32]
                return line
            if not await self._fill():
                if self.buf:
                    line = bytes(self.buf)
                    self.buf.clear()
                    return line
                return None

    async def _read_body(self, n: int) -> bytes | None:
        """`n` bytes, or fewer when the next frame starts before them (the length was too long: a body cannot
        hold a frame start); None at the end of the input."""
        scanned = 0
        while True:
            found = FRAME_START.search(self.buf, max(0, scanned - 256))
            if found and found.start() < n:
                start = _header_block_start(self.buf, found.start())
                log.warning("a Content-Length of %d is too long: the next frame starts at byte %d", n, start)
                n = start
                break
            if len(self.buf) >= n:
                break
            scanned = len(self.buf)
            if not await self._fill():
                return None
        body = bytes(self.buf[:n])
        del self.buf[:n]
        return body

    # ---- frames --------------------------------------------------------------------------------------

    async def _read_headers(self) -> int | None:
        """The Content-Length of the next well-formed header block; junk before it is dropped with a log
        line. None at the end of the input."""
        fields: dict[bytes, bytes] = {}
        while True:
            line = await self._readline()
            if line is None:
                if fields:
                    log.warning("the input ended inside a header block: dropped")
                return None
            if not line.strip(b"\r\n"):
                if not fields:
                    continue  # a stray line end between frames
                length = _content_length(fields)
                if length is not None:
                    return length
                log.warning(
                    "dropped a header block without a valid Content-Length: %r",
                    {k.decode("latin-1"): v.decode("latin-1")[:40] for k, v in fields.items()},
                )
                fields = {}
                continue
            match = HEADER_LINE.match(line)
            if match:
                fields[match.group(1).lower()] = match.group(2)
                continue
            start = LENGTH_NAME.search(line, 1)
            if start:  # junk, then a header: read on from the header
                self.buf[0:0] = line[start.start() :]
                line = line[: start.start()]
            log.warning("dropped %d bytes that are not a header: %r", len(line), line[:60])
            fields = {}

    async def next(self) -> Message | Bad | None:
        if self._skipping:
            await self._skip()
        length = await self._read_headers()
        if length is None:
            return None
        if length > self.max_bytes:
            return await self._skip_oversized(length)
        body = await self._read_body(length)
        if body is None:
            log.warning("the input ended inside a body of %d bytes: dropped", length)
            return None
        try:
            return Message(json.loads(body))
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            return await self._recover(body, exc)

    async def _skip_oversized(self, length: int) -> Bad:
        """A frame over the cap is never held: its head is kept (whatever comes within a moment, up to 64 KB)
        to answer it at once; the rest is dropped as it comes, by the next call (`_skip`)."""
        cap = self.max_bytes
        limit = f"{cap // (1024 * 1024)} MB" if cap >= 1024 * 1024 else f"{cap} bytes"
        reason = f"a message of {length} bytes is over the limit of {limit} (dfim serve --max-message-mb)"
        log.warning("%s: skipped", reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRUNCATED_WAIT_S
        want = min(length, HEAD_BYTES)
        while len(self.buf) < want and not FRAME_START.search(self.buf):
            left = deadline - loop.time()
            if left <= 0 or not await self._fill(timeout=left):
                break
        head = bytes(self.buf[:want])
        found = FRAME_START.search(head)
        if found:
            head = head[: _header_block_start(head, found.start())]
        del self.buf[: len(head)]
        self._skipping = length - len(head)
        if found:
            self._skipping = 0
            log.warning("a frame starts inside the skipped message: reading on from there")
        return _bad(reason, head)

    async def _skip(self) -> None:
        """Drop the rest of an oversized frame as it comes; stop early where the next frame starts (a body
        cannot contain one, so the length was wrong)."""
        tail = b""
        while self._skipping > 0:
            if not self.buf and not await self._fill():
                break
            take = min(self._skipping, len(self.buf))
            chunk = bytes(self.buf[:take])
            del self.buf[:take]
            self._skipping -= take
            window = tail + chunk
            found = FRAME_START.search(window)
            if found:
                self.buf[0:0] = window[_header_block_start(window, found.start()) :]
                log.warning("a frame starts inside the skipped message: reading on from there")
                break
            tail = window[-256:]
        self._skipping = 0

    async def _recover(self, body: bytes, error: ValueError) -> Message | Bad:
        value, extra = _json_then_header(body)
        if (
            extra is not None
        ):  # Content-Length too long: the next header had not all come when the body was cut
            self.buf[0:0] = extra
            log.warning("a Content-Length was too long by %d bytes: the message was recovered", len(extra))
            return Message(value)
        rest = (
            await self._rest_before_next_frame()
        )  # Content-Length too short: the rest is before the next frame
        if rest is not None:
            try:
                value = json.loads(body + rest)
            except ValueError:
                pass
            else:
                del self.buf[: len(rest)]
                log.warning(
                    "a Content-Length was too short by %d bytes: the message was recovered", len(rest)
                )
                return Message(value)
        reason = f"the body is not JSON ({_first_line(error)})"
        log.warning("%s: dropped", reason)
        return _bad(reason, body)

    async def _rest_before_next_frame(self) -> bytes | None:
        """The bytes in front of the next frame's header, when it comes soon (without consuming them)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRUNCATED_WAIT_S
        while True:
            found = FRAME_START.search(self.buf)
            if found:
                start = _header_block_start(self.buf, found.start())
                return bytes(self.buf[:start]) if start > 0 else None
            left = deadline - loop.time()
            if left <= 0 or len(self.buf) > self.max_bytes or not await self._fill(timeout=left):
                return None


def _content_length(fields: dict[bytes, bytes]) -> int | None:
    value = fields.get(b"content-length", b"").strip()
    return int(value) if value.isdigit() and len(value) <= 20 else None


def _header_block_start(data, at: int) -> int:
    """Where the header block holding the header found at `at` starts: a Content-Type line can come first."""
    before = data.rfind(b"\n", 0, at)
    if before > 0:
        previous = data.rfind(b"\n", 0, before) + 1
        if re.match(rb"content-type[ \t]*:", bytes(data[previous:before]), re.I):
            return previous
    return at


def _json_then_header(body: bytes) -> tuple[Any, bytes | None]:
    """(value, the rest) when `body` is one JSON value followed by the start of a header; else (None, None)."""
    try:
        text = body.decode("utf-8")
        value, end = json.JSONDecoder().raw_decode(text, _skip(text, 0))
    except ValueError:
        return None, None
    extra = text[end:].lstrip(" \t\r\n")
    if extra and ("content-".startswith(extra[:8].lower()) or extra[:8].lower() == "content-"):
        return value, extra.encode("utf-8")
    return None, None


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0][:120]


def _bad(reason: str, data: bytes) -> Bad:
    msg_id, method, is_response = peek_request(data)
    return Bad(reason, msg_id, method, is_response)


def valid_id(value) -> bool:
    """A JSON-RPC id the server may answer: an integer or a string (never a bool, a float, null or an object)."""
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def peek_request(data: bytes) -> tuple[int | str | None, str | None, bool]:
    """(id, method, is_response) of a JSON object's top level, read as far as the bytes go: a truncated or
    broken body still shows the keys that come before the break. Keys of nested objects are never seen, so
    an id found here is one the client sent as the message's own."""
    text = data.decode("utf-8", "replace")
    decoder = json.JSONDecoder()
    found: dict[str, Any] = {}
    keys: set[str] = set()  # with a value or not (a truncated result is still a result)
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return None, None, False
    i += 1
    try:
        while True:
            i = _skip(text, i)
            if text.startswith("}", i):
                break
            key, i = decoder.raw_decode(text, i)
            i = _skip(text, i)
            if not isinstance(key, str) or not text.startswith(":", i):
                break
            keys.add(key)
            value, i = decoder.raw_decode(text, _skip(text, i + 1))
            found[key] = value
            i = _skip(text, i)
            if not text.startswith(",", i):
                break
            i += 1
    except (ValueError, IndexError):
        pass
    msg_id = found.get("id") if valid_id(found.get("id")) else None
    method = found.get("method") if isinstance(found.get("method"), str) else None
    return msg_id, method, "method" not in keys and ("result" in keys or "error" in keys)


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i
