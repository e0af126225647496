"""Prompt lookup decoding (`dfim.engine.inference.lookup`): guesses the greedy decode checks in one pass, which change
how many passes it takes and never which tokens it writes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dfim.engine import Engine, FillRequest
from dfim.engine.inference.autoregressive import decode
from dfim.engine.inference.canvas import assemble_text, build_canvas
from dfim.engine.inference.lookup import cut_after_stop, propose


def test_a_guess_is_what_followed_the_last_tokens_the_latest_time_they_occurred() -> None:
    history = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose(history, [], k=2) == [7, 8]  # the latest earlier [1, 2, 3], not the first
    assert propose(history, [], k=9) == [7, 8, 5, 1, 2, 3]  # up to the end of the history
    assert propose(history, [], k=0) == []


def test_the_previous_draft_is_searched_first_and_down_to_one_token() -> None:
    history = [4, 5, 6, 20, 21, 6]
    recent = [6, 30, 31]
    assert propose(history, recent, k=3) == [30, 31]  # one token matches in the previous draft
    # in the context itself one token is too weak a match: [6] -> [20, 21] is not guessed
    assert propose(history, [], k=3) == []
    assert propose([4, 5, 6, 20, 4, 5], [], k=3) == [6, 20, 4]  # two tokens are


def test_a_guess_ends_with_its_first_token_that_holds_a_stop_string() -> None:
    table = [b"", b"a", b"b\n", b"c", b"\n\n"]
    assert cut_after_stop([1, 3, 2, 1, 4], table, [b"\n"]) == [1, 3, 2]
    assert cut_after_stop([1, 3], table, [b"\n"]) == [1, 3]
    assert cut_after_stop([1, 2], table, []) == [1, 2]


@pytest.fixture(scope="module")
def shipped() -> Engine:
    return Engine.load()  # the trained model: its greedy text repeats the code before it


CODE = (
    "def update(state, pins, pinned):\n"
    "    state.sampled = torch.where(pinned, pins, state.sampled)\n"
    "    state.argmax = torch.where(pinned, pins, state.argmax)\n"
    "    state.renoised = torch.where(pinned, pins, state.renoised)\n"
    "    state.committed = torch.where(pinned, pins, state.committed)\n"
    "    state.tokens = torch.where("
)


def greedy(engine: Engine, prefix: str, lookahead: int, slot: str):
    """The encoder's greedy continuation of `prefix` (as the draft decodes it) in cache slot `slot`:
    (ids, passes, text, the plan's context)."""
    request = FillRequest(prefix=prefix, suffix="\n    return state\n", stop=("\n",))
    plan = build_canvas(request, engine.tokenizer, engine.table, engine.canvas_limit)
    prefix_end = dataclasses.replace(plan, context_ids=plan.context_ids[:-1])
    cache = engine.cache_for(slot)
    with torch.inference_mode():
        out = decode(
            cache, prefix_end, request, engine.banned, engine.tokenizer, budget=24, lookahead=lookahead
        )
    assert cache.ids == prefix_end.context_ids  # the guesses and the text are gone from the cache again
    text, _ = assemble_text(out.tokens, engine.tokenizer, plan.heal_bytes)
    return [t for t, _, _ in out.tokens], out.steps, text, prefix_end.context_ids


def test_guessing_writes_the_same_tokens_in_fewer_passes(shipped: Engine) -> None:
    plain, plain_passes, text, _ = greedy(shipped, CODE, lookahead=0, slot="plain")
    guessed, guessed_passes, _, _ = greedy(shipped, CODE, lookahead=8, slot="guessed")
    assert guessed == plain
    assert plain_passes == len(plain)  # one pass per token (the last one's is the stop)
    assert text.startswith("pinned, pins, ")  # the context's pattern: guessable
    assert guessed_passes <= plain_passes // 2
    assert shipped.cache_for("guessed").recent == guessed  # kept for the next request


def test_typing_out_the_previous_draft_is_guessed_from_it(shipped: Engine) -> None:
    _, _, text, _ = greedy(shipped, CODE, lookahead=8, slot="typing")
    typed = CODE + text[: len(text) // 2]  # the user types half of what was suggested
    plain, plain_passes, _, _ = greedy(shipped, typed, lookahead=0, slot="typing-plain")
    again, passes, _, _ = greedy(shipped, typed, lookahead=8, slot="typing")
    assert again == plain
    assert passes <= 2 < plain_passes  # the context's first pass, then one pass checks the whole rest


def test_the_previous_draft_is_no_guess_for_another_document(shipped: Engine) -> None:
    first, _, _, context = greedy(shipped, CODE, lookahead=8, slot="jump")
    cache = shipped.cache_for("jump")
    assert cache.recent_for(context) == first
    other = shipped.tokenizer.fim_context(shipped.tokenizer.encode("import os\nprint(os.sep"), [])
    assert cache.recent_for(other) == []
