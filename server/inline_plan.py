"""Inline completion's pure parts: the request a fill context asks, its retries, the result cache and
typed-ahead reuse, and the edit an item carries.

An inline item's range must start and end on one line (DESIGN §5). A fill that replaces more than the cursor
(an empty body's whitespace, the pinned rest of the line) is turned into the smallest edit on the cursor's
line that produces the same document.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dfim.engine.api import FillRequest, FillResult, Hole, SamplerSettings
from dfim.server.context import FillContext, leading_ws, with_lead
from dfim.server.lines import line_end, line_start
from dfim.server.options import Options
from dfim.server.post_context import PostContext, post_context
from dfim.server.postprocess import rank_candidates
from dfim.server.rules import fit_whitespace

if TYPE_CHECKING:
    from dfim.server.documents import Document


@dataclass
class ShownSuggestion:
    """The last suggestion shown for a document: where, what, and the text around it."""

    id: str
    before: str  # document text before the cursor when it was shown
    after: str  # document text after the replaced range
    text: str  # what the item inserts at the cursor (with the range start..cursor already in `before`)


def new_id() -> str:
    return os.urandom(8).hex()


def typed_ahead(shown: ShownSuggestion | None, before: str, after: str) -> str | None:
    """If the user typed the start of the shown suggestion, the rest of it; else None.

    The text after the cursor must be unchanged and what was typed must be a strict prefix of the suggestion.
    """
    if shown is None or after != shown.after or not before.startswith(shown.before):
        return None
    typed = before[len(shown.before) :]
    if not typed or len(typed) >= len(shown.text) or not shown.text.startswith(typed):
        return None
    return shown.text[len(typed) :]


class ResultCache:
    """LRU of cleaned fills, keyed by the exact context the model would see (and the sampling settings)."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[str, list[str]] = OrderedDict()

    @staticmethod
    def key(*parts: object) -> str:
        h = hashlib.blake2b(digest_size=16)
        for part in parts:
            h.update(repr(part).encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def get(self, key: str) -> list[str] | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: str, value: list[str]) -> None:
        if self.size <= 0:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()


def one_line_edit(text: str, start: int, end: int, fill: str, cursor: int) -> tuple[int, int, str] | None:
    """(range start, range end, insert) of an edit whose range stays on the cursor's line, contains the
    cursor, and whose result equals replacing text[start:end] with `fill`; None if no such edit exists."""
    old = text[start:end]
    p = len(os.path.commonprefix([old, fill]))
    p = min(p, max(0, cursor - start))
    s = 0
    limit = min(len(old) - p, len(fill) - p, max(0, end - cursor))
    while s < limit and old[len(old) - 1 - s] == fill[len(fill) - 1 - s]:
        s += 1
    r_start, r_end = start + p, end - s
    if r_start > cursor or r_end < cursor:
        return None
    if r_start < line_start(text, cursor) or r_end > line_end(text, cursor):
        return None
    return r_start, r_end, fill[p : len(fill) - s]


def fit_body_fill(fill: str, text: str, ctx: FillContext, cursor: int) -> str:
    """An empty body's fill laid out like the body it replaces: the blank lines before and after the
    cursor's line stay as they are and the fill takes the cursor's line (indented like the body)."""
    ls, le = line_start(text, cursor), line_end(text, cursor)
    if not ctx.start <= ls <= le <= ctx.end:  # the cursor is on the `{` line: a break comes first
        return fit_whitespace(fill, text[ctx.start : ctx.end], ctx.newline, ctx.indent)
    body = fill.strip("\r\n").rstrip()
    if ctx.indent and body and not body[0].isspace():
        body = ctx.indent + body
    return text[ctx.start : ls] + body + text[le : ctx.end]


def closer_on_own_line(fill: str, text: str, ctx: FillContext) -> str:
    """A several-line fill between a same-line `{` and its `}` (`get(): number {▮}`) ends with a line break
    and the `{` line's indentation, so that the `}` goes on a line of its own instead of after the fill's
    last statement (`return v;}`)."""
    after = text[ctx.end : ctx.end + 1]
    if ctx.start != ctx.end or after not in (")", "]", "}") or "\n" not in fill.rstrip():
        return fill
    return fill.rstrip() + ctx.newline + leading_ws(text[line_start(text, ctx.start) : ctx.start])


async def fill_until_shown(
    fill_once: Callable[[FillRequest], Awaitable[FillResult | None]],
    request: FillRequest,
    post: PostContext,
    pinned: str,
    retries: int,
    cancelled: Callable[[], bool],
    last_try: tuple[FillRequest, PostContext] | None = None,
    again: FillRequest | None = None,
) -> tuple[list[str], int, int] | None:
    """(cleaned candidates, steps, fills) of up to 1 + `retries` fills, each with the next seed, stopping at
    the first that leaves something worth showing; None if a fill was cancelled. When post-processing drops
    everything (the model copied the line below, or wrote nothing), another draw often has a line to offer.
    `post` is what post-processing reads around the fill, worked out once for every fill and retry.
    `last_try` (a request and its post context) replaces the last retry: the indentation typed for a column-0
    cursor (`context.with_lead`). `again` replaces the request on the other retries, told to avoid every
    text dropped so far (a drafted fill: the same greedy draft again would show the same text; decision 44)."""
    ranked: list[str] = []
    dropped: list[str] = []
    steps = attempt = 0
    tries = 1 + max(0, retries)
    for attempt in range(tries):
        seed = None if request.seed is None else request.seed + attempt
        if last_try is not None and attempt == tries - 1 and attempt > 0:
            request, post = last_try
        elif again is not None and attempt > 0:
            request = replace(again, avoid=tuple(dropped))
        result = await fill_once(replace(request, seed=seed))
        if result is None:
            return None
        steps += result.steps
        raw = [result.text, *result.alternatives]
        dropped += raw
        if pinned:
            raw = [strip_pinned_tail(r, pinned) for r in raw]
        ranked = rank_candidates(raw, post)
        if ranked or cancelled():
            break
    return ranked, steps, attempt + 1


