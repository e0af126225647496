"""A `$/cancelRequest` for a request already answered (it crossed the answer on the wire, as editors' cancels
of superseded inline requests do) leaves nothing in the server's log at its default level: clients show the
server's stderr as errors."""

from __future__ import annotations

from lsprotocol import types

from tests.server_helpers import Session

PY = "def add(a, b):\n    return \n"


async def test_a_cancel_for_an_answered_request_is_not_logged(tmp_path):
    log_file = tmp_path / "serve.log"
    s = Session()
    await s.start(tmp_path / "no-such-model", tmp_path, args=("--log-file", str(log_file)))
    try:
        assert (await s.wait_state()).state == "error"
        s.open("file:///work/a.py", PY)
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri="file:///work/a.py"),
            position=types.Position(line=1, character=11),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        method = types.TEXT_DOCUMENT_INLINE_COMPLETION
        assert await s.client.protocol.send_request_async(method, params, msg_id="inline-1") is None
        for msg_id in ("inline-1", 424242):  # answered a moment ago; never sent
            s.client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
        assert (await s.stats()).status.state == "error"  # read after the cancels: both were handled
    finally:
        await s.stop()
    text = log_file.read_text()
    assert "no-such-model" in text  # the log is written at this level: the failed load is in it
    assert "Cancel notification" not in text and "cancelRequest" not in text, text
