"""Context beyond the cursor's file: a comment block put at the start of the model's prefix window.

Two sources, in this order of priority within the budget (`context.extra.share` of the prefix budget):

1. the definitions (`dfim.server.signatures`) of the names the file imports from its project
   (`dfim.server.imports`), those the file uses first: the call being typed is most often of one of them;
2. chunks of other open and recently edited files (`dfim.server.chunk_ring`), newest first, none too like the
   code around the cursor.

The block is a comment in the file's language, one `file: PATH` line before each file's part, and ends with
the current file's own `file:` line, so the model reads code it knows how to read (the checkpoint was
trained on single files). It takes its tokens from the far end of the file's own prefix window, so the
trained context is never exceeded. It changes only when an import, the uses of the imported names or another
file change: the engine's context cache (prefix after suffix) keeps serving while the user types.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from dfim.engine.inference.extra_block import COMMENTS, file_line, render_block
from dfim.server.chunk_ring import MAX_LINE_CHARS, Chunk, ChunkRing, make_chunk
from dfim.server.imports import Import, Target, file_imports, resolve
from dfim.server.languages import Source, language_of_path
from dfim.server.signatures import outline

HEAD_CHARS = 30_000  # imports are read from the file's first this-many characters
SCOPE_CHARS = 20_000  # uses of imported names are counted this far around the cursor (and in the head)
LOCAL_LINES = 32  # lines each side of the cursor that a chunk must not repeat
MAX_FILE_BYTES = 512 * 1024  # a project file bigger than this is not read from disk
MIN_CHUNK_LINES = 4  # a chunk trimmed to fewer lines is not placed
CACHE_FILES = 256  # parsed project files kept


def uri_path(uri: str) -> Path | None:
    """The file a `file:` URI names (None for other schemes: an unsaved buffer has no place in a project)."""
    from pygls.uris import to_fs_path

    path = to_fs_path(uri) if uri.startswith("file:") else None
    return Path(path) if path else None


@dataclass
class Extra:
    """The block a fill's prefix starts with ("" = none), its tokens, and the files it shows."""

    text: str = ""
    tokens: int = 0
    files: tuple[str, ...] = ()


@dataclass
class _Piece:
    file: str  # the path shown in its file line
    text: str  # uncommented lines
    tokens: int = 0
    rank: int = 0  # lower is placed first when the budget cannot hold every piece
    order: int = 0  # where it is written among the placed pieces (import order: stable as the cursor moves)


IMPORT_LINE = re.compile(r"\s*(import|from|use|package|#include|export .* from)\b")


def distance(text: str, cursor: int, used: str) -> int:
    """How far from the cursor the file uses `used` (a name, or `alias.name`), in characters: the nearest
    use outside an import line within SCOPE_CHARS; a use only farther away ranks after those, and no use
    at all last (an imported name nobody calls yet is the one a new line may be about to call)."""
    lo, hi = max(0, cursor - SCOPE_CHARS), cursor + SCOPE_CHARS
    pattern = re.compile(rf"(?<![\w.]){re.escape(used)}\b")
    best = None
    for match in pattern.finditer(text, lo, hi):
        line = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        if IMPORT_LINE.match(line):
            continue
        gap = abs(match.start() - cursor)
        best = gap if best is None else min(best, gap)
    if best is not None:
        return best
    return 2 * SCOPE_CHARS if pattern.search(text) else 4 * SCOPE_CHARS


@dataclass
class _Parsed:
    outline: dict[str, str]
    imports: list[Import]
    text: str = field(repr=False, default="")


def comment_of(lang: str | None, uri: str) -> str | None:
    """The line comment of the document's language (None: unknown, no block can be written safely)."""
    name = lang or language_of_path(uri.split("?")[0])
    return COMMENTS.get(name or "")


LEADING = re.compile(
    r"""\s*($|#|//|/\*|\*|--|""" r'"""' r"""|'''|\)|import\b|from\b|use\b|package\b|require\b)"""
)


def first_code_line(doc, limit: int = 200) -> int:
    """The first of a document's first `limit` lines that is no import, comment, docstring edge or blank
    (0 when there is none): where its own code starts."""
    depth = 0  # brackets a multi-line import left open: its names are no code yet
    for line in range(min(limit, doc.line_count)):
        text = doc.line_text(line)
        if depth <= 0 and not LEADING.match(text):
            return line
        depth += text.count("(") + text.count("{") - text.count(")") - text.count("}")
    return 0


