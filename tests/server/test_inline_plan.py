"""Unit tests of server/inline_plan.py: fill requests, retries, typed-ahead reuse, one-line edits, the cache."""

from __future__ import annotations

from dataclasses import replace

from dfim.engine.api import SamplerSettings
from dfim.server import context, inline_plan, options, postprocess
from dfim.server.post_context import post_context
from tests.server.helpers import ctx_for, split


def test_an_empty_brace_body_fill_stays_on_the_cursors_line():
    from dfim.server.inline_plan import fit_body_fill, one_line_edit

    for src in ("function f(w) {\n  |\n}\n", "function f(w) {\n\n  |\n\n}\n", "function f(w) {|\n}\n"):
        text, cursor = split(src)
        ctx = context.build_context(text, cursor, "javascript")
        assert ctx.mode == "block"
        for raw in ("\n" + ctx.indent + "return w;\n", "return w;"):
            fill = fit_body_fill(postprocess.clean(raw, ctx), text, ctx, cursor)
            edit = one_line_edit(text, ctx.start, ctx.end, fill, cursor)
            assert edit is not None, (src, raw)
            s, e, insert = edit
            assert "return w;" in text[:s] + insert + text[e:]


def test_a_several_line_fill_of_a_same_line_brace_body_puts_the_closer_on_its_own_line():
    from dfim.server.inline_plan import closer_on_own_line, one_line_edit

    text, cursor = split("class A {\n  get(): number {|}\n}\n")
    ctx = context.build_context(text, cursor, "typescript")
    assert ctx.mode == "block" and ctx.start == ctx.end == cursor
    fill = closer_on_own_line("\n    return v;", text, ctx)
    s, e, insert = one_line_edit(text, ctx.start, ctx.end, fill, cursor)
    assert text[:s] + insert + text[e:] == "class A {\n  get(): number {\n    return v;\n  }\n}\n"
    assert closer_on_own_line(" return v; ", text, ctx) == " return v; "  # one line: as it is


def test_fill_until_shown_asks_again_with_the_next_seed_only_when_nothing_is_left():
    import asyncio

    from dfim.engine.api import FillRequest, FillResult

    ctx = ctx_for("def f(x):\n    y = x\n    |\n    return y\n")
    ctx = context.one_line(ctx)

    def run(texts: list[str], retries: int, cancelled: bool = False):
        seeds: list[int | None] = []

        async def fill_once(request: FillRequest) -> FillResult | None:
            seeds.append(request.seed)
            text = texts[len(seeds) - 1]
            result = FillResult(
                text or "", 5, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
            )
            return None if text is None else result

        request = FillRequest(prefix=ctx.prefix, suffix=ctx.suffix, seed=7)
        out = asyncio.run(
            inline_plan.fill_until_shown(
                fill_once, request, post_context(ctx), "", retries, lambda: cancelled
            )
        )
        return out, seeds

    # the first draw copies the line below: dropped, so the next seed is asked
    assert run(["return y", "y += 1"], retries=1) == ((["y += 1"], 10, 2), [7, 8])
    # something to show at once: one fill
    assert run(["y += 1", "z = 2"], retries=1) == ((["y += 1"], 5, 1), [7])
    # retries exhausted, or off, or the request superseded: nothing, no further fill
    assert run(["return y", "   "], retries=1) == (([], 10, 2), [7, 8])
    assert run(["return y", "y += 1"], retries=0) == (([], 5, 1), [7])
    assert run(["return y", "y += 1"], retries=1, cancelled=True) == (([], 5, 1), [7])
    # a cancelled fill ends it
    assert run([None], retries=1) == (None, [7])


def test_a_drafted_fills_retries_draft_again_avoiding_what_was_dropped():
    """The greedy draft is the same every time: a retry asks `again` (the server's: the draft beside canvases
    from noise) told to avoid every dropped text (decision 44)."""
    import asyncio
    from dataclasses import replace

    from dfim.engine.api import FillRequest, FillResult, SamplerSettings

    ctx = context.one_line(ctx_for("def f(x):\n    y = x\n    |\n    return y\n"))
    asked: list[tuple[bool, int, int | None, tuple[str, ...]]] = []
    texts = ["return y", "   ", "y += 1"]  # the draft copies the line below, then writes nothing: dropped

    async def fill_once(request: FillRequest) -> FillResult:
        asked.append((request.settings.draft, request.candidates, request.seed, request.avoid))
        text = texts[len(asked) - 1]
        return FillResult(
            text, 1, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
        )

    drafted = FillRequest(
        prefix=ctx.prefix, suffix=ctx.suffix, seed=7, settings=SamplerSettings(draft=True), candidates=1
    )
    again = replace(drafted, candidates=2)
    out = asyncio.run(
        inline_plan.fill_until_shown(fill_once, drafted, post_context(ctx), "", 2, lambda: False, again=again)
    )
    assert out == (["y += 1"], 3, 3)
    assert asked == [(True, 1, 7, ()), (True, 2, 8, ("return y",)), (True, 2, 9, ("return y", "   "))]


