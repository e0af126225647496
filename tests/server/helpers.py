"""Helpers of the server's unit tests: documents written with `|` where the cursor is."""

from __future__ import annotations

from dfim.server import context


def split(src: str) -> tuple[str, int]:
    return src.replace("|", ""), src.index("|")


def ctx_for(src: str, lang: str | None = "python") -> context.FillContext:
    text, cursor = split(src)
    return context.build_context(text, cursor, lang)


def single(src: str, lang: str | None = "python") -> tuple[context.FillContext, str, int]:
    text, cursor = split(src)
    return context.single_line(context.build_context(text, cursor, lang), text, cursor), text, cursor
