"""The block of other files' code that a fill's prefix may start with: its one format.

The server writes it (`dfim.server.extra_context`) and training teaches the model to read it
(`dfim.engine.training.cross_file`), so both take it from here: a model reads only the layout it was
trained on. The block is a comment in the file's language. Each other file's pieces come under one
`file: PATH` line, and the block ends with the current file's own `file:` line, just before its code.
"""

from __future__ import annotations

from collections.abc import Sequence

COMMENTS = {
    "python": "# ", "ruby": "# ", "shell": "# ", "javascript": "// ", "typescript": "// ", "tsx": "// ",
    "go": "// ", "rust": "// ", "java": "// ", "c": "// ", "cpp": "// ", "csharp": "// ", "kotlin": "// ",
    "swift": "// ", "php": "// ", "lua": "-- ",
}  # fmt: skip


def as_comment(text: str, comment: str) -> str:
    """`text`'s lines, each commented (an empty line gets the bare comment marker)."""
    return "".join(
        comment + line + "\n" if line.strip() else comment.rstrip() + "\n" for line in text.split("\n")
    )


def file_line(path: str, comment: str) -> str:
    """The commented line that names a file."""
    return as_comment("file: " + path, comment)


def render_block(pieces: Sequence[tuple[str, str]], own: str, comment: str) -> str:
    """The block of (path, text) pieces: each file's pieces, in order and joined by newlines, under one
    `file:` line (files in the order they first come), then the current file's own `file:` line ("" = none)."""
    files: dict[str, list[str]] = {}
    for path, text in pieces:
        files.setdefault(path, []).append(text)
    body = "".join(
        as_comment("file: " + name + "\n" + "\n".join(texts), comment) for name, texts in files.items()
    )
    return body + file_line(own, comment) if own else body
