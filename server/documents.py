"""Open documents and LSP position conversion.

We keep our own store instead of pygls's `Workspace`: pygls splits lines with `str.splitlines`, which also
breaks on form feeds, U+2028 and other separators that LSP does not count as line ends, and it silently
clamps bad positions. LSP line ends are exactly `\\n`, `\\r\\n` and `\\r`; a position's `character` counts
code units of the negotiated encoding (UTF-16 unless the client offered UTF-8 or UTF-32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lsprotocol import types

UTF8 = types.PositionEncodingKind.Utf8
UTF16 = types.PositionEncodingKind.Utf16
UTF32 = types.PositionEncodingKind.Utf32

_LINE_END = re.compile(r"\r\n|\r|\n")
_NEWLINE = re.compile("\n")  # one literal: re scans for it at memchr speed (the alternation above cannot)
_LINE_CHAR = re.compile(r"[\r\n]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")  # two UTF-16 units each


class PositionError(ValueError):
    """A position or range that does not exist in the document (answered with InvalidParams)."""


def choose_encoding(offered: list[str] | None) -> str:
    """UTF-16 is the LSP default; we take UTF-8 whenever the client offers it, else UTF-32, else UTF-16."""
    offered = offered or []
    for preferred in (UTF8, UTF32):
        if preferred in offered:
            return preferred
    return UTF16


def units(text: str, encoding: str) -> int:
    """Length of `text` in code units of `encoding`."""
    if encoding == UTF32 or text.isascii():  # isascii is O(1) on CPython's strings
        return len(text)
    if encoding == UTF8:
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def column_to_index(line: str, character: int, encoding: str) -> int:
    """Code-unit column -> index into `line` (which excludes its line end).

    Raises PositionError past the end of the line. A column that falls inside one character (between the two
    halves of a surrogate pair, inside a UTF-8 sequence) snaps to the start of that character, so an edit
    never splits a character in two. Linear in the line's length, but in C: a keystroke at the end of a
    200,000-character line (minified code) took 0.16 s of the event loop when this walked it in Python.
    """
    if character < 0:
        raise PositionError(f"negative character {character}")
    if encoding == UTF32 or line.isascii():  # one unit a character in every encoding
        if character > len(line):
            raise _past_the_end(line, character, encoding)
        return character
    if encoding == UTF8:
        data = line.encode("utf-8", "surrogatepass")
        if character > len(data):
            raise _past_the_end(line, character, encoding)
        head = data[:character]
        try:
            return len(head.decode("utf-8", "surrogatepass"))
        except UnicodeDecodeError as exc:  # the column cuts a character: snap to its start
            return len(head[: exc.start].decode("utf-8", "surrogatepass"))
    shift = 0  # UTF-16 units minus characters before the astral character looked at
    for match in _ASTRAL.finditer(line, 0, min(len(line), character)):
        at = match.start() + shift  # the astral character's first unit
        if at >= character:
            break
        if at + 1 == character:  # between the two halves of its surrogate pair: snap to its start
            return match.start()
        shift += 1
    if character - shift <= len(line):
        return character - shift
    raise _past_the_end(line, character, encoding)


def _past_the_end(line: str, character: int, encoding: str) -> PositionError:
    name = getattr(encoding, "value", encoding)
    return PositionError(
        f"character {character} is past the end of the line ({units(line, encoding)} {name} units)"
    )


@dataclass
class Document:
    uri: str
    text: str
    version: int | None = None
    language_id: str = ""
    _starts: list[int] | None = field(default=None, repr=False)

    @property
    def line_starts(self) -> list[int]:
        """Offset of the first character of every line (a trailing line end starts one more, empty, line)."""
        if self._starts is None:
            ends = _LINE_END if "\r" in self.text else _NEWLINE  # 15x faster on a 5 MB line without \r
            self._starts = [0] + [m.end() for m in ends.finditer(self.text)]
        return self._starts

    def snapshot(self) -> Document:
        """A copy that later edits of this document leave alone; it shares the line starts computed so far
        (edits replace that list, never change it), so a request in a 5 MB file does not scan it again."""
        return Document(self.uri, self.text, self.version, self.language_id, self._starts)

    @property
    def line_count(self) -> int:
        return len(self.line_starts)

    def line_span(self, line: int) -> tuple[int, int]:
        """(start, end) offsets of `line`'s content, line end excluded."""
        starts = self.line_starts
        start = starts[line]
        if line + 1 < len(starts):
            end = starts[line + 1]
            end -= 2 if self.text.startswith("\r\n", end - 2) else 1
        else:
            end = len(self.text)
        return start, end

    def line_text(self, line: int) -> str:
        start, end = self.line_span(line)
        return self.text[start:end]

    def offset_at(self, position: types.Position, encoding: str = UTF16, clamp: bool = False) -> int:
        """Position -> offset into `text`. A character past the end of its line means the line's end (LSP's
        rule for every position: editors with virtual space send such columns). A line past the last one
        raises PositionError, or with `clamp` (document changes) means the end of the text."""
        line = position.line
        if line < 0:
            raise PositionError(f"negative line {line}")
        if line >= self.line_count:
            if clamp:
                return len(self.text)
            raise PositionError(f"line {line} is past the end of the document ({self.line_count} lines)")
        start, end = self.line_span(line)
        content = self.text[start:end]
        try:
            return start + column_to_index(content, position.character, encoding)
        except PositionError:
            if position.character >= 0:
                return end
            raise

    def position_at(self, offset: int, encoding: str = UTF16) -> types.Position:
        offset = max(0, min(offset, len(self.text)))
        line = _bisect_right(self.line_starts, offset) - 1
        start = self.line_starts[line]
        return types.Position(line=line, character=units(self.text[start:offset], encoding))

    def range_offsets(self, rng: types.Range, encoding: str = UTF16, clamp: bool = False) -> tuple[int, int]:
        start = self.offset_at(rng.start, encoding, clamp)
        end = self.offset_at(rng.end, encoding, clamp)
        if end < start:
            if clamp:
                start, end = end, start
            else:
                raise PositionError("range end is before its start")
        return start, end

    def range_at(self, start: int, end: int, encoding: str = UTF16) -> types.Range:
        return types.Range(start=self.position_at(start, encoding), end=self.position_at(end, encoding))

    def apply_change(self, change, encoding: str = UTF16) -> None:
        """Apply one content change: a ranged (incremental) edit or a whole-document replacement."""
        rng = getattr(change, "range", None)
        if rng is None:
            self.text = change.text
            self._starts = None
        else:
            start, end = self.range_offsets(rng, encoding, clamp=True)
            self.text = self.text[:start] + change.text + self.text[end:]
            if self._starts is not None:  # typing in a 5 MB file must not rescan it per keystroke
                self._starts = _edited_starts(self._starts, self.text, start, end, len(change.text))


