"""Cycling: a request the user invokes explicitly gets several distinct suggestions to cycle through.

An automatic request (the user typed) wants one suggestion soon. An invoked one (`triggerKind` Invoked: VS
Code's next-suggestion command, Neovim's `<M-]>`) asks for alternatives and can wait a little longer for
them. Its fill denoises `inline.cycle_candidates` canvases in one batch (a drafted line keeps its draft as
the first canvas, the others start from noise); post-processing cleans and deduplicates them and keeps the
model's ranking (`postprocess.rank_candidates`). When fewer than two are left, one more fill at the next
seeds, its draft told to avoid what is already there, adds what it finds; that fill is also the only retry
an invoked request makes (`inline.retries` is for automatic ones), so that it costs at most two fills of
several canvases each (on a 2-core CPU about 1-3 s, where an automatic fill takes ~0.1 s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from dfim.engine.api import FillRequest, FillResult
from dfim.server.inline_plan import FillPlan, ResultCache, fill_until_shown
from dfim.server.options import Options

INVOKED = 1  # lsprotocol's InlineCompletionTriggerKind.Invoked


def is_invoked(params) -> bool:
    """Whether an inline request was invoked explicitly (its context's triggerKind is Invoked)."""
    context = params.get("context") if isinstance(params, dict) else getattr(params, "context", None)
    if context is None:
        return False
    kind = context.get("triggerKind") if isinstance(context, dict) else getattr(context, "trigger_kind", None)
    return kind == INVOKED


def cycle_key(key: str, options: Options) -> str:
    """The result-cache key of an invoked request: its answer (several candidates) is not an automatic one."""
    return ResultCache.key(key, "invoked", options.inline.cycle_candidates)


def cycle_plan(plan: FillPlan, count: int) -> FillPlan:
    """`plan` with every fill denoising at least `count` canvases."""

    def wider(request: FillRequest) -> FillRequest:
        return replace(request, candidates=max(request.candidates, count))

    last_try = None if plan.last_try is None else (wider(plan.last_try[0]), plan.last_try[1])
    again = None if plan.again is None else wider(plan.again)
    return replace(plan, request=wider(plan.request), last_try=last_try, again=again)


async def add_distinct(
    fill_once: Callable[[FillRequest], Awaitable[FillResult | None]],
    plan: FillPlan,
    outcome: tuple[list[str], int, int],
    cancelled: Callable[[], bool],
) -> tuple[list[str], int, int] | None:
    """`outcome` (cleaned candidates, steps, fills) with the candidates of one more fill appended when it has
    fewer than two; None if that fill was cancelled."""
    ranked, steps, fills = outcome
    if len(ranked) >= 2 or cancelled():
        return outcome
    base = plan.again if plan.again is not None else plan.request
    seed = None if base.seed is None else base.seed + fills
    request = replace(base, seed=seed, avoid=tuple(base.avoid) + tuple(ranked))
    more = await fill_until_shown(fill_once, request, plan.post, plan.pinned, 0, cancelled)
    if more is None:
        return None
    extra, more_steps, more_fills = more
    return ranked + [c for c in extra if c not in ranked], steps + more_steps, fills + more_fills
