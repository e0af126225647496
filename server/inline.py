"""Inline completion: the pure parts (typed-ahead reuse, result cache, the edit an item carries).

An inline item's range must start and end on one line (DESIGN §5). A fill that replaces more than the cursor
(an empty body's whitespace, the pinned rest of the line) is turned into the smallest edit on the cursor's
line that produces the same document.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dfim.engine.api import FillConfidence, FillRequest, FillResult, Hole, SamplerSettings
from dfim.server import gate
from dfim.server.context import FillContext, with_lead
from dfim.server.lines import line_end, line_start
from dfim.server.model_wait import wait_for_model
from dfim.server.options import Options
from dfim.server.post_context import PostContext, post_context
from dfim.server.postprocess import rank_candidates
from dfim.server.rules import fit_whitespace

if TYPE_CHECKING:
    from dfim.server.documents import Document
    from dfim.server.extra_context import Extra

log = logging.getLogger("dfim.server")


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


# ---- the LSP feature -----------------------------------------------------------------------------------

ACCEPT_COMMAND = "dfim.inlineAccepted"  # the item's command: the client runs it after inserting an item
PARTIAL_METHOD = "dfim/inlinePartiallyAccepted"  # notification {id, acceptedLength}: a word/line was taken
REJECT_METHOD = "dfim/inlineRejected"  # notification {id}: the suggestion was dismissed


def finite(number: float) -> bool:
    """Whether a JSON number is finite (an int of 400 digits is, though math.isfinite overflows on it)."""
    return not isinstance(number, float) or math.isfinite(number)


def _field(params, key: str):
    if isinstance(params, dict):
        return params.get(key)
    return getattr(params, key, None)


def register(ls) -> None:
    from lsprotocol import types

    @ls.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(ls, params: types.InlineCompletionParams):
        return await complete(ls, params)

    @ls.command(ACCEPT_COMMAND)
    def accepted(ls, *args) -> None:
        if args:
            ls.tracker.accepted(str(args[0]))

    @ls.feature(PARTIAL_METHOD)
    def partially_accepted(ls, params) -> None:
        length = _field(params, "acceptedLength")
        if length is None:  # optional in our clients: a partial accept of unknown length
            length = 0
        if isinstance(length, bool) or not isinstance(length, (int, float)) or not finite(length):
            log.warning("%s: acceptedLength must be a number, got %.40r; ignored", PARTIAL_METHOD, length)
            return  # a client's bad notification is no error to show the user
        ls.tracker.partially_accepted(str(_field(params, "id")), int(min(max(length, 0), 1 << 31)))

    @ls.feature(REJECT_METHOD)
    def rejected(ls, params) -> None:
        ls.tracker.rejected(str(_field(params, "id")))


@dataclass
class Place:
    """Where an inline request asks: the document as it was when the request came, and the cursor in it."""

    snapshot: Document  # a copy: the store's document may change while the fill runs
    cursor: int
    encoding: str
    started: float  # time.perf_counter() when the request came (the shown suggestion's latency)


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


def inline_context(
    ls, snapshot: Document, cursor: int, options: Options
) -> tuple[FillContext, str, Extra] | None:
    """The fill context of an inline request at `cursor` in `snapshot`, its result-cache key and the extra
    context from other files (dfim.server.extra_context; empty when off); None where no inline fill applies
    (a block whose span leaves the cursor out). The request and the Tab-Tab speculation
    (dfim.server.speculation) both build it here: the same document state must give the same key."""
    from dfim.server.context import build_context, single_line
    from dfim.server.extra_context import extra_for
    from dfim.server.languages import language_for

    text, uri = snapshot.text, snapshot.uri
    lang = language_for(snapshot.language_id, uri)
    prefix_tokens, suffix_tokens = ls.host.context_budget(
        options.context.prefix_tokens, options.context.suffix_tokens
    )
    extra = extra_for(ls, snapshot, cursor, lang, prefix_tokens)  # other files: from the far prefix's share
    ctx = build_context(
        text,
        cursor,
        lang,
        prefix_tokens=prefix_tokens - extra.tokens,
        suffix_tokens=suffix_tokens,
        max_canvas=options.sampling.max_canvas,
        count_tokens=ls.host.count_tokens if ls.host.ready else None,
    )
    if ctx.mode == "block" and not (ctx.start <= cursor <= ctx.end):
        return None
    if not options.inline.multiline:
        ctx = single_line(ctx, text, cursor)
    key = result_key(lang, ctx, options, ls.model_key)
    if extra.text:
        key = ResultCache.key(key, extra.text)
    return ctx, key, extra


async def fill_for_inline(
    ls,
    ctx: FillContext,
    text: str,
    options: Options,
    fill_once: Callable[[FillRequest], Awaitable[FillResult | None]],
    cancelled: Callable[[], bool],
    invoked: bool = False,
    extra: Extra | None = None,
) -> tuple[list[str], int, int, FillConfidence | None] | None:
    """(cleaned candidates, steps, fills, the first candidate's confidence) of the engine for an inline
    context, best first; None if a fill was cancelled. Every suggestion the model makes for the editor comes from here, whether a request waits for
    it or the Tab-Tab speculation computes it ahead (dfim.server.speculation); the cache and typed-ahead
    only replay what came out of it. `invoked`: an explicit request, which gets several distinct
    candidates to cycle through (dfim.server.cycling)."""
    from dfim.server.cycling import add_distinct, cycle_plan
    from dfim.server.extra_context import with_extra

    plan = plan_fill(ctx, text, ls.host.engine.settings, options, ls.host.count_tokens)
    if extra is not None:
        plan = with_extra(plan, extra)  # the model reads the other files' block first
    if invoked:
        plan = cycle_plan(plan, options.inline.cycle_candidates)
    fills = gate.LastFill(fill_once)
    outcome = await fill_until_shown(
        fills,
        plan.request,
        plan.post,
        plan.pinned,
        options.inline.retries,
        cancelled,
        last_try=plan.last_try,
        again=plan.again,
    )
    if outcome is None:
        return None
    if invoked:
        outcome = await add_distinct(fills, plan, outcome, cancelled)
    ranked, steps, attempts = outcome
    # The quality gate's input (dfim.server.gate): the same for a request's fill and a speculated one, so
    # a suggestion after an accept passes the same gate as any other.
    confidence = gate.confidence_of(
        ranked[0] if ranked else "",
        fills.last,
        lambda raw: next(iter(rank_candidates([strip_pinned_tail(raw, plan.pinned)], plan.post)), None),
    )
    return ranked, steps, attempts, confidence


def accept_command(suggestion_id: str):
    from lsprotocol import types

    return types.Command(title="dfim: accepted", command=ACCEPT_COMMAND, arguments=[suggestion_id])


def inline_items(ls, place: Place, candidates: list[str], ctx: FillContext, source: str, **fields):
    """The LSP items for cleaned fills, each an edit on the cursor's line; the first one is remembered as
    shown (typed-ahead reuse) and reported to telemetry. None when no fill makes such an edit."""
    from lsprotocol import types

    from dfim.server.telemetry import Shown

    snapshot, cursor = place.snapshot, place.cursor
    text = snapshot.text
    original = text[ctx.start : ctx.end]
    out = []
    for rank, fill in enumerate(candidates):
        if ctx.mode == "block" and original.strip(" \t") != original.strip():
            # an empty body spanning lines (`{\n  ▮\n}`, or a blank line before a Python cursor): the fill
            # keeps the line breaks around the cursor's line, so that the edit can stay on it
            fill = fit_body_fill(fill, text, ctx, cursor)
        edit = one_line_edit(text, ctx.start, ctx.end, fill, cursor)
        if edit is None or not edit[2]:
            continue
        r_start, r_end, insert = edit
        suggestion_id = new_id()
        if rank == 0 and r_start == cursor:
            ls.shown[snapshot.uri] = ShownSuggestion(suggestion_id, text[:cursor], text[r_end:], insert)
            # Tab-Tab: fill the next suggestion as if this one were accepted
            ls.speculations.start(ls, snapshot, r_start, r_end, insert)
            latency = (time.perf_counter() - place.started) * 1000
            ls.tracker.shown(
                Shown(suggestion_id, snapshot.uri, insert, snapshot.language_id),
                source=source,
                latencyMs=round(latency, 1),
                **fields,
            )
        out.append(
            types.InlineCompletionItem(
                insert_text=insert,
                range=snapshot.range_at(r_start, r_end, place.encoding),
                command=accept_command(suggestion_id),
            )
        )
    return types.InlineCompletionList(items=out) if out else None


async def run_fill(ls, request: FillRequest, flag) -> FillResult | None:
    """One engine call for an inline request, counted; None when it was cancelled. An engine error fails
    this request only (InternalError), never the server."""
    import asyncio

    from pygls.exceptions import JsonRpcInternalError

    from dfim.engine.api import EngineError, FillCancelled

    ls.counters["fills"] += 1
    ls.status.begin_fill()
    result, outcome = None, "failed"
    try:
        result = await ls.host.fill(request, flag, urgent=True)
        outcome = "completed"
    except FillCancelled:
        outcome = "cancelled"
        return None
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except EngineError as exc:
        raise JsonRpcInternalError(f"the engine failed: {exc}") from None
    except Exception as exc:  # a bug in the engine fails this request only
        raise JsonRpcInternalError(f"the engine failed: {type(exc).__name__}: {exc}") from None
    finally:
        ls.counters[outcome] += 1
        if result is None:
            ls.status.end_fill()
    ls.counters["model_ms"] += result.latency_ms
    ls.counters["encoded_tokens"] += result.encoded_tokens
    ls.status.end_fill(result.latency_ms, result.steps, result.stop_reason)
    ls.note_fallback()
    return result


async def complete(ls, params):
    """textDocument/inlineCompletion: typed-ahead reuse, then the result cache, then the engine."""
    import asyncio

    from lsprotocol import types
    from pygls.exceptions import JsonRpcInvalidParams

    from dfim.server.cycling import cycle_key, is_invoked
    from dfim.server.documents import Document, PositionError
    from dfim.server.options import language_enabled

    started = time.perf_counter()
    uri = params.text_document.uri
    doc = ls.docs.get(uri)
    if doc is None:
        raise JsonRpcInvalidParams(f"document {uri} is not open")
    encoding = ls.docs.encoding
    try:
        cursor = doc.offset_at(params.position, encoding)
    except PositionError as exc:
        raise JsonRpcInvalidParams(
            f"position {params.position.line}:{params.position.character}: {exc}"
        ) from None
    options = ls.options
    flag = ls.cancel_inflight(uri)  # a new request for a document cancels the one in flight
    if not options.inline.enabled or not language_enabled(options, doc.language_id):
        return None
    if not ls.host.ready:  # the first keystroke of a new window: held while the model loads (decision 72)
        ls.counters["held_for_model"] += 1
        if not await wait_for_model(ls.host, flag.is_set, options.inline.wait_for_model_ms):
            return None
    text = doc.text
    snapshot = Document(uri=uri, text=text, version=doc.version, language_id=doc.language_id)
    place = Place(snapshot, cursor, encoding, started)

    # 1. typed-ahead: the user typed the start of what is shown; serve the rest without the model (unless
    # the user asked for suggestions to cycle through: one item is nothing to cycle)
    invoked = is_invoked(params)
    shown = ls.shown.get(uri)
    rest = None if invoked else typed_ahead(shown, text[:cursor], text[cursor:])
    if rest is not None:
        ls.counters["typed_ahead"] += 1
        ls.tracker.typed(uri, cursor - len(shown.before))
        here = snapshot.range_at(cursor, cursor, encoding)
        item = types.InlineCompletionItem(insert_text=rest, range=here, command=accept_command(shown.id))
        return types.InlineCompletionList(items=[item])
    ls.shown.pop(uri, None)

    # 2. the context, and the cache keyed by exactly what the model would see
    found = inline_context(ls, snapshot, cursor, options)
    if found is None:
        return None
    ctx, key, extra = found
    if invoked:
        key = cycle_key(key, options)
    # the Tab-Tab speculation started when the suggestion before was shown, if this is the state it assumed
    # (waited for while it runs); a request anywhere else cancels speculations in flight
    speculated = await ls.speculations.take(uri, text, cursor, key)
    if speculated is not None:
        if flag.is_set():
            return None  # the document changed while the speculation ran
        ls.counters["speculation_hits"] += 1
        speculated, verdict = gate.screen(ls, uri, speculated, ls.gate_memory.get(key))
        fields = verdict.fields() if verdict is not None else {}
        return inline_items(ls, place, speculated, ctx, "speculation", mode=ctx.mode, **fields)
    cached = ls.cache.get(key)
    if cached is not None:
        ls.counters["cache_hits"] += 1
        cached, verdict = gate.screen(ls, uri, cached, ls.gate_memory.get(key))
        fields = verdict.fields() if verdict is not None else {}
        return inline_items(ls, place, cached, ctx, "cache", mode=ctx.mode, **fields)
    if not ls.host.ready:
        return None

    # 3. the engine, cancelled by a newer request for this document or by $/cancelRequest
    if options.inline.debounce_ms:
        await asyncio.sleep(options.inline.debounce_ms / 1000)
        if flag.is_set():
            return None
    outcome = await fill_for_inline(
        ls, ctx, text, options, lambda r: run_fill(ls, r, flag), flag.is_set, invoked, extra
    )
    if outcome is None:
        return None
    ranked, steps, attempts, confidence = outcome
    ls.counters["retries"] += attempts - 1
    if ls.inflight.get(uri) is flag:
        del ls.inflight[uri]
    ls.cache.put(key, ranked)
    ls.gate_memory.put(key, confidence)
    if flag.is_set():
        return None  # superseded while it ran: a newer request answers for this document
    ranked, verdict = gate.screen(ls, uri, ranked, confidence)
    fields = verdict.fields() if verdict is not None else {}
    return inline_items(ls, place, ranked, ctx, "model", mode=ctx.mode, steps=steps, **fields)