def _edited_starts(starts: list[int], text: str, start: int, end: int, inserted: int) -> list[int]:
    """Line starts after text[start:end] of the old text became `inserted` characters (`text` is the new text).

    Position p starts a line iff text[p-1] is \\n, or is \\r and text[p] is not \\n (so an edit can join a
    \\r and a \\n into one line end, or split them). Starts before the edit keep their place, starts whose
    two neighbours lie after it shift by the length change, and the ones in between are looked at anew.
    """
    delta = inserted - (end - start)
    head = starts[: _bisect_right(starts, start - 1)]
    new_end = start + inserted  # the last position whose left or right neighbour is new
    middle = []
    for m in _LINE_CHAR.finditer(text, max(0, start - 1), new_end):
        p = m.start() + 1
        if p >= start and (text[p - 1] == "\n" or not text.startswith("\n", p)):
            middle.append(p)
    tail = [s + delta for s in starts[_bisect_right(starts, end) :]]
    return (head or [0]) + middle + tail


def _bisect_right(values: list[int], x: int) -> int:
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < values[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


class DocumentStore:
    """The open documents, keyed by URI."""

    def __init__(self) -> None:
        self._docs: dict[str, Document] = {}
        self.encoding: str = UTF16

    def open(self, uri: str, text: str, version: int | None, language_id: str) -> Document:
        doc = Document(uri=uri, text=text, version=version, language_id=language_id)
        self._docs[uri] = doc
        return doc

    def change(self, uri: str, version: int | None, changes) -> Document | None:
        doc = self._docs.get(uri)
        if doc is None:
            return None
        for change in changes:
            doc.apply_change(change, self.encoding)
        doc.version = version
        return doc

    def close(self, uri: str) -> None:
        self._docs.pop(uri, None)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def __contains__(self, uri: str) -> bool:
        return uri in self._docs

    def all(self) -> list[Document]:
        """Every open document."""
        return list(self._docs.values())
