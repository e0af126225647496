"""Inline completion, the LSP feature: `textDocument/inlineCompletion`, and the accept, partial-accept and
reject notifications that tell telemetry what became of a suggestion.

A request takes a snapshot of the document, builds its fill context (dfim.server.context), answers from
typed-ahead or the result cache where it can, and otherwise fills through the engine host
(`fill_for_inline`, shared with the Tab-Tab speculation), passes the quality gate (dfim.server.gate) and
returns items whose edits stay on the cursor's line. The pure parts live in dfim.server.inline_plan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dfim.engine.api import FillConfidence, FillRequest, FillResult
from dfim.server import gate
from dfim.server.context import FillContext
from dfim.server.inline_plan import (
    Place,
    ResultCache,
    ShownSuggestion,
    closer_on_own_line,
    fill_until_shown,
    finite,
    fit_body_fill,
    new_id,
    one_line_edit,
    plan_fill,
    result_key,
    strip_pinned_tail,
    typed_ahead,
)
from dfim.server.model_wait import wait_for_model
from dfim.server.options import Options
from dfim.server.postprocess import rank_candidates, without_breaking

if TYPE_CHECKING:
    from dfim.server.documents import Document
    from dfim.server.extra_context import Extra

log = logging.getLogger("dfim.server")


# ---- the LSP feature -----------------------------------------------------------------------------------

ACCEPT_COMMAND = "dfim.inlineAccepted"  # the item's command: the client runs it after inserting an item
PARTIAL_METHOD = "dfim/inlinePartiallyAccepted"  # notification {id, acceptedLength}: a word/line was taken
REJECT_METHOD = "dfim/inlineRejected"  # notification {id}: the suggestion was dismissed


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


def inline_context(
    ls, snapshot: Document, cursor: int, options: Options
) -> tuple[FillContext, str, Extra] | None:
    """The fill context of an inline request at `cursor` in `snapshot`, its result-cache key and the extra
    context from other files (dfim.server.extra_context; empty when off); None where no inline fill applies
    (a block whose span leaves the cursor out). The request and the Tab-Tab speculation
    (dfim.server.speculation) both build it here: the same document state must give the same key."""
    from dfim.server.context import block_lead_for, build_context, single_line
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
    ctx = (
        single_line(ctx, text, cursor) if not options.inline.multiline else block_lead_for(ctx, text, cursor)
    )
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
        0 if invoked else options.inline.retries,  # invoked: `add_distinct` is the one fill more
        cancelled,
        last_try=plan.last_try,
        again=plan.again,
    )
    if outcome is None:
        return None
    if invoked:
        outcome = await add_distinct(fills, plan, outcome, cancelled)
    ranked, steps, attempts = outcome
    if invoked:
        ranked = without_breaking(ranked, plan.post)
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
        elif ctx.mode == "block":
            fill = closer_on_own_line(fill, text, ctx)
        edit = one_line_edit(text, ctx.start, ctx.end, fill, cursor)
        if edit is None or not edit[2]:
            continue
        r_start, r_end, insert = edit
        suggestion_id = new_id()
        if rank == 0:
            if r_start == cursor:  # typed-ahead reuse and Tab-Tab follow an insertion at the cursor only
                ls.shown[snapshot.uri] = ShownSuggestion(suggestion_id, text[:cursor], text[r_end:], insert)
                # Tab-Tab: fill the next suggestion as if this one were accepted
                ls.speculations.start(ls, snapshot, r_start, r_end, insert)
            # an edit that also replaces text before the cursor is shown all the same, and counts as such
            latency = (time.perf_counter() - place.started) * 1000
            held = {"heldForModel": True} if place.held_for_model else {}
            ls.tracker.shown(
                Shown(suggestion_id, snapshot.uri, insert, snapshot.language_id),
                source=source,
                latencyMs=round(latency, 1),
                **held,
                **fields,
            )
        elif rank > 0:  # cycling's other candidates: telemetry learns of one when it is accepted
            ls.tracker.alternative(Shown(suggestion_id, snapshot.uri, insert, snapshot.language_id))
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
    from dfim.server.documents import PositionError
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
    held = not ls.host.ready
    if held:  # the first keystroke of a new window: held while the model loads (decision 72)
        ls.counters["held_for_model"] += 1
        if not await wait_for_model(ls.host, flag.is_set, options.inline.wait_for_model_ms):
            return None
    text = doc.text
    snapshot = doc.snapshot()
    place = Place(snapshot, cursor, encoding, started, held_for_model=held)

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
        speculated, verdict = gate.screen(ls, uri, speculated, ls.gate_memory.get(key), invoked)
        fields = verdict.fields() if verdict is not None else {}
        return inline_items(ls, place, speculated, ctx, "speculation", mode=ctx.mode, **fields)
    cached = ls.cache.get(key)
    if cached is not None:
        ls.counters["cache_hits"] += 1
        cached, verdict = gate.screen(ls, uri, cached, ls.gate_memory.get(key), invoked)
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
    ranked, verdict = gate.screen(ls, uri, ranked, confidence, invoked)
    fields = verdict.fields() if verdict is not None else {}
    return inline_items(ls, place, ranked, ctx, "model", mode=ctx.mode, steps=steps, **fields)
