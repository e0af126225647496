"""The encoder's draft (`SamplerSettings.draft`): greedy prefix continuation seeding a canvas."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dfim.engine import Engine, FillRequest, Hole, SamplerSettings
from dfim.engine.inference import sampler
from dfim.engine.inference.cache import ContextCache
from dfim.engine.inference.canvas import assemble_text, build_canvas
from dfim.engine.inference.draft import Draft, can_draft, draft_canvas, fit_canvas, hole_end
from dfim.engine.inference.sampler_state import Constraints
from dfim.engine.inference.sampler_steps import build_chain
from dfim.engine.model.checkpoint import DEFAULT_MODEL_DIR, write_random_checkpoint
from dfim.engine.model.kv_cache import KVCache

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"
DRAFT = SamplerSettings(max_steps=4, draft=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return Engine.load(write_random_checkpoint(tmp_path_factory.mktemp("ckpt"), TOKENIZER_JSON, seed=4))


def allowed_logits(
    logits: torch.Tensor, banned: torch.Tensor, may_end: bool, eos_id: int, pad_id: int
) -> torch.Tensor:
    """The greedy decoder's mask, written out here as the oracle: control tokens and pad never, EOS only
    where the text may end."""
    x = logits.masked_fill(banned, float("-inf"))
    x[pad_id] = float("-inf")
    if not may_end:
        x[eos_id] = float("-inf")
    return x


def plan_of(engine: Engine, request: FillRequest):
    return build_canvas(request, engine.tokenizer, engine.table, engine.canvas_limit)


def from_scratch(engine: Engine, ids: list[int]) -> torch.Tensor:
    """The encoder read as a causal LM over `ids` with an empty cache: next-token logits [T, V]."""
    with torch.inference_mode():
        return engine.model.context_lm(torch.tensor([ids]), KVCache(len(engine.model.decoder.layers)))[0]


def denoise_alike(engine: Engine, a: ContextCache, b: ContextCache, seed: int, atol: float) -> bool:
    """Whether one denoising step of the same random canvas reads the same logits over both caches."""
    canvas = torch.randint(16, 8192, (1, 16), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        return torch.allclose(
            engine.model.denoise(canvas, a.kv), engine.model.denoise(canvas, b.kv), atol=atol
        )


def test_step_on_a_diffusion_cache_is_the_encoder_lm_and_writes_what_prepare_writes(engine):
    # longer than the random checkpoint's sliding window (64): one-token passes read only its last keys
    code = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(12)) + "def g(x):\n    return x +"
    ids = engine.tokenizer.fim_context(engine.tokenizer.encode(code), [])
    assert len(ids) > 2 * engine.model.config.sliding_window
    stepped = ContextCache(engine.model)
    with torch.inference_mode():
        stepped.prepare(ids[:-8])
        for i in range(len(ids) - 8, len(ids) - 1):
            stepped.step(ids[i : i + 1])
        logits = stepped.step(ids[-1:])
    assert torch.allclose(logits, from_scratch(engine, ids)[-1], atol=1e-4)
    assert stepped.ids == ids and stepped.kv.length == len(ids)
    prepared = ContextCache(engine.model)
    prepared.prepare(ids)
    assert denoise_alike(engine, stepped, prepared, seed=0, atol=1e-5)


def test_the_draft_is_the_greedy_continuation_of_the_prefix(engine):
    request = FillRequest(
        prefix="total = 0\nfor x in xs:\n    total +=", suffix="\nprint(total)\n", stop=("\n",)
    )
    plan = plan_of(engine, request)
    cache = engine.cache_for("draft-test")
    with torch.inference_mode():
        canvas = draft_canvas(cache, plan, request, engine.banned, engine.tokenizer).ids
    tok = engine.tokenizer
    assert len(canvas) == plan.length
    # the text, then EOS where it ended (unless it filled the canvas), then padding
    text = canvas[: canvas.index(tok.eos_id)] if tok.eos_id in canvas else canvas
    assert all(t != tok.pad_id for t in text)
    assert all(t == tok.pad_id for t in canvas[len(text) + 1 :])
    # each token is the argmax of the encoder LM after the context without <fim_middle> and the draft so far
    context = plan.context_ids[:-1]
    logits = from_scratch(engine, context + text)
    for i, token in enumerate(text):
        allowed = allowed_logits(
            logits[len(context) - 1 + i].clone(), engine.banned, True, tok.eos_id, tok.pad_id
        )
        if plan.heal_allowed and i == 0:
            mask = torch.ones_like(engine.banned)
            mask[plan.heal_allowed] = False
            allowed = allowed.masked_fill(mask, float("-inf"))
        assert token == int(allowed.argmax())
    # it stops after the first token holding a stop string, as the fill is cut there
    holds_stop = ["\n" in tok.decode([t]) for t in text]
    assert not any(holds_stop[:-1])
    # the cache is left with the context up to the prefix and <fim_middle> parked: the fill's `prepare`
    # writes it back without running it, and the cache then holds what a fresh one would
    assert cache.ids == context
    assert cache.prepare(plan.context_ids) == 0
    fresh = ContextCache(engine.model)
    assert fresh.prepare(plan.context_ids) == len(plan.context_ids)
    assert denoise_alike(engine, cache, fresh, seed=1, atol=1e-4)


def test_a_draft_from_the_middle_is_the_ar_fim_decode_after_fim_middle(engine):
    """draft_from="middle": greedy after the whole context, `<fim_middle>` included, as an AR FIM model
    decodes (what `dfim.engine.training.train --causal-weight` trains); it ends at its own EOS or a stop string."""
    request = FillRequest(
        prefix="total = 0\nfor x in xs:\n    total +=",
        suffix="\nprint(total)\n",
        stop=("\n",),
        settings=replace(DRAFT, draft_from="middle"),
    )
    plan = plan_of(engine, request)
    cache = engine.cache_for("draft-middle-test")
    with torch.inference_mode():
        canvas = draft_canvas(cache, plan, request, engine.banned, engine.tokenizer).ids
    tok = engine.tokenizer
    text = canvas[: canvas.index(tok.eos_id)] if tok.eos_id in canvas else canvas
    logits = from_scratch(engine, plan.context_ids + text)
    n = len(plan.context_ids)
    for i, token in enumerate(text):
        allowed = allowed_logits(logits[n - 1 + i].clone(), engine.banned, True, tok.eos_id, tok.pad_id)
        if plan.heal_allowed and i == 0:
            mask = torch.ones_like(engine.banned)
            mask[plan.heal_allowed] = False
            allowed = allowed.masked_fill(mask, float("-inf"))
        assert token == int(allowed.argmax())
    ends_at_stop = bool(text) and "\n" in tok.decode(text[-1:])
    if len(text) < plan.length and not ends_at_stop:  # it ended because EOS was the argmax
        eos = allowed_logits(logits[n - 1 + len(text)].clone(), engine.banned, True, tok.eos_id, tok.pad_id)
        assert int(eos.argmax()) == tok.eos_id
    # nothing parked: the cache holds the whole context, which the fill's `prepare` finds as it is
    assert cache.ids == plan.context_ids and cache.prepare(plan.context_ids) == 0
    # and the prefix draft of the same request is another decode (it continues the prefix instead)
    prefix_request = replace(request, settings=DRAFT)
    with torch.inference_mode():
        other = draft_canvas(cache, plan, prefix_request, engine.banned, tok).ids
    assert cache.ids == plan.context_ids[:-1]
    assert other != canvas or text == []


def test_only_an_open_hole_is_drafted(engine):
    line = FillRequest(prefix="x = ", suffix="\n", stop=("\n",))
    several = replace(line, stop=())
    assert can_draft(plan_of(engine, line), line) and can_draft(plan_of(engine, several), several)
    pinned = replace(line, middle=(Hole(4), ")"))  # the encoder cannot see the pinned text
    rewrite = replace(line, warm_start="y + 1")  # the old text seeds the canvas already
    for request in (pinned, rewrite):
        assert not can_draft(plan_of(engine, request), request)


def test_a_several_line_draft_ends_where_it_leaves_the_hole():
    prefix, suffix = "def f(xs):\n    total = 0\n    ", "\n\n    return total\n"
    # it writes the code after the hole again: cut before that line, once the line is complete
    assert hole_end("total += x\n    return total", prefix, suffix) is None
    text = "total += x\n    total *= 2\n    return total\n    print(total)"
    assert hole_end(text, prefix, suffix) == text.index("\n    return")
    # it leaves the hole's block: a line indented less than the one the hole starts on
    text = "for x in xs:\n        total += x\nprint(total)\n"
    assert hole_end(text, prefix, suffix) == text.index("\nprint")
    assert hole_end("total += x\n", prefix, suffix) is None
    assert hole_end("a\n\nb\n", "", "\n\n") is None  # nothing after the hole, nothing to leave


def test_a_several_line_draft_keeps_the_tokens_before_the_line_that_left_the_hole(engine):
    """A random model never writes the suffix's line, so the draft is built by hand: decode is replaced by
    one that writes the hole's line, then the suffix's first line, then more."""
    from dfim.engine.inference import autoregressive
    from dfim.engine.inference.autoregressive import Decoded

    tok = engine.tokenizer
    request = FillRequest(prefix="def f(x):\n    y = x\n", suffix="\n    return y\n", max_tokens=32)
    plan = plan_of(engine, request)
    written = tok.encode("    y += 1\n    return y\n    z = 2")
    original = autoregressive.decode

    def writes(cache, p, r, banned, tokenizer, budget=None, ends=None, park=(), avoid=()):
        out = []
        for t in written:
            out.append((t, 1.0, False))
            if ends(assemble_text(out, tokenizer, p.heal_bytes)[0]):
                break
        return Decoded(out, len(out), "stop")

    autoregressive.decode = writes
    try:
        with torch.inference_mode():
            canvas = draft_canvas(engine.cache_for("rejoin"), plan, request, engine.banned, tok).ids
    finally:
        autoregressive.decode = original
    text = tok.decode(canvas[: canvas.index(tok.eos_id)])
    assert text.rstrip() == "    y += 1" and "return" not in text


def test_a_drafted_fill_seeds_the_first_candidate_only(engine):
    request = FillRequest(
        prefix="def add(a, b):\n    return", suffix="\n", stop=("\n",), settings=DRAFT, seed=0, candidates=2
    )
    plan = plan_of(engine, request)
    with torch.inference_mode():
        seeded = draft_canvas(
            engine.cache_for("seed-test"), plan, request, engine.banned, engine.tokenizer
        ).ids
    seen: list[torch.Tensor] = []
    original = engine.model.denoise

    def spy(canvas, kv, self_cond):
        seen.append(canvas.clone())
        return original(canvas, kv, self_cond)

    engine.model.denoise = spy
    try:
        result = engine.fill(request)
    finally:
        del engine.model.denoise
    assert seen[0][0].tolist() == seeded  # row 0 starts from the draft
    assert seen[0][1].tolist() != seeded  # row 1 from noise
    assert result.steps >= 1
    # the same request without the draft starts both rows from noise
    seen.clear()
    engine.model.denoise = spy
    try:
        engine.fill(replace(request, settings=replace(DRAFT, draft=False)))
    finally:
        del engine.model.denoise
    assert seen[0][0].tolist() != seeded


def test_a_canvas_started_from_text_stops_when_the_first_step_reproduces_it():
    """The draft's canvas counts as the previous argmax: a confident first step that agrees with it is done,
    one that disagrees is not, and a row started from noise is not either."""
    length, vocab = 6, 50
    draft_ids = torch.tensor([7, 8, 9, 2, 1, 1])  # text, EOS (2), pad (1)
    settings = SamplerSettings(max_steps=8)

    def state_for(init_mask: torch.Tensor):
        rules = Constraints.build(
            torch.zeros(length, dtype=torch.bool),
            torch.zeros(length, dtype=torch.long),
            vocab_size=vocab,
            eos_id=2,
            pad_id=1,
        )
        return sampler.new_state(
            2,
            rules,
            generator=torch.Generator().manual_seed(0),
            init_ids=draft_ids[None],
            init_mask=init_mask,
        )

    rows = torch.zeros(2, length, dtype=torch.bool)
    rows[0] = True
    state = state_for(rows)
    assert state.canvas[0].tolist() == draft_ids.tolist()
    # Both rows' step agrees with the draft, confidently on the whole (mean entropy ~0.002) but with a little
    # doubt at position 1 (~0.014 nats), so only the comparison with the previous canvas can stop a row.
    logits = torch.full((2, length, vocab), -30.0)
    logits[:, torch.arange(length), draft_ids] = 30.0
    logits[:, 1, 12] = 25.0
    sampler.denoise_step(state, build_chain(settings), logits.clone())
    assert state.finished.tolist() == [True, False] and state.stop_reason[0] == "stable"

    state = state_for(rows)
    other = logits.clone()
    other[0, 2, 13] = 31.0  # the denoiser would write another token there
    sampler.denoise_step(state, build_chain(settings), other)
    assert not bool(state.finished[0])


def test_the_shipped_model_drafts_the_readme_line():
    """The README's demo spot (`return ▮` after a loop that sums into `result`) with the shipped sampler:
    the encoder drafts the line (step 0) and the denoiser confirms it in one step. (Version 6 is unsure
    whether one newline or three end the line; both end it alike, so that doubt does not count.)"""
    engine = Engine.load(DEFAULT_MODEL_DIR, threads=1)
    assert engine.settings.draft  # dfim.json: decision 38
    source = (Path(__file__).resolve().parents[3] / "fixtures" / "demo.py").read_text()
    lines = source.split("\n")
    cut = sum(len(line) + 1 for line in lines[:7]) + 11  # line 8, column 12 (1-based)
    steps: list[tuple[int, str]] = []
    request = FillRequest(
        prefix=source[:cut],
        suffix=source[cut:],
        stop=("\n",),
        max_tokens=32,
        settings=engine.settings,
        seed=0,
        on_step=lambda info: steps.append((info.step, info.argmax_text)),
    )
    result = engine.fill(request)
    assert result.text.strip() == "result"
    assert steps[0][0] == 0 and steps[0][1].strip() == "result"  # the draft already held the answer
    assert result.steps == 1 and result.stop_reason == "stable"
    assert result.canvas_length == 16  # asked for 32: the canvas is sized to the draft (`fit_canvas`)


def test_a_fill_cancelled_while_drafting_leaves_the_engine_usable(engine):
    from dfim.engine import FillCancelled

    calls = 0

    def cancel() -> bool:
        nonlocal calls
        calls += 1
        return calls > 3  # a few drafted tokens, then the request is superseded

    request = FillRequest(
        prefix="def area(r):\n    return 3.14 *",
        suffix="\n",
        stop=("\n",),
        settings=DRAFT,
        seed=1,
        cancel=cancel,
    )
    with pytest.raises(FillCancelled):
        engine.fill(request)
    # the context cache holds exactly what it says it holds: the same fill again needs one token encoded
    again = engine.fill(replace(request, cancel=None))
    assert again.encoded_tokens <= 1 and again.steps >= 1
    fresh = Engine.load(engine.path).fill(replace(request, cancel=None))
    assert again.text == fresh.text


def test_a_single_drafted_canvas_is_sized_to_the_draft(engine):
    tok = engine.tokenizer
    request = FillRequest(prefix="x = ", suffix="\n", stop=("\n",), max_tokens=64)
    plan = plan_of(engine, request)
    assert plan.length == 64
    ids = [300, 301, 302, tok.eos_id] + [tok.pad_id] * 60
    seed = Draft(ids, [0.9, 0.8, 0.7] + [0.0] * 61)
    fitted, cut = fit_canvas(plan, seed, tok.eos_id, engine.canvas_limit)
    assert fitted.length == 16 and cut == Draft(
        ids[:16], seed.confidence[:16]
    )  # the smallest bucket with EOS
    assert len(fitted.pinned) == len(fitted.pin_ids) == len(fitted.no_end) == 16
    assert fitted.context_ids == plan.context_ids and fitted.can_continue
    full = Draft([300] * 20 + [tok.eos_id] + [tok.pad_id] * 43, [0.5] * 20 + [0.0] * 44)
    assert fit_canvas(plan, full, tok.eos_id, engine.canvas_limit)[0].length == 32
    no_end = Draft([300] * 64, [0.5] * 64)  # a draft that filled the canvas keeps it
    assert fit_canvas(plan, no_end, tok.eos_id, engine.canvas_limit) == (plan, no_end)
    # through the engine: one drafted candidate denoises the fitted canvas, two keep the asked-for room
    with torch.inference_mode():
        drafted = draft_canvas(engine.cache_for("fit-test"), plan, request, engine.banned, tok)
    expected = fit_canvas(plan, drafted, tok.eos_id, engine.canvas_limit)[0].length
    seen: list[int] = []
    original = engine.model.denoise

    def spy(canvas, kv, self_cond):
        seen.append(canvas.shape[1])
        return original(canvas, kv, self_cond)

    engine.model.denoise = spy
    try:
        one = engine.fill(replace(request, settings=DRAFT, seed=0))
        first = seen[0]
        seen.clear()
        engine.fill(replace(request, settings=DRAFT, seed=0, candidates=2))
    finally:
        del engine.model.denoise
    assert first == one.canvas_length == expected
    assert seen[0] == 64


def test_a_drafted_fill_reports_its_draft_as_step_0(engine):
    request = FillRequest(
        prefix="def add(a, b):\n    return", suffix="\n", stop=("\n",), settings=DRAFT, seed=0
    )
    plan = plan_of(engine, request)
    with torch.inference_mode():
        seed = draft_canvas(engine.cache_for("report-test"), plan, request, engine.banned, engine.tokenizer)
    reports = []
    engine.fill(replace(request, on_step=reports.append))
    first = reports[0]
    block0 = [r.step for r in reports[1:] if r.block == 0]
    assert first.step == 0 and block0 == list(range(1, len(block0) + 1))
    length = first.canvas_length
    assert first.token_ids == seed.ids[:length]
    assert first.confidence == pytest.approx(seed.confidence[:length], abs=1e-4)  # caches differ in rounding
    written = seed.ids.index(engine.tokenizer.eos_id) if engine.tokenizer.eos_id in seed.ids else length
    assert all(0.0 < c <= 1.0 for c in first.confidence[:written])  # the encoder's greedy probabilities
    assert all(c == 0.0 for c in first.confidence[written:])  # EOS and pad: the encoder wrote nothing
    # without the draft there is no step 0
    reports.clear()
    engine.fill(replace(request, settings=replace(DRAFT, draft=False), on_step=reports.append))
    assert reports[0].step == 1


def test_leaving_avoided_texts_at_their_first_word():
    from dfim.engine.inference.autoregressive import _leave_avoided
    from dfim.engine.model.tokenizer import Tokenizer

    tok = Tokenizer.from_file(TOKENIZER_JSON)
    one = {piece: tok.encode(piece) for piece in ("return", " x", "result", "    ", "\n", ")\n")}
    assert all(len(ids) == 1 for ids in one.values())  # single tokens in the shipped vocabulary

    def probs(*pieces: str) -> torch.Tensor:
        p = torch.zeros(8192)
        for rank, piece in enumerate(pieces):
            p[tok.eos_id if piece == "<eos>" else one[piece][0]] = 0.5**rank
        return p / p.sum()

    def leave(p: torch.Tensor, text: str, avoid: tuple[str, ...], heal: bytes = b""):
        tokens = [(t, 1.0, False) for t in tok.encode(text)]
        t, conf, left = _leave_avoided(p, tokens, avoid, tok, heal, ("\n",))
        return ("<eos>" if t == tok.eos_id else tok.decode([t])), conf, left

    avoid = ("    return x",)
    # whitespace may follow the avoided text: still on its track
    assert leave(probs("    ", "return"), "", avoid)[0::2] == ("    ", avoid)
    # the word that would follow it gives way to the next most likely token, and then nothing is avoided
    word, p, left = leave(probs("return", "result"), "    ", avoid)
    assert word == "result" and left == () and 0 < p < 0.5
    # a text that differs already is left alone
    assert leave(probs("return", "result"), "    x = ", avoid)[0::2] == ("return", ())
    # ending where an avoided text ends (EOS, or the stop string) gives way too: a blank line was dropped
    assert leave(probs("<eos>", "\n", "result"), "  ", ("",))[0] == "result"
    # texts are compared healed: a re-written last prefix token (`)\n`) is not the text's first word
    assert leave(probs(")\n"), "", avoid, heal=b")\n")[0::2] == (")\n", avoid)


def test_the_shipped_model_writes_another_line_when_told_to_avoid_its_first():
    engine = Engine.load(DEFAULT_MODEL_DIR, threads=1)
    request = FillRequest(
        prefix="def add(a, b):\n    ",
        suffix="\n\ndef sub(a, b):\n    return a - b\n",
        stop=("\n",),
        max_tokens=32,
        settings=engine.settings,
        seed=0,
    )
    first = engine.fill(request).text
    second = engine.fill(replace(request, avoid=(first,))).text
    third = engine.fill(replace(request, avoid=(first, second))).text
    assert first.strip() and second.strip() and third.strip()
    assert len({first.split()[0], second.split()[0], third.split()[0]}) == 3  # each leaves at its first word
