"""Fuzzing the server with hypothesis: document sync (pure, then over stdio) and random requests.

1. `dfim.server.documents` against a reference written here from the LSP spec: after 1,000 random incremental
   edits (CRLF, lone CR, tabs, emoji, surrogate pairs, NUL, U+2028, empty and very long lines, positions
   past the end) in every position encoding, the store's text equals the client's.
2. The real `dfim serve` over stdio: random edits interleaved with random requests (inline, code actions,
   resolve, commands, settings, unknown methods, positions out of range). Every request gets a result or a
   JSON-RPC error in time, the process stays up, and the server's text (`dfim/documentText`) equals the
   client's after each example.
"""

from __future__ import annotations

import asyncio
import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.exceptions import JsonRpcException

from dfim.server.documents import UTF8, UTF16, UTF32, Document, DocumentStore, PositionError
from tests.server_helpers import Session, random_checkpoint

# Pieces of text that break naive line/column code: every LSP line end, a CR that a later edit may join to
# an LF, tabs, astral characters (two UTF-16 units, four UTF-8 bytes), separators that are *not* LSP line
# ends (form feed, U+2028, NEL), NUL, combining marks, and a very long line.
ATOMS = [
    "a",
    "x = 1",
    " ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "",
    "😋",
    "𝄞",
    "é",
    "e\u0301",
    "中文",
    "\x00",
    "\x0c",
    "\u2028",
    "\x85",
    "\ud83d",  # a lone surrogate: legal in JSON ("\\ud83d"), refused by tokenizers
    "def f():\n    return 1\n",
    "{[(",
    ")]}",
]
LONG = "y" * 3000 + "😋" + "z" * 2000

pieces = st.lists(st.sampled_from(ATOMS), max_size=6).map("".join)
insert_text = st.one_of(pieces, pieces, pieces, st.text(max_size=8), st.just(LONG))
# An edit in abstract form, mapped onto the current text when it is applied: line numbers run up to two past
# the last line and columns well past the line end, so some edits are out of range (LSP: clamp them).
raw_edit = st.tuples(
    st.integers(0, 2**16), st.integers(0, 2**16), st.integers(0, 60), st.integers(0, 60), insert_text
)


# ---- the reference: LSP's rules, written independently of dfim.server.documents ----------------------------


def ref_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of every line's content; line ends are exactly \\n, \\r\\n and \\r."""
    spans, start, i = [], 0, 0
    while i < len(text):
        if text[i] == "\r" and text[i + 1 : i + 2] == "\n":
            spans.append((start, i))
            i += 2
            start = i
        elif text[i] in "\r\n":
            spans.append((start, i))
            i += 1
            start = i
        else:
            i += 1
    spans.append((start, len(text)))
    return spans


def ref_units(ch: str, encoding: str) -> int:
    if encoding == UTF32:
        return 1
    if encoding == UTF8:
        return len(ch.encode("utf-8", "surrogatepass"))
    return len(ch.encode("utf-16-le", "surrogatepass")) // 2


def ref_offset(text: str, line: int, character: int, encoding: str) -> int:
    """Clamped like a document change: past the last line = the end, past a line end = that line's end, and
    a column inside a character = that character's start."""
    spans = ref_lines(text)
    if line >= len(spans):
        return len(text)
    start, end = spans[line]
    used = 0
    for i in range(start, end):
        used += ref_units(text[i], encoding)
        if used > character:
            return i
    return end


def apply_ref(text: str, start: tuple[int, int], end: tuple[int, int], new: str, encoding: str) -> str:
    a, b = ref_offset(text, *start, encoding), ref_offset(text, *end, encoding)
    a, b = min(a, b), max(a, b)
    return text[:a] + new + text[b:]


def concrete(text: str, edit: tuple, encoding: str) -> tuple[tuple[int, int], tuple[int, int], str]:
    """Map an abstract edit onto `text`: a start position and an end a few lines/columns after it."""
    line_pick, col_pick, line_span, col_span, new = edit
    spans = ref_lines(text)
    line = line_pick % (len(spans) + 2)
    width = sum(ref_units(c, encoding) for c in text[slice(*spans[line])]) if line < len(spans) else 0
    column = col_pick % (width + 4)
    end_line = line + line_span % 3
    end_column = col_span if end_line != line else column + col_span % 8
    return (line, column), (end_line, end_column), new


def lsp_change(start, end, new: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(*start), end=types.Position(*end)), text=new
    )


# ---- 1. the document store, pure ---------------------------------------------------------------------