def test_a_drafted_lines_retry_adds_canvases_from_noise_only_at_a_lines_start():
    """Decision 50: at a line's start (a blank line, column 0 above code, a block opener's new line) the
    avoiding draft goes beside canvases from noise; after code on the line it goes alone."""
    settings = SamplerSettings(draft=True)
    opts = options.Options()
    wide = opts.inline.candidates
    assert wide > 1
    cases = {
        "def f(x):\n    y = x\n    |\n    return y\n": wide,  # a blank line
        "def f(x):\n|    return x\n": wide,  # column 0 above code
        "def f(x):\n    if x:|\n": wide,  # the block's first line, on a new line
        "def f(x):\n    return x +|\n": 1,  # after code on the line
        "def f(x):\n    y = g(|\n": 1,
    }
    for src, candidates in cases.items():
        text, cursor = split(src)
        ctx = context.single_line(context.build_context(text, cursor, "python"), text, cursor)
        request, _ = inline_plan.fill_request(ctx, settings, opts, len)
        assert request.settings.draft and request.candidates == 1, src
        again = inline_plan.retry_request(request, ctx, opts)
        assert again is not None and again.candidates == candidates, src
        assert replace(again, candidates=1) == request
    # a fill that is not drafted retries as it was asked
    ctx = ctx_for("def f(x):\n    return x +|\n")
    request, _ = inline_plan.fill_request(ctx, SamplerSettings(draft=False), opts, len)
    assert inline_plan.retry_request(request, ctx, opts) is None


def test_a_column_0_cursor_on_a_blank_line_gets_its_indentation_typed_on_the_last_try():
    import asyncio

    from dfim.engine.api import FillRequest, FillResult

    src = "def f(xs):\n    out = []\n    for x in xs:\n|\n\n    return out\n"
    text, cursor = split(src)
    assert context.guess_indent(text, cursor) == "        "  # one deeper than the `for` line
    ctx = context.one_line(context.build_context(text, cursor, "python"))
    led = context.with_lead(ctx, text)
    assert led is not None and led.lead == "        " and led.prefix == ctx.prefix + "        "
    assert led.before_on_line == "" and ctx.lead == ""
    # the suggestion starts with the typed indentation, however the model began
    assert postprocess.clean("out.append(x)", led) == "        out.append(x)"
    assert postprocess.clean("  out.append(x)", led) == "        out.append(x)"
    # not after indentation the user typed, nor before code on the cursor's line
    for other in ("def f(xs):\n    for x in xs:\n    |\n", "def f(xs):\n    for x in xs:\n|out.append(x)\n"):
        t, c = split(other)
        assert context.with_lead(context.one_line(context.build_context(t, c, "python")), t) is None
    assert context.guess_indent("x = 1\n", 6) == ""  # top level: nothing to type

    asked: list[str] = []

    async def fill_once(request: FillRequest) -> FillResult:
        asked.append(request.prefix[len(ctx.prefix) :])
        text = "" if len(asked) == 1 else "out.append(x)"  # the plain try writes nothing
        return FillResult(
            text, 5, 32, 3, encoded_tokens=0, context_tokens=0, latency_ms=1.0, stop_reason="stable"
        )

    request = FillRequest(prefix=ctx.prefix, suffix=ctx.suffix, seed=7)
    last_try = (FillRequest(prefix=led.prefix, suffix=ctx.suffix, seed=7), post_context(led))
    out = asyncio.run(
        inline_plan.fill_until_shown(
            fill_once, request, post_context(ctx), "", 1, lambda: False, last_try=last_try
        )
    )
    assert out == (["        out.append(x)"], 10, 2) and asked == ["", "        "]


def test_typed_ahead_serves_the_rest():
    shown = inline_plan.ShownSuggestion("id", "x = fo", ")\n", "o(a, b")
    assert inline_plan.typed_ahead(shown, "x = foo(", ")\n") == "a, b"
    assert inline_plan.typed_ahead(shown, "x = fx", ")\n") is None  # typed something else
    assert inline_plan.typed_ahead(shown, "x = foo(a, b", ")\n") is None  # typed all of it
    assert inline_plan.typed_ahead(shown, "x = foo(", "]\n") is None  # the text after changed