def document_chunk(doc, around_line: int, lines: int, from_line: bool = False) -> Chunk | None:
    """The chunk of an open document around one of its lines (`from_line`: starting at it), cut with its
    line table (a keystroke in a 5 MB file must not split the whole text into lines)."""
    starts = doc.line_starts
    count = len(starts)
    around = min(max(0, around_line), count - 1)
    first = max(0, min(around if from_line else around - lines // 2, count - lines))
    last = min(count, first + lines)
    end = starts[last] if last < count else len(doc.text)
    end = min(end, starts[first] + lines * MAX_LINE_CHARS)  # a 5 MB line is not copied per keystroke
    return make_chunk(doc.uri, doc.text[starts[first] : end], first, around - first)


class ExtraContext:
    """The server's extra-context state: the chunk ring, the last edited line of each document, and a cache
    of parsed project files."""

    def __init__(self, ring: ChunkRing | None = None) -> None:
        self.ring = ring or ChunkRing()
        self.last_line: dict[str, int] = {}
        self._files: OrderedDict[Path, tuple[object, _Parsed]] = OrderedDict()
        self._head: tuple[tuple[str, str], list[Import]] = (("", ""), [])  # (language, head) -> imports

    # ---- document events ---------------------------------------------------------------------------

    def opened(self, doc) -> None:
        """A document opened: its first definitions (after the imports and the header comments) join the
        ring; the editor says nothing of where its cursor is."""
        first = first_code_line(doc)
        self.ring.add(document_chunk(doc, first, self.ring.chunk_lines, from_line=True))

    def changed(self, doc, changes: Iterable) -> None:
        """A document changed: the lines around the edit join the ring (replacing, by similarity, the chunk of
        the same place from the previous keystroke)."""
        line = self.last_line.get(doc.uri, 0)
        for change in changes:
            rng = getattr(change, "range", None)
            if rng is not None:
                line = rng.start.line
        self.last_line[doc.uri] = line
        self.ring.add(document_chunk(doc, line, self.ring.chunk_lines))

    def saved(self, doc) -> None:
        """A document saved: the lines around its last edit join the ring."""
        self.ring.add(document_chunk(doc, self.last_line.get(doc.uri, 0), self.ring.chunk_lines))

    # ---- project files -------------------------------------------------------------------------------

    def _parsed(self, path: Path, open_docs: dict[Path, object]) -> _Parsed | None:
        """A project file's outline and imports: from its open document, else from disk (cached by its
        modification time and size, or its text)."""
        doc = open_docs.get(path)
        lang = language_of_path(str(path))
        if doc is not None:
            text = doc.text
            # a version names one text of the document; a client that sends none is hashed
            key: object = ("doc", doc.uri, doc.version, len(text))
            if doc.version is None:
                key = ("doc", hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())
        else:
            try:
                stat = path.stat()
            except OSError:
                return None
            key = ("disk", stat.st_mtime_ns, stat.st_size)
            text = None
        cached = self._files.get(path)
        if cached is not None and cached[0] == key:
            self._files.move_to_end(path)
            return cached[1]
        if text is None:
            try:
                text = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                return None
        source = Source(text, lang)
        parsed = _Parsed(outline(source), file_imports(source), text)
        self._files[path] = (key, parsed)
        while len(self._files) > CACHE_FILES:
            self._files.popitem(last=False)
        return parsed

    def _imports_of(self, text: str, lang: str) -> list[Import]:
        """The current file's imports, read from its head (parsed again only when the head changes)."""
        head = text[:HEAD_CHARS]
        if len(text) > HEAD_CHARS:
            head = head[: head.rfind("\n") + 1]
        if self._head[0] != (lang, head):
            self._head = ((lang, head), file_imports(Source(head, lang)))
        return self._head[1]

    # ---- the block -----------------------------------------------------------------------------------

    def build(
        self,
        docs: Iterable,
        roots: list[Path],
        doc,
        cursor: int,
        lang: str | None,
        budget: int,
        count_tokens: Callable[[str], int],
        imports: bool = True,
        chunks: bool = True,
    ) -> Extra:
        """The extra-context block for a fill at `cursor` in the open document `doc`, within `budget` tokens
        (`docs`: every open document; `roots`: the workspace folders, the only places read from disk)."""
        comment = comment_of(lang, doc.uri)
        if comment is None or budget <= 0:
            return Extra()
        roots = [r.resolve() for r in roots]
        open_docs = {p.resolve(): d for d in docs if (p := uri_path(d.uri)) is not None}
        here = uri_path(doc.uri)

        def show(path: Path) -> str:
            for root in roots:
                if path.is_relative_to(root):
                    return str(path.relative_to(root))
            return path.name

        own = _Piece(show(here.resolve()) if here is not None else "", "")
        own.tokens = count_tokens(file_line(own.file, comment))
        left = budget - own.tokens
        pieces: list[_Piece] = []
        if imports and here is not None and lang is not None:
            headed: set[str] = set()
            found = self._definitions(doc.text, cursor, here.resolve(), lang, roots, open_docs, show)
            for piece in sorted(found, key=lambda p: (p.rank, p.order)):
                header = 0 if piece.file in headed else count_tokens(file_line(piece.file, comment))
                piece = _fit_piece(piece, left - header, comment, count_tokens)
                if piece is not None:
                    pieces.append(piece)
                    headed.add(piece.file)
                    left -= header + piece.tokens
            pieces.sort(key=lambda p: p.order)
        if chunks:
            skip = {doc.uri}
            lo, hi = max(0, cursor - 8000), cursor + 8000
            near = doc.text[lo:hi].split("\n")
            at = doc.text.count("\n", lo, cursor)
            local = "\n".join(near[max(0, at - LOCAL_LINES) : at + LOCAL_LINES])
            for chunk in self.ring.pick(skip, local):
                path = uri_path(chunk.uri)
                name = show(path.resolve()) if path is not None else chunk.uri
                piece = _trim_chunk(chunk, name, left, comment, count_tokens)
                if piece is not None:
                    pieces.append(piece)
                    left -= piece.tokens
        if not pieces:
            return Extra()
        text = _render(pieces, own.file, comment)
        while pieces and count_tokens(text) > budget:  # the pieces' sum undercounted: drop the last
            pieces.pop()
            text = _render(pieces, own.file, comment) if pieces else ""
        if not pieces:
            return Extra()
        return Extra(text, count_tokens(text), tuple(dict.fromkeys(p.file for p in pieces)))

    def _definitions(
        self,
        text: str,
        cursor: int,
        here: Path,
        lang: str,
        roots: list[Path],
        open_docs: dict[Path, object],
        show: Callable[[Path], str],
    ) -> list[_Piece]:
        """One piece per imported definition found in the project, in import order, each ranked by how near
        the cursor the file uses it (`distance`)."""

        def exists(path: Path) -> bool:
            path = path.resolve()
            if path in open_docs:
                return True
            if not any(path.is_relative_to(root) for root in roots):
                return False
            try:
                return path.is_file() and path.stat().st_size <= MAX_FILE_BYTES
            except OSError:
                return False

        scope = text
        if len(text) > HEAD_CHARS + 2 * SCOPE_CHARS:
            scope = (
                text[:HEAD_CHARS] + "\n" + text[max(HEAD_CHARS, cursor - SCOPE_CHARS) : cursor + SCOPE_CHARS]
            )
        found: list[_Piece] = []
        seen: set[tuple[Path, str]] = set()
        for imp in self._imports_of(text, lang):
            locals_of = dict(imp.names)
            for target in resolve(imp, here, lang, roots, exists, text):
                path = target.path.resolve()
                if path == here:
                    continue
                parsed = self._parsed(path, open_docs)
                if parsed is None:
                    continue
                for name, definition, where in self._wanted(
                    target, parsed, scope, lang, roots, exists, open_docs
                ):
                    if (where, name) in seen:
                        continue
                    seen.add((where, name))
                    used = (
                        f"{target.alias}.{name}"
                        if target.alias and target.alias != "*"
                        else locals_of.get(name, name)
                    )
                    piece = _Piece(
                        show(where), definition, rank=distance(text, cursor, used), order=len(found)
                    )
                    found.append(piece)
        return found

    def _wanted(self, target: Target, parsed: _Parsed, scope: str, lang: str, roots, exists, open_docs):
        """(name, definition, file) of what a target's importer takes from it: the names it imports (looked
        up one re-export deeper when the file only imports them, as a package's `__init__.py` does), or the
        names it uses through the import's alias."""
        path = target.path.resolve()
        if target.names:
            names = list(target.names)
        elif target.alias == "*":
            names = [
                n
                for n in parsed.outline
                if not n.startswith("_") and re.search(rf"\b{re.escape(n)}\b", scope)
            ]
        elif target.alias:
            used = re.findall(rf"\b{re.escape(target.alias)}\.(\w+)", scope)
            names = [n for n in dict.fromkeys(used) if n in parsed.outline]
        else:
            names = []
        for name in names:
            if name in parsed.outline:
                yield name, parsed.outline[name], path
                continue
            for imp in parsed.imports:  # a re-export: `from .mod import name` in a package's __init__
                if name not in dict(imp.names):
                    continue
                for deeper in resolve(imp, path, lang, roots, exists, parsed.text):
                    inner = self._parsed(deeper.path.resolve(), open_docs)
                    if inner is not None and name in inner.outline:
                        yield name, inner.outline[name], deeper.path.resolve()
                        break
                break


def _fit_piece(piece: _Piece, budget: int, comment: str, count_tokens: Callable[[str], int]) -> _Piece | None:
    """The piece, or its first lines that fit `budget` tokens (a class's header and first members are
    worth more than a name further down the ranking); None when not even its first line fits."""
    lines = piece.text.split("\n")
    costs = [count_tokens(comment + line + "\n") for line in lines]
    keep, used = 0, 0
    while keep < len(lines) and used + costs[keep] <= budget:
        used += costs[keep]
        keep += 1
    if keep == 0:
        return None
    text = piece.text if keep == len(lines) else "\n".join(lines[:keep])
    return replace(piece, text=text, tokens=used)


def _trim_chunk(
    chunk: Chunk, name: str, budget: int, comment: str, count_tokens: Callable[[str], int]
) -> _Piece | None:
    """The chunk's lines nearest its centre that fit `budget` tokens with its file line; None when fewer than
    MIN_CHUNK_LINES fit."""
    lines = chunk.text.rstrip("\n").split("\n")
    header = count_tokens(file_line(name, comment))
    costs = [count_tokens(comment + line + "\n") for line in lines]
    lo = hi = min(chunk.center, len(lines) - 1)
    used = header + costs[lo]
    if used > budget:
        return None
    while True:  # grow one line at a time, alternating below and above the centre
        grew = False
        for side in (1, -1):
            j = hi + 1 if side == 1 else lo - 1
            if 0 <= j < len(lines) and used + costs[j] <= budget:
                used += costs[j]
                lo, hi = min(lo, j), max(hi, j)
                grew = True
        if not grew:
            break
    if hi - lo + 1 < MIN_CHUNK_LINES:
        return None
    return _Piece(name, "\n".join(lines[lo : hi + 1]), used)


def _render(pieces: list[_Piece], own: str, comment: str) -> str:
    """The block: each file's pieces under one `file:` line, in the pieces' order, then the current file's."""
    return render_block([(piece.file, piece.text) for piece in pieces], own, comment)


def workspace_roots(ls) -> list[Path]:
    """The workspace folders the client named at `initialize` (its root when it named no folder)."""
    try:
        workspace = ls.workspace
    except Exception:  # not initialized yet
        return []
    roots = [p for folder in workspace.folders.values() if (p := uri_path(folder.uri)) is not None]
    if not roots and workspace.root_path:
        roots.append(Path(workspace.root_path))
    return [r for r in roots if r.is_dir() and r != Path(os.sep)]


def with_extra(plan, extra: Extra):
    """A fill plan whose requests (the first, the drafted retry, the column-0 last try) read `extra` first."""
    if not extra.text:
        return plan
    last_try = plan.last_try
    if last_try is not None:
        last_try = (replace(last_try[0], prefix=extra.text + last_try[0].prefix), last_try[1])
    again = plan.again if plan.again is None else replace(plan.again, prefix=extra.text + plan.again.prefix)
    return replace(
        plan,
        request=replace(plan.request, prefix=extra.text + plan.request.prefix),
        last_try=last_try,
        again=again,
    )


def extra_for(ls, doc, cursor: int, lang: str | None, prefix_tokens: int) -> Extra:
    """The block for an inline fill on the server `ls` (nothing when `context.extra` is off)."""
    settings = ls.options.context.extra
    if not settings.enabled or not (settings.imports or settings.chunks):
        return Extra()
    return ls.extra.build(
        ls.docs.all(),
        workspace_roots(ls),
        doc,
        cursor,
        lang,
        int(prefix_tokens * settings.share),
        ls.host.count_tokens,
        imports=settings.imports,
        chunks=settings.chunks,
    )


def register(ls) -> None:
    """didSave: the lines around a saved file's last edit join the ring (the server asks for no text)."""
    from lsprotocol import types

    @ls.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    def did_save(ls, params: types.DidSaveTextDocumentParams) -> None:
        doc = ls.docs.get(params.text_document.uri)
        if doc is not None:
            ls.extra.saved(doc)