def sync(start: str, edits, encoding: str) -> tuple[Document, str]:
    """Apply `edits` to the store and to the reference; returns the store's document and the client's text."""
    store = DocumentStore()
    store.encoding = encoding
    store.open("file:///f.py", start, 1, "python")
    client = start
    for version, edit in enumerate(edits, 2):
        a, b, new = concrete(client, edit, encoding)
        client = apply_ref(client, a, b, new, encoding)
        store.change("file:///f.py", version, [lsp_change(a, b, new)])
    doc = store.get("file:///f.py")
    assert doc.line_starts == Document("file:///g.py", doc.text).line_starts  # kept up to date per edit
    return doc, client


@settings(max_examples=150, deadline=None)
@given(start=pieces, edits=st.lists(raw_edit, max_size=40), encoding=st.sampled_from([UTF16, UTF8, UTF32]))
def test_incremental_edits_keep_the_text_equal(start, edits, encoding):
    doc, client = sync(start, edits, encoding)
    assert doc.text == client and doc.version == len(edits) + 1
    assert doc.line_count == len(ref_lines(client))


def random_edit(rnd: random.Random) -> tuple:
    new = rnd.choice(
        [
            "".join(rnd.choices(ATOMS, k=rnd.randint(0, 5))),
            "".join(chr(rnd.randint(1, 0x10FFFF)) for _ in "ab"),
        ]
        if rnd.random() > 0.005
        else [LONG]
    )
    return rnd.randint(0, 2**16), rnd.randint(0, 2**16), rnd.randint(0, 60), rnd.randint(0, 60), new


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32), start=pieces, encoding=st.sampled_from([UTF16, UTF8, UTF32]))
def test_thousand_incremental_edits_keep_the_text_equal(seed, start, encoding):
    # 1,000 edits is past what hypothesis can draw one by one; a drawn seed picks them (and reproduces them)
    rnd = random.Random(seed)
    doc, client = sync(start, [random_edit(rnd) for _ in range(1000)], encoding)
    assert doc.text == client and doc.version == 1001
    assert doc.line_count == len(ref_lines(client))


@settings(max_examples=200, deadline=None)
@given(
    text=st.lists(st.sampled_from(ATOMS), max_size=12).map("".join),
    encoding=st.sampled_from([UTF16, UTF8, UTF32]),
)
def test_positions_round_trip_and_out_of_range_is_position_error(text, encoding):
    doc = Document("file:///p.py", text)
    spans = ref_lines(text)
    assert doc.line_count == len(spans)
    for line, (start, end) in enumerate(spans):
        assert doc.line_text(line) == text[start:end]
        for offset in range(start, end + 1):
            pos = doc.position_at(offset, encoding)
            assert (pos.line, doc.offset_at(pos, encoding)) == (line, offset)
        width = sum(ref_units(c, encoding) for c in text[start:end])
        for column in range(width + 1):  # every column exists; one inside a character snaps to its start
            assert doc.offset_at(types.Position(line, column), encoding) == ref_offset(
                text, line, column, encoding
            )
        assert doc.offset_at(types.Position(line, width + 1), encoding) == end  # past the end: the end
    with pytest.raises(PositionError):
        doc.offset_at(types.Position(len(spans), 0), encoding)
    assert doc.offset_at(types.Position(len(spans) + 5, 0), encoding, clamp=True) == len(text)


@settings(max_examples=100, deadline=None)
@given(text=pieces, new=pieces, encoding=st.sampled_from([UTF16, UTF8, UTF32]))
def test_whole_document_changes_replace_everything(text, new, encoding):
    store = DocumentStore()
    store.encoding = encoding
    store.open("file:///w.py", text, 1, "python")
    store.change("file:///w.py", 2, [types.TextDocumentContentChangeWholeDocument(text=new)])
    assert store.get("file:///w.py").text == new
    assert store.change("file:///not-open.py", 3, [lsp_change((0, 0), (0, 0), "x")]) is None


# ---- 2. the real server over stdio ---------------------------------------------------------------------

FAST = {"sampling": {"maxSteps": 2, "actionMaxSteps": 2, "maxCanvas": 16}, "telemetry": {"enabled": False}}
REQUEST_TIMEOUT = 60.0  # generous: a loaded 2-core machine; the point is "answered", not "fast"