def test_one_line_edit():
    text = "function f(x) {\n  \n}\n"
    start, end, cursor = 15, 19, 18
    assert inline_plan.one_line_edit(text, start, end, "\n  return x;\n", cursor) == (18, 18, "return x;")
    text = "def f(x):\n    \n"
    assert inline_plan.one_line_edit(text, 10, 14, "    return x", 14) == (14, 14, "return x")
    assert inline_plan.one_line_edit("ab\ncd", 0, 5, "zz\nzz", 4) is None


def test_result_cache_is_lru():
    cache = inline_plan.ResultCache(2)
    for k in "abc":
        cache.put(k, [k])
    assert cache.get("a") is None and cache.get("c") == ["c"]


def test_a_python_body_after_a_blank_line_shows_its_fill_without_a_stray_line():
    from dfim.server.inline_plan import fit_body_fill, one_line_edit

    text, cursor = split("def f():\n\n    |\n")
    ctx = context.build_context(text, cursor, "python")
    fill = fit_body_fill("    return 1\n    y = 2", text, ctx, cursor)
    assert one_line_edit(text, ctx.start, ctx.end, fill, cursor) == (cursor, cursor, "return 1\n    y = 2")


def test_the_inline_request_drafts_a_single_line_and_denoises_the_rest():
    """`inline_plan.fill_request`: a single-line open hole is drafted on one canvas and stops at the line break;
    several lines or a pinned rest of the line denoise `inline.candidates` canvases from noise."""
    from dataclasses import replace

    from dfim.engine.api import Hole, SamplerSettings

    settings = SamplerSettings(draft=True)
    opts = options.Options()
    opts = replace(opts, sampling=replace(opts.sampling, entropy_bound=0.3, max_steps=9))
    count = len  # one token per character: the pinned hole's width is easy to predict

    line = context.one_line(ctx_for("def f(x):\n    y = x\n    return |\n"))
    request, pinned = inline_plan.fill_request(line, settings, opts, count)
    assert (request.settings.draft, request.candidates, request.stop, pinned) == (True, 1, ("\n",), "")
    assert (request.settings.max_steps, request.settings.entropy_bound) == (9, 0.3)  # the server's settings
    assert request.prefix == line.prefix and request.suffix == line.suffix and request.middle == ()

    no_draft = replace(opts, inline=replace(opts.inline, draft=False))
    request, _ = inline_plan.fill_request(line, settings, no_draft, count)
    assert (request.settings.draft, request.candidates) == (False, opts.inline.candidates)

    block = ctx_for("def f(x):\n    |\n")
    assert block.mode != "line"
    request, _ = inline_plan.fill_request(block, settings, opts, count)
    assert (request.settings.draft, request.candidates, request.stop) == (False, opts.inline.candidates, ())

    inside = ctx_for("def f(x):\n    return g(|x, y, z)\n")
    assert inside.rest_of_line == "x, y, z)"
    pin = replace(opts, context=replace(opts.context, pin_rest_of_line=True))
    request, pinned = inline_plan.fill_request(inside, settings, pin, count)
    assert pinned == "x, y, z)" and request.middle == (Hole(16), "x, y, z)")  # twice the rest's tokens
    assert request.suffix == inside.suffix[len(pinned) :]
    assert (request.settings.draft, request.candidates) == (False, opts.inline.candidates)

    above = ctx_for("def f(x):\n|    return x\n")
    assert above.opens_line
    request, _ = inline_plan.fill_request(above, settings, opts, count)
    assert request.scored_suffix == "\n" + above.before_on_line + above.suffix


def test_a_fill_plan_works_out_its_contexts_once_before_the_engine_runs():
    text, cursor = split("def f(xs):\n    for x in xs:\n|\n\n    return xs\n")
    ctx = context.one_line(context.build_context(text, cursor, "python"))
    plan = inline_plan.plan_fill(ctx, text, SamplerSettings(draft=True), options.Options(), len)
    assert plan.post == post_context(ctx) and plan.pinned == ""
    led_request, led_post = plan.last_try
    assert led_post.lead == "        " and led_request.prefix == ctx.prefix + "        "
    assert plan.again is not None and plan.again.settings.draft  # a drafted line's retry drafts again
    text, cursor = split("x = foo(|)\n")
    ctx = context.build_context(text, cursor, "python")
    plan = inline_plan.plan_fill(ctx, text, SamplerSettings(draft=True), options.Options(), len)
    assert plan.last_try is None and plan.post.outer == ("(",) and plan.post.may_close == 0
