"""The JSON-RPC side of the server: which frames are messages, what a bad one is answered, and timeouts on
the server's own requests to the client (the LSP handlers stay pygls's)."""

from __future__ import annotations

import asyncio
import logging
import uuid

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams, JsonRpcInvalidRequest
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import RPCRequest
from pygls.protocol.language_server import lsp_method

from dfim.server.documents import choose_encoding
from dfim.server.transport import (
    Bad,
    ClientTimeout,
    valid_id,
)

log = logging.getLogger("dfim.server")
DEFAULT_CLIENT_TIMEOUT_S = 30.0  # for the server's own requests to the client (`DfimProtocol.send_request`)


class Unreadable:
    """A message whose params did not validate, already answered (`DfimProtocol.structure_message`)."""

    jsonrpc = None  # never handled: `DfimProtocol.handle_message` drops it


class OneLineDeserializeErrors(logging.Filter):
    """pygls logs a message whose params do not validate as a traceback at ERROR before
    `DfimProtocol.structure_message` answers it; dfim logs such a message in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Unable to deserialize message")


def one_line(error: BaseException | None) -> str:
    """The first line of why a message did not validate (cattrs' errors run over many lines)."""
    text = str(error or "").strip().splitlines()
    return text[0][:200] if text else type(error).__name__


class DfimProtocol(LanguageServerProtocol):
    """pygls's protocol with these changes: UTF-8 is chosen whenever offered; document sync goes only to our
    own store (pygls's would split lines on separators LSP does not count); a request whose params do not
    validate, or that comes after `shutdown`, is answered with an error (pygls answered nothing, and the
    client waited for ever); an error answer the server meant to give is logged in a line, not as a
    traceback at ERROR level.

    Messages come from `dfim.server.transport.FrameReader` through `receive`, which only takes a top-level
    JSON object as a message (pygls structured every nested object that looked like one). A request without
    `"jsonrpc": "2.0"`, or a frame that cannot be read but shows its top-level id and method, is answered
    with InvalidRequest; anything else unreadable is dropped with a log line. The server's own requests to
    the client fail with `ClientTimeout` after `client_timeout` seconds, so a handler awaiting one (progress,
    applyEdit, configuration) still answers its own request."""

    client_timeout: float = DEFAULT_CLIENT_TIMEOUT_S

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        pygls_log = logging.getLogger("pygls.protocol.json_rpc")
        if not any(isinstance(f, OneLineDeserializeErrors) for f in pygls_log.filters):
            pygls_log.addFilter(OneLineDeserializeErrors())

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as exc:
            if isinstance(data, dict) and "method" not in data and data.get("id") in self._request_futures:
                self._answer_unreadable(data["id"], one_line(exc.__cause__))
                return Unreadable()
            if not isinstance(data, dict) or "method" not in data:
                raise
            method, reason = data.get("method"), one_line(exc.__cause__)
            if "id" in data:
                error = JsonRpcInvalidParams(f"{method}: the params do not match the protocol")
                self._send_response(data["id"], error=error.to_response_error())
                log.info("request %s (%s) answered InvalidParams: %s", data["id"], method, reason)
            else:
                log.warning(
                    "ignored %s notification: its params do not match the protocol (%s)", method, reason
                )
            return Unreadable()

    def receive(self, value) -> None:
        """Handle one frame's JSON value: a message only if it is an object with `"jsonrpc": "2.0"`."""
        if not isinstance(value, dict):
            log.warning(
                "dropped a frame holding a JSON %s, not an object (batches are not LSP)", type(value).__name__
            )
            return
        msg_id, method = value.get("id"), value.get("method")
        if "id" in value and not valid_id(msg_id):
            log.warning("dropped a message whose id is not an integer or a string: %.60r", msg_id)
            return
        if value.get("jsonrpc") != "2.0" or ("method" in value and not isinstance(method, str)):
            why = "method is not a string" if value.get("jsonrpc") == "2.0" else 'it has no "jsonrpc": "2.0"'
            if "id" in value and "method" in value:
                self._send_response(
                    msg_id, error=JsonRpcInvalidRequest(f"invalid request: {why}").to_response_error()
                )
                log.info("request %s answered InvalidRequest: %s", msg_id, why)
            else:
                log.warning("dropped a message: %s", why)
            return
        try:
            self.handle_message(self.structure_message(value))
        except Exception as exc:  # as pygls's loop did: one message fails, the server goes on
            log.exception("could not handle a %s message", method or "response")
            self._server._report_server_error(exc, JsonRpcException)

    def reject(self, bad: Bad) -> None:
        """A frame that could not be read: answer it where its top-level id and method were read."""
        if bad.msg_id is not None and bad.method is not None:
            error = JsonRpcInvalidRequest(f"{bad.method}: {bad.reason}")
            self._send_response(bad.msg_id, error=error.to_response_error())
            log.info("request %s (%s) answered InvalidRequest: %s", bad.msg_id, bad.method, bad.reason)
        elif bad.is_response and bad.msg_id in self._request_futures:
            self._answer_unreadable(bad.msg_id, bad.reason)

    def _answer_unreadable(self, msg_id, reason: str) -> None:
        """The client answered a request of the server's with something that cannot be read (a frame, or a
        result of the wrong shape: `null` to applyEdit): the request fails now, with a log line, instead of
        waiting out its timeout and showing the user a server error."""
        future = self._request_futures.pop(msg_id)
        self._result_types.pop(msg_id, None)
        log.warning("the client's answer to request %s could not be read: %s", msg_id, reason)
        if not future.done():
            future.set_exception(JsonRpcException(f"the client's answer could not be read: {reason}"))

    def send_request(self, method, params=None, callback=None, msg_id=None):
        msg_id = msg_id if msg_id is not None else str(uuid.uuid4())
        future = super().send_request(method, params, callback, msg_id)
        timeout = self.client_timeout
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return future
        if timeout and timeout > 0:
            handle = loop.call_later(timeout, self._client_timed_out, msg_id, method, future, timeout)
            future.add_done_callback(lambda _f: handle.cancel())
        return future

    def _client_timed_out(self, msg_id, method: str, future, timeout: float) -> None:
        if future.done():
            return
        if self._request_futures.get(msg_id) is future:
            del self._request_futures[msg_id]
        self._result_types.pop(msg_id, None)
        log.warning(
            "the client did not answer %s (id %s) within %g s: going on without it", method, msg_id, timeout
        )
        future.set_exception(ClientTimeout(method, timeout))

    def handle_message(self, message) -> None:
        if isinstance(message, Unreadable):
            return  # answered (a request) or logged (a notification) in structure_message
        if self._shutdown and isinstance(message, RPCRequest) and message.method != types.EXIT:
            error = JsonRpcInvalidRequest(f"{message.method}: the server is shutting down")
            self._send_response(message.id, error=error.to_response_error())
            return
        super().handle_message(message)

    def _handle_cancel_notification(self, msg_id) -> None:
        # A cancel for a request that is already answered is routine: the client's `$/cancelRequest` crossed
        # the answer on the wire (editors cancel every superseded inline request). pygls logs it as a warning,
        # on stderr, which clients show as an error in their logs; it is only worth a debug line.
        if msg_id not in self._request_futures:
            log.debug("$/cancelRequest for %s, which is already answered", msg_id)
            return
        super()._handle_cancel_notification(msg_id)

    def _check_handler_result(self, future) -> None:
        # pygls (2.1) files the future of every notification handled by a generator or coroutine (didOpen,
        # didChange, didClose go through our generators above) under a fresh uuid in `_request_futures`, and
        # only a request's answer ever removes an entry: a session grew by one future per keystroke (about
        # 1.5 MB a minute at 20 edits a second in the soak). The notification is done here, so its entry goes.
        # The map holds only what is still running, so the scan is short.
        for key in [key for key, pending in self._request_futures.items() if pending is future]:
            del self._request_futures[key]
        super()._check_handler_result(future)

    def _send_handler_result(self, future, *, msg_id) -> None:
        error = None if future.cancelled() else future.exception()
        if isinstance(error, JsonRpcException):  # raised on purpose: bad params, a stale document, cancelled
            self._request_futures.pop(msg_id, None)
            log.info("request %s answered with an error: %s", msg_id, error)
            self._send_response(msg_id, error=error.to_response_error())
            return
        super()._send_handler_result(future, msg_id=msg_id)

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        general = params.capabilities.general
        if general is not None and general.position_encodings:
            general.position_encodings = [choose_encoding(list(general.position_encodings))]
        return (yield from super().lsp_initialize(params))

    @lsp_method(types.EXIT)
    def lsp_exit(self, *args):
        # pygls closes the output and exits next; a fill cancelled by it still answers its request later,
        # and pygls reported the failed write with a message that failed to write too, in a loop (megabytes
        # of tracebacks on stderr). After `exit` nothing more is sent.
        self.exiting = True
        self.exit_code = 0 if self._shutdown else 1  # LSP: `exit` without `shutdown` exits 1
        return (yield from super().lsp_exit(*args))

    def _send_data(self, data) -> None:
        if getattr(self, "exiting", False):
            return
        super()._send_data(data)

    def _user(self, method: str, params):
        handler = self.fm.features.get(method)
        if handler is not None:
            yield handler, (params,), None

    @lsp_method(types.TEXT_DOCUMENT_DID_OPEN)
    def lsp_text_document__did_open(self, params: types.DidOpenTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_OPEN, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CHANGE)
    def lsp_text_document__did_change(self, params: types.DidChangeTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_CHANGE, params)

    @lsp_method(types.TEXT_DOCUMENT_DID_CLOSE)
    def lsp_text_document__did_close(self, params: types.DidCloseTextDocumentParams):
        yield from self._user(types.TEXT_DOCUMENT_DID_CLOSE, params)