request_kind = st.sampled_from(
    ["inline", "inline", "inline", "action", "command", "stats", "unknown", "settings"]
)
step = st.one_of(
    st.tuples(st.just("edit"), raw_edit),
    st.tuples(st.just("edit"), raw_edit),
    st.tuples(st.just("whole"), pieces),
    st.tuples(request_kind, st.tuples(st.integers(0, 2**16), st.integers(0, 2**16), st.integers(0, 3))),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One real server for the module, on a private event loop (hypothesis drives it synchronously)."""
    loop = asyncio.new_event_loop()
    session = Session()
    checkpoint = random_checkpoint(tmp_path_factory.mktemp("ckpt"))
    loop.run_until_complete(session.start(checkpoint, tmp_path_factory.mktemp("data"), init_options=FAST))
    status = loop.run_until_complete(session.wait_state())
    assert status.state == "ready", status
    yield loop, session
    loop.run_until_complete(session.stop())
    loop.close()


_uris = itertools.count()


async def answered(coro):
    """A result or a JSON-RPC error, within the timeout; anything else fails the test. With the model loaded
    and no faults injected nothing may be an internal error (a crash in a handler)."""
    try:
        return await asyncio.wait_for(coro, REQUEST_TIMEOUT)
    except JsonRpcException as exc:
        assert isinstance(exc.code, int) and exc.message
        assert exc.code != -32603, exc.message
        return exc


async def random_request(session: Session, uri: str, text: str, kind: str, picks: tuple[int, int, int]):
    spans = ref_lines(text)
    line = picks[0] % (len(spans) + 2)  # sometimes past the last line
    width = (spans[line][1] - spans[line][0]) if line < len(spans) else 0
    character = picks[1] % (2 * width + 3)  # sometimes past the line end
    position = types.Position(line, character)
    client = session.client
    if kind == "inline":
        return await answered(session.inline(uri, line, character))
    if kind == "action":
        end = types.Position(line + picks[2], character)
        params = types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=position, end=end),
            context=types.CodeActionContext(diagnostics=[]),
        )
        actions = await answered(client.text_document_code_action_async(params))
        if isinstance(actions, list) and actions:
            return await answered(client.code_action_resolve_async(actions[picks[2] % len(actions)]))
        return actions
    if kind == "command":
        rng = {"start": {"line": line, "character": character}, "end": {"line": line, "character": character}}
        command, arguments = [
            ("dfim.fillHole", [uri, rng]),
            ("dfim.runAction", [{"nonsense": True}]),
            ("dfim.rewriteSelection", ["file:///not-open.py", rng]),
            ("dfim.inlineAccepted", ["no-such-id"]),
        ][picks[2]]
        params = types.ExecuteCommandParams(command=command, arguments=arguments)
        return await answered(client.workspace_execute_command_async(params))
    if kind == "stats":
        return await answered(session.stats())
    if kind == "unknown":
        return await answered(client.protocol.send_request_async("dfim/noSuchMethod", {"x": picks[0]}))
    # settings: valid and invalid values alike; the server keeps serving
    session.configure(
        [
            FAST,
            {"sampling": {"maxSteps": -1}},
            {"inline": {"candidates": 2}},
            {"context": {"prefixTokens": 7}},
        ][picks[2]]
    )
    return None


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    start=pieces,
    steps=st.lists(step, min_size=40, max_size=80),
    language=st.sampled_from(["python", "javascript", "rust", "plaintext", "no-such-language"]),
)
def test_random_edits_and_requests_over_stdio(server, start, steps, language):
    loop, session = server
    uri = f"file:///fuzz/doc{next(_uris)}.txt"
    encoding = session.result.capabilities.position_encoding or UTF16

    async def run() -> None:
        session.open(uri, start, language)
        client = start
        pending = []
        for kind, payload in steps:
            if kind == "edit":
                a, b, new = concrete(client, payload, encoding)
                client = apply_ref(client, a, b, new, encoding)
                session.change(uri, new, types.Range(start=types.Position(*a), end=types.Position(*b)))
            elif kind == "whole":
                client = payload
                session.change(uri, payload)
            else:
                # requests overlap with later edits, as they do in an editor
                pending.append(asyncio.ensure_future(random_request(session, uri, client, kind, payload)))
                if len(pending) % 4 == 0:
                    await asyncio.sleep(0)
        await asyncio.gather(*pending)  # raises if any request was not answered
        mirror = await answered(session.client.protocol.send_request_async("dfim/documentText", {"uri": uri}))
        assert mirror.text == client
        assert mirror.version == session.version[uri]
        session.configure(FAST)
        session.client.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    loop.run_until_complete(run())
    assert session.client._server.returncode is None  # the process is still up
