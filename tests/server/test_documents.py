"""Unit tests of server/documents.py: position encodings, line ends, incremental changes."""

from __future__ import annotations

import pytest
from lsprotocol import types

from dfim.server.documents import (
    UTF8,
    UTF16,
    UTF32,
    Document,
    PositionError,
    choose_encoding,
    column_to_index,
    units,
)


def pos(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


def rng(a: int, b: int, c: int, d: int) -> types.Range:
    return types.Range(start=pos(a, b), end=pos(c, d))


def test_choose_encoding_prefers_utf8_then_defaults_to_utf16():
    assert choose_encoding(None) == UTF16
    assert choose_encoding([UTF16]) == UTF16
    assert choose_encoding([UTF16, UTF8]) == UTF8
    assert choose_encoding(["utf-7"]) == UTF16


def test_positions_with_emoji_and_surrogate_pairs():
    doc = Document("file:///a.py", 'x = "😋"\ny = 1\n')
    # the closing quote: 9 UTF-8 bytes, 7 UTF-16 units, 6 code points in
    assert doc.offset_at(pos(0, 9), UTF8) == 6 and doc.text[6] == '"'
    assert doc.offset_at(pos(0, 7), UTF16) == 6
    assert doc.offset_at(pos(0, 6), UTF32) == 6
    assert doc.position_at(6, UTF16) == pos(0, 7)
    assert doc.position_at(6, UTF8) == pos(0, 9)
    # between the two halves of the surrogate pair: snaps to the start of the emoji
    assert doc.offset_at(pos(0, 6), UTF16) == 5
    assert column_to_index('"😋"', 2, UTF16) == 1


def test_crlf_and_lone_cr_line_ends_and_tabs():
    doc = Document("file:///a.c", "a\r\n\tb\rc\nd")
    assert doc.line_count == 4
    assert doc.line_text(1) == "\tb"
    assert doc.offset_at(pos(1, 1), UTF16) == 4 and doc.text[4] == "b"
    assert doc.offset_at(pos(2, 1), UTF16) == 7
    assert doc.position_at(len(doc.text), UTF16) == pos(3, 1)
    # the end of line 0 is before the \r\n, never between \r and \n
    assert doc.offset_at(pos(0, 1), UTF16) == 1
    assert doc.offset_at(pos(0, 2), UTF16) == 1  # past the line's end: its end, still before the \r\n


def test_form_feed_and_unicode_separators_are_not_line_ends():
    doc = Document("file:///a.py", "a\x0cb\u2028c\nd")
    assert doc.line_count == 2
    assert doc.offset_at(pos(1, 0)) == 6


def test_lines_past_the_end_raise_and_characters_past_a_line_end_mean_its_end():
    doc = Document("file:///a.py", "ab\ncd")
    for bad in (pos(2, 0), pos(5, 5)):
        with pytest.raises(PositionError):
            doc.offset_at(bad)
    assert doc.offset_at(pos(1, 2)) == 5
    # LSP: a character past the line's end defaults to the line length
    assert doc.offset_at(pos(0, 3)) == 2 and doc.offset_at(pos(1, 99)) == 5


def test_incremental_and_whole_document_changes():
    doc = Document("file:///a.py", "héllo 😋 world\r\nline2\r\n")
    change = types.TextDocumentContentChangePartial(range=rng(0, 9, 0, 14), text="there")
    doc.apply_change(change, UTF16)  # "héllo 😋 " is 9 UTF-16 units
    assert doc.text == "héllo 😋 there\r\nline2\r\n"
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(1, 0, 2, 0), text=""), UTF16)
    assert doc.text == "héllo 😋 there\r\n"
    doc.apply_change(types.TextDocumentContentChangeWholeDocument(text="new"), UTF16)
    assert doc.text == "new" and doc.line_count == 1
    # a change past the end of a line clamps to the line end (LSP's rule), never corrupts
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(0, 99, 0, 99), text="!"), UTF16)
    assert doc.text == "new!"


def test_utf8_change():
    doc = Document("file:///a.py", "é = 1\n")
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(0, 2, 0, 2), text="x"), UTF8)
    assert doc.text == "éx = 1\n"


@pytest.mark.parametrize("text", ["a\nb\n", "a\r\nb\rc\n", "", "\n\n", "x" * 1000, "é\n😀\r\n"])
def test_line_starts_match_a_scan_of_every_line_end(text):
    import re

    expected = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)]
    assert Document("file:///t", text).line_starts == expected


def test_a_snapshot_shares_line_starts_and_keeps_its_text_through_edits():
    doc = Document("file:///t.py", "a = 1\nb = 2\n", version=1, language_id="python")
    starts = doc.line_starts
    snap = doc.snapshot()
    assert snap.line_starts is starts and (snap.version, snap.language_id) == (1, "python")
    doc.apply_change(types.TextDocumentContentChangePartial(range=rng(0, 0, 0, 0), text="# x\n"))
    assert snap.text == "a = 1\nb = 2\n" and snap.line_starts == [0, 6, 12]
    assert doc.line_starts == [0, 4, 10, 16]


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_ascii_lines_take_the_column_as_the_index(encoding):
    line = "x = [" + "1, " * 1000 + "]"
    assert column_to_index(line, 7, encoding) == 7
    assert units(line, encoding) == len(line)
    with pytest.raises(PositionError):
        column_to_index(line, len(line) + 1, encoding)
