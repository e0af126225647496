"""A bounded ring of text chunks from other open and recently edited files, for the model's extra context.

A chunk is a run of lines (`CHUNK_LINES`) cut around where a file was opened, edited or saved. The ring keeps
the newest `capacity` chunks. Two chunks that say nearly the same (the same region of a file edited twice,
a file opened again) waste the model's small budget, so adding a chunk evicts every older one too similar
to it; when a fill asks for chunks, those too similar to the code around its cursor are left out (the
model reads that code already). Similarity is the Dice coefficient of the chunks' sets of non-blank,
stripped lines: cheap, order-free, and blind to indentation changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

CHUNK_LINES = 64  # lines a chunk spans (before it is trimmed to the budget it is placed in)
RING_CAPACITY = 16  # chunks kept; the oldest go first
EVICT_SIMILARITY = 0.9  # a new chunk evicts older chunks at least this similar to it
LOCAL_SIMILARITY = 0.5  # a chunk at least this similar to the cursor's own code is not placed
MIN_LINES = 3  # a chunk with fewer non-blank lines says too little to be worth a place


def line_set(text: str) -> frozenset[str]:
    """The chunk's distinct non-blank lines, stripped: what `similarity` compares."""
    return frozenset(s for line in text.splitlines() if (s := line.strip()))


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    """Dice coefficient of two line sets: 1 for the same lines, 0 for none in common (or an empty one)."""
    if not a or not b:
        return 0.0
    return 2 * len(a & b) / (len(a) + len(b))


@dataclass(frozen=True)
class Chunk:
    uri: str  # the document it came from
    first_line: int  # 0-based line of the chunk's first line in that document (as it was then)
    text: str  # whole lines, each ending with "\n"
    center: int = 0  # line in `text` the chunk was cut around (trimming keeps the lines nearest it)
    lines: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


MAX_LINE_CHARS = 300  # a longer line (minified code, data) is cut: one line must not take the whole budget


def make_chunk(uri: str, text: str, first_line: int = 0, center: int = 0) -> Chunk | None:
    """A chunk of the whole lines `text` (from line `first_line` of its document, cut around its line
    `center`); None when they hold fewer than MIN_LINES non-blank lines."""
    body = "".join(line[:MAX_LINE_CHARS] + "\n" for line in text.splitlines())
    kept = line_set(body)
    if len(kept) < MIN_LINES:
        return None
    return Chunk(uri, first_line, body, center, kept)


def cut_chunk(uri: str, text: str, around_line: int, chunk_lines: int = CHUNK_LINES) -> Chunk | None:
    """The `chunk_lines` lines of `text` centred on `around_line` (shifted to stay inside the file); None when
    they hold fewer than MIN_LINES non-blank lines."""
    lines = text.splitlines()
    if not lines:
        return None
    around = min(max(0, around_line), len(lines) - 1)
    first = max(0, min(around - chunk_lines // 2, len(lines) - chunk_lines))
    return make_chunk(uri, "\n".join(lines[first : first + chunk_lines]), first, around - first)


class ChunkRing:
    """The newest `capacity` chunks, none of them too similar to a newer one."""

    def __init__(
        self,
        capacity: int = RING_CAPACITY,
        chunk_lines: int = CHUNK_LINES,
        evict_similarity: float = EVICT_SIMILARITY,
    ) -> None:
        self.capacity = capacity
        self.chunk_lines = chunk_lines
        self.evict_similarity = evict_similarity
        self._chunks: deque[Chunk] = deque()  # oldest first
        self.evicted = 0  # chunks dropped as too similar to a newer one (tests and stats read this)

    def __len__(self) -> int:
        return len(self._chunks)

    def __iter__(self):
        return iter(self._chunks)

    def add(self, chunk: Chunk | None) -> Chunk | None:
        """Put `chunk` in the ring as the newest; older chunks too similar to it go, and the oldest ones past
        the capacity. A None chunk (lines that said too little) leaves the ring as it is."""
        if chunk is None:
            return None
        kept = deque(c for c in self._chunks if similarity(c.lines, chunk.lines) < self.evict_similarity)
        self.evicted += len(self._chunks) - len(kept)
        kept.append(chunk)
        while len(kept) > self.capacity:
            kept.popleft()
        self._chunks = kept
        return chunk

    def add_text(self, uri: str, text: str, around_line: int) -> Chunk | None:
        """`add` the chunk of `text` cut around `around_line` (`cut_chunk`)."""
        return self.add(cut_chunk(uri, text, around_line, self.chunk_lines))

    def forget(self, uri: str) -> None:
        """Drop the chunks of one document (a file the user deleted or renamed away)."""
        self._chunks = deque(c for c in self._chunks if c.uri != uri)

    def pick(
        self, exclude: Iterable[str], local: str, max_similarity: float = LOCAL_SIMILARITY
    ) -> list[Chunk]:
        """Chunks to place for a fill, newest first: none from the documents in `exclude` (the one being
        edited), none at least `max_similarity` like `local` (the code around the cursor)."""
        skip = set(exclude)
        here = line_set(local)
        return [
            c
            for c in reversed(self._chunks)
            if c.uri not in skip and similarity(c.lines, here) < max_similarity
        ]
