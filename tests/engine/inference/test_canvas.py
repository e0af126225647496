"""Canvas layout, token healing, warm start and text assembly, with the shipped tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfim.engine.api import EngineError, FillRequest, Hole
from dfim.engine.inference.canvas import (
    TokenTable,
    assemble_text,
    bucket_length,
    build_canvas,
    heal_prefix,
    layout_middle,
    middle_tokens,
)
from dfim.engine.model.tokenizer import Tokenizer

TOKENIZER_JSON = Path(__file__).resolve().parents[3] / "engine" / "weights" / "dfim-small" / "tokenizer.json"


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_file(TOKENIZER_JSON)


@pytest.fixture(scope="module")
def table(tok):
    return TokenTable(tok)


def test_buckets():
    assert [bucket_length(n) for n in (1, 16, 17, 33, 64, 65, 200, 256, 900)] == [
        16,
        16,
        32,
        64,
        64,
        128,
        256,
        256,
        256,
    ]
    assert bucket_length(100, limit=64) == 64  # longer fills continue in further canvases


def test_open_canvas_from_max_tokens(tok):
    plan = layout_middle((), tok, 40, 256)
    assert plan.length == 64 and plan.open_start == 0
    assert not any(plan.pinned) and not any(plan.no_end)


def test_skeleton_pins_strings_verbatim_and_holes_by_width(tok):
    head, tail = tok.encode("def add(a, b):\n"), tok.encode("\n    return total\n")
    plan = layout_middle(["def add(a, b):\n", Hole(5), "\n    return total\n"], tok, 64, 256)
    n = len(head) + 5 + len(tail)
    assert plan.length == bucket_length(n + 1)
    assert plan.pin_ids[: len(head)] == head and all(plan.pinned[: len(head)])
    hole = range(len(head), len(head) + 5)
    assert not any(plan.pinned[p] for p in hole) and all(plan.no_end[p] for p in hole)
    assert plan.pin_ids[len(head) + 5 : n] == tail
    # a skeleton ending with a string ends with a pinned EOS, then pinned pad
    assert plan.pin_ids[n] == tok.eos_id and plan.pinned[n]
    assert all(plan.pinned[n + 1 :]) and set(plan.pin_ids[n + 1 :]) <= {tok.pad_id}
    assert plan.open_start is None and not plan.can_continue


def test_trailing_hole_is_open_to_the_canvas_end(tok):
    head = tok.encode("    x = ")
    plan = layout_middle(["    x = ", Hole(3)], tok, 64, 256)
    assert plan.open_start == len(head)
    assert plan.length == 16
    assert not any(plan.pinned[len(head) :]) and not any(plan.no_end)


def test_skeleton_too_long_is_an_engine_error(tok):
    with pytest.raises(EngineError, match="at most 16"):
        layout_middle(["x", Hole(40)], tok, 64, 16)


def test_token_healing_backs_off_a_partial_word(tok, table):
    ids = tok.encode("    ret")
    kept, healed = heal_prefix(ids, tok, table)
    assert healed == b" ret" and kept == ids[:-1]
    allowed = table.starting_with(healed)
    assert tok.encode(" return")[0] in allowed
    assert all(tok.token_bytes(i).startswith(b" ret") for i in allowed)


def test_token_healing_after_indentation_backs_off_one_space(tok, table):
    """The cursor after a line's indentation: the natural split of `        settings` is 7 spaces and
    " settings", so only the last space is backed off (demanding a first token that starts with all 8
    spaces gave fills one space too deep)."""
    prefix = "def f(\n        tokenizer_path: str,\n        "
    ids = tok.encode(prefix)
    assert tok.token_bytes(ids[-1]) == b" " * 8  # the indent is one token here
    kept, healed = heal_prefix(ids, tok, table)
    assert healed == b" "
    assert b"".join(tok.token_bytes(i) for i in kept) == prefix[:-1].encode()
    natural = tok.encode(prefix + "settings")
    assert natural[: len(kept)] == kept and natural[len(kept)] in table.starting_with(healed)


def test_token_healing_spans_two_tokens_when_one_token_extends_them(tok, table):
    ids = tok.encode("x = self.ba")  # '.b' 'a' -> both backed off
    kept, healed = heal_prefix(ids, tok, table)
    assert healed == b".ba" and kept == ids[:-2]
    assert {tok.token_bytes(i) for i in table.starting_with(healed)} >= {b".base", b".batch"}


def test_build_canvas_heals_and_constrains_position_zero(tok, table):
    req = FillRequest(prefix="def f(xs):\n    ret", suffix="\n")
    plan = build_canvas(req, tok, table, 256)
    assert plan.heal_bytes == b" ret"
    prefix_ids = tok.encode(req.prefix)[:-1]
    assert plan.context_ids == tok.fim_context(prefix_ids, tok.encode("\n"))
    assert plan.heal_allowed and all(tok.token_bytes(i).startswith(b" ret") for i in plan.heal_allowed)


def test_no_healing_when_position_zero_is_pinned(tok, table):
    plan = build_canvas(FillRequest(prefix="x = fo", suffix="", middle=["o(1)"]), tok, table, 256)
    assert plan.heal_bytes == b"" and plan.context_ids == tok.fim_context(tok.encode("x = fo"), [])


def test_assemble_strips_healing_bytes_and_stops_at_eos(tok):
    ret, x = tok.encode(" return")[0], tok.encode(" x")[0]
    canvas = [ret, x, tok.eos_id, ret, tok.pad_id]
    positions, ended = middle_tokens(canvas, [False] * 5, tok.eos_id, tok.pad_id)
    assert positions == [0, 1] and ended
    text, scores = assemble_text([(canvas[p], 0.5, False) for p in positions], tok, b" ret")
    assert text == "urn x"
    assert [s.text for s in scores] == ["urn", " x"]


def test_a_half_written_character_is_dropped_not_shown_as_a_replacement(tok):
    lead = next(i for i in range(tok.vocab_size) if tok.token_bytes(i) == b"\xc3")  # starts a 2-byte char
    ids = [*tok.encode('"H'), lead, *tok.encode("üße")]
    text, _ = assemble_text([(i, 0.5, False) for i in ids], tok)
    assert text == '"Hüße' and "\ufffd" not in text


def test_warm_start_seeds_the_open_hole(tok, table):
    req = FillRequest(prefix="y = ", suffix="\n", warm_start="compute(a, b)")
    plan = build_canvas(req, tok, table, 256)
    old = tok.encode("compute(a, b)")
    assert plan.heal_bytes == b""  # a rewrite starts at the old text's token boundary
    assert plan.warm_ids[: len(old) + 1] == old + [tok.eos_id]
    assert all(plan.warm_mask) and set(plan.warm_ids[len(old) + 1 :]) == {tok.pad_id}
    with pytest.raises(EngineError):
        build_canvas(FillRequest(prefix="", suffix="", middle=["a"], warm_start="b"), tok, table, 256)