def strip_pinned_tail(fill: str, pinned: str) -> str:
    """The fill without the pinned rest of the line that the engine echoes at its end."""
    if pinned and fill.endswith(pinned):
        return fill[: len(fill) - len(pinned)]
    if pinned and pinned.strip() and fill.rstrip().endswith(pinned.strip()):
        return fill.rstrip()[: len(fill.rstrip()) - len(pinned.strip())]
    return fill


def finite(number: float) -> bool:
    """Whether a JSON number is finite (an int of 400 digits is, though math.isfinite overflows on it)."""
    return not isinstance(number, float) or math.isfinite(number)


@dataclass
class Place:
    """Where an inline request asks: the document as it was when the request came, and the cursor in it."""

    snapshot: Document  # a copy: the store's document may change while the fill runs
    cursor: int
    encoding: str
    started: float  # time.perf_counter() when the request came (the shown suggestion's latency)
    held_for_model: bool = False  # it waited for the model to load: its latency is mostly the load


def fill_request(
    ctx: FillContext, settings: SamplerSettings, options: Options, count_tokens: Callable[[str], int]
) -> tuple[FillRequest, str]:
    """The engine request for a fill context, and the rest of the line pinned after its hole ("" if none).

    A single-line open hole is drafted by the checkpoint's encoder (dfim.engine.inference.draft): one canvas, which the
    denoiser mostly confirms in a step. Anything else (several lines, a pinned rest of line) denoises
    `inline.candidates` canvases from noise."""
    settings = replace(
        settings, max_steps=options.sampling.max_steps, entropy_bound=options.sampling.entropy_bound
    )
    suffix, middle, pinned = ctx.suffix, (), ""
    if (
        options.context.pin_rest_of_line
        and ctx.mode == "line"
        and ctx.rest_of_line.strip()
        and not ctx.opens_line
    ):
        pinned = ctx.rest_of_line
        width = max(4, min(ctx.max_tokens, count_tokens(ctx.rest_of_line) * 2))
        middle, suffix = (Hole(width), pinned), suffix[len(pinned) :]
    drafted = settings.draft and options.inline.draft and ctx.mode == "line" and not middle
    request = FillRequest(
        prefix=ctx.prefix,
        suffix=suffix,
        middle=middle,
        max_tokens=ctx.max_tokens,
        settings=replace(settings, draft=drafted),
        seed=options.sampling.seed,
        stop=("\n",) if ctx.mode == "line" else (),
        candidates=1 if drafted else options.inline.candidates,
        # shown as a new line above the code (postprocess.clean): ranked as the document the user gets
        scored_suffix=ctx.newline + ctx.before_on_line + suffix if ctx.opens_line else None,
    )
    return request, pinned


def retry_request(request: FillRequest, ctx: FillContext, options: Options) -> FillRequest | None:
    """What a drafted line's retry asks (None: the first request again, with the next seed). A draft that
    leaves the dropped text at its first word (decision 44). At a line's start it goes beside canvases from
    noise (`inline.candidates` in all), ranked by the model: the dropped draft there is mostly a copy of the
    line below, and noise finds other lines. After code on the line, the avoiding draft alone goes on with
    it: canvases from noise there cost most of a typing session's retry time and were rarely taken
    (decision 50)."""
    if not request.settings.draft:
        return None
    at_line_start = bool(ctx.lead) or not ctx.before_on_line.strip()
    return replace(request, candidates=options.inline.candidates if at_line_start else 1)


@dataclass
class FillPlan:
    """Everything an inline fill needs, worked out once before the engine runs: the request, the rest of the
    line pinned after its hole, what post-processing reads (`post`), the column-0 last try and the
    drafted retry (`fill_until_shown`)."""

    request: FillRequest
    pinned: str
    post: PostContext
    last_try: tuple[FillRequest, PostContext] | None
    again: FillRequest | None


def plan_fill(
    ctx: FillContext,
    text: str,
    settings: SamplerSettings,
    options: Options,
    count_tokens: Callable[[str], int],
) -> FillPlan:
    """The `FillPlan` of a fill context in the document `text`."""
    request, pinned = fill_request(ctx, settings, options, count_tokens)
    led = with_lead(ctx, text)  # only on a blank line, so never with a pinned rest of line
    last_try = (replace(request, prefix=led.prefix), post_context(led)) if led is not None else None
    return FillPlan(request, pinned, post_context(ctx), last_try, retry_request(request, ctx, options))


def result_key(lang: str | None, ctx: FillContext, options: Options, model: object) -> str:
    """The result cache's key: exactly what the model would see, and every setting that changes the answer."""
    return ResultCache.key(
        lang,  # an empty Go file and an empty Python file have the same context
        ctx.prefix,
        ctx.suffix,
        ctx.mode,
        ctx.lead,  # `if x:▮` and `if x:\n    ▮` can have the same windows: the lead tells them apart
        ctx.max_tokens,
        options.sampling,
        options.inline.candidates,
        options.inline.draft,
        options.inline.retries,  # an empty result with no retry must not answer for one with a retry
        model,
    )
